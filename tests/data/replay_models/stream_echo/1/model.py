"""Test model for the generative replay: the vLLM backend's wire interface without an engine.

Each request streams exactly `max_tokens` word tokens (`sampling_parameters`), the first
`first_token_ms + prompt_token_ms x its prompt tokens` after its arrival and then one every `token_ms`
(config parameters), and at most `tokens_per_s` tokens a second in all when that is above 0 (an engine's
throughput: each token takes the next free slot, so a load above it queues), so a replay's
TTFT and TPOT can be checked against known values; every request runs on its own (an asyncio task),
whatever the others do. A request whose prompt has `fail_prompt_tokens` tokens (a config parameter),
or `"fail_after": k` in its sampling parameters, ends its stream with an error after half its tokens
(k tokens): a server failing mid-stream. A stream whose client went away (Triton's cancellation) stops
before its next token, as an engine aborts it. The prompt's tokens are its space-separated words.
"""

import asyncio
import json
import os
import sys
import threading

# The Python-backend stub embeds the system Python; numpy comes from the path the launcher gives.
sys.path[:0] = [p for p in os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep) if p]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _flag(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else bool(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.first_s = float(params["first_token_ms"]["string_value"]) / 1000.0
        self.prompt_token_s = float(params["prompt_token_ms"]["string_value"]) / 1000.0
        self.fail_prompt = int(params["fail_prompt_tokens"]["string_value"])
        self.token_s = float(params["token_ms"]["string_value"]) / 1000.0
        rate = float(params.get("tokens_per_s", {}).get("string_value", "0"))
        self.slot_s = 1.0 / rate if rate > 0 else 0.0
        self.next_slot = 0.0  # the engine's next free token slot (the loop's clock): one thread takes them
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def execute(self, requests):
        for request in requests:
            asyncio.run_coroutine_threadsafe(self._generate(request), self.loop)
        return None

    async def _generate(self, request):
        sender = request.get_response_sender()
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            prompt = prompt.decode() if isinstance(prompt, bytes) else str(prompt)
            tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
            raw = tensor.as_numpy().reshape(-1)[0] if tensor is not None else b"{}"
            params = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
            count = int(params.get("max_tokens", 16))
            fail_after = params.get("fail_after")
            stream = _flag(request, "stream", False)
            want_in = _flag(request, "return_num_input_tokens", False)
            want_out = _flag(request, "return_num_output_tokens", False)
            exclude = _flag(request, "exclude_input_in_output", False)
        except Exception as exc:  # a malformed request: its error, not a dead model
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"bad request: {exc}")),
                        flags=FINAL)
            return
        prompt_tokens = len(prompt.split())
        if fail_after is None and prompt_tokens == self.fail_prompt:
            fail_after = count // 2
        loop = self.loop
        due = loop.time() + self.first_s + self.prompt_token_s * prompt_tokens
        words = []
        for k in range(count):
            if k and sender.is_cancelled():  # the client went away: an engine aborts it (as the vLLM backend does)
                try:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "the request was cancelled", pb_utils.TritonError.CANCELLED)), flags=FINAL)
                except Exception:  # nobody to tell
                    pass
                return
            # a fixed schedule from the arrival: the sleeps do not add up the loop's own delays
            at = due + k * self.token_s
            if self.slot_s:  # a limited engine: the token waits for its slot
                at = max(at, self.next_slot)
                self.next_slot = at + self.slot_s
            await asyncio.sleep(max(0.0, at - loop.time()))
            if fail_after is not None and k >= int(fail_after):
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"failed on purpose after {k} tokens")), flags=FINAL)
                return
            word = f" w{k % 4000}"
            if stream:  # the last token's response is the final one, as the vLLM backend sends it
                sender.send(self._response(word, 1, prompt_tokens if k == 0 else 0,
                                           want_in=want_in, want_out=want_out),
                            flags=FINAL if k == count - 1 else 0)
            else:
                words.append(word)
        if stream and count < 1:
            sender.send(flags=FINAL)
        elif not stream:
            text = ("" if exclude else prompt) + "".join(words)
            sender.send(self._response(text, count, prompt_tokens, want_in=want_in, want_out=want_out),
                        flags=FINAL)

    @staticmethod
    def _response(text, out_tokens, in_tokens, *, want_in, want_out):
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))]
        if want_in:
            tensors.append(pb_utils.Tensor("num_input_tokens", np.array([in_tokens], dtype=np.uint32)))
        if want_out:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([out_tokens], dtype=np.uint32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
