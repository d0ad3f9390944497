"""Generative models served by Triton's vLLM backend: the tiny model, engine arguments, prompts."""
