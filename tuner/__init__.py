"""tuner: find the Triton dynamic-batching configuration that serves recorded traffic at the lowest cost."""

__version__ = "0.1.0"
