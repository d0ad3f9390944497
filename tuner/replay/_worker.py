"""The load generator: a Locust process that walks its share of the schedule open loop.

Run as `python -m tuner.replay SPEC.json --role local|master|worker` by `tuner.replay.replay`, never
imported by the rest of tuner: importing locust monkey-patches the whole process with gevent.

- local: one process, a LocalRunner and one user that walks the whole schedule;
- master + workers: the master waits for N workers, picks a common start time, gives each worker its
  index, and spawns one user per worker; worker k sends the rows i with i % N == k.

The user sleeps (gevent) until each row's due time and sends it from a greenlet of its own, whatever
earlier requests are doing: a request prepared as bytes before the start (`_http`, or a serialized
gRPC request). Each request's send and end times go straight into preallocated arrays, written as
numpy's own file (.npz) at the end (this process imports neither pandas nor pyarrow: ~1 s of CPU
at every start); Locust's `events.request` is fired for them in the walk's idle gaps (its latency
measured from the due time), so its statistics count every request without slowing the sends.
Progress goes to stdout as `START <t0>` (monotonic clock, system-wide on Linux) and `P <sent> <done>`.

Generative mode (a plan with `generate`): each row is one streaming generate request over HTTP (a
prompt of exactly its prompt tokens, exactly its output tokens), sent the same way from its own
greenlet; its Server-Sent Events are read as they arrive and the arrival of every response carrying
tokens is kept, so the records add first-token and last-token times, the tokens received and the gaps
between token responses (`GenerativeShare`). With a `cut` rule in the spec (`{"start_s", "end_s",
"tokens"}`, one process only), the walk counts at `end_s` the output tokens streamed since `start_s`,
as `tuner.measurement_tokens` counts them; below `tokens` the streams still open are cut there (their
records say `cut`) rather than waited for: the engine fell behind its window, which settles the verdict.
"""

from __future__ import annotations

# locust first: it monkey-patches the process before anything else opens sockets or threads.
import locust  # noqa: F401  isort: skip
from locust import User, task  # isort: skip

import argparse
import ctypes
import gc
import json
import logging
import math
import os
import resource
import sys
import time

import gevent
import gevent.event
import numpy as np
from greenlet import greenlet
from locust.env import Environment
from locust.exception import StopUser

from tuner.formats import first_line
from tuner.llm.prompts import compose
from tuner.replay import _http

LEAD_S = 0.5  # between picking the start time and the first due time: every process is waiting by then
# One process has nothing to wait for but its own user's start (a greenlet, milliseconds): a short lead.
# (Each replay spends its lead idle: 0.4 s more of every capacity step, warm-up and confirmation.)
LOCAL_LEAD_S = 0.1
PROGRESS_EVERY_S = 0.5
# Requests are prepared before the start up to this many bytes in all; past it they are made per send.
PREPARED_BYTES = 256 << 20
JOIN_BYTES = 64 << 10  # a prepared HTTP request up to this size is one bytes object: one write
PREOPEN = 16  # HTTP connections opened before the start (more are opened as requests need them)
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
# Locust's request events are fired in the walk's gaps longer than REPORT_GAP_S, stopping
# REPORT_MARGIN_S before the next due time; the clock is read every REPORT_CHUNK events.
REPORT_GAP_S = 0.001
REPORT_MARGIN_S = 0.0003
REPORT_CHUNK = 8
# gevent's own timers wake up to ~1 ms late: its event loop waits in whole milliseconds. The walk waits
# for each due time on a Linux timerfd instead, armed at the due time (absolute, CLOCK_MONOTONIC, the
# clock of time.monotonic): the loop's epoll wakes when the kernel fires it, to the microsecond, and
# handles answers while it waits, without spinning. Elsewhere, gevent's timer (later by up to ~1 ms).
CLOCK_MONOTONIC, TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 1, 0o4000, 0o2000000, 1
PR_SET_TIMERSLACK = 29
# Sends this close to their due time wait for it by reading the clock rather than through a wakeup
# (a send is never early: the replay must not compress the recorded gaps).
EARLY_S = 0.00002
CUT_ERROR = "cut at the window's end: the engine had fallen behind it"

log = logging.getLogger("tuner.replay")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class DueTimer:
    """`wait_until(t)`: returns at monotonic time t, the gevent loop running meanwhile (timerfd)."""

    def __init__(self) -> None:
        self.hub = gevent.get_hub()
        self.precise = False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)  # the kernel may otherwise add 50 us to each wakeup
            fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
            if fd < 0:
                raise OSError(ctypes.get_errno(), "timerfd_create")
        except (OSError, AttributeError) as exc:
            log.warning("no timerfd (%s): sends may leave up to ~1 ms late", exc)
            return
        self.precise = True
        self._settime = libc.timerfd_settime
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        self._fd = fd
        self._watcher = self.hub.loop.io(fd, 1)

    def wait_until(self, due: float) -> None:
        """Return at monotonic time `due`, the gevent loop running meanwhile."""
        if not self.precise:
            gevent.sleep(max(0.0, due - time.monotonic()))
            return
        value = self._spec.it_value
        value.tv_sec = sec = int(due)
        value.tv_nsec = int((due - sec) * 1e9)
        if self._settime(self._fd, TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")
        self.hub.wait(self._watcher)


class GcPauses:
    """Python's garbage-collector pauses during the walk (a pause delays every send due in it)."""

    def __init__(self) -> None:
        self.count, self.max_ms, self.total_ms, self._start = 0, 0.0, 0.0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        pause = (time.perf_counter() - self._start) * 1000.0
        self.count += 1
        self.total_ms += pause
        self.max_ms = max(self.max_ms, pause)

    def reset(self) -> None:
        """Forget the pauses counted so far."""
        self.count, self.max_ms, self.total_ms = 0, 0.0, 0.0


def cpu_seconds() -> float:
    """The CPU seconds, user and system, this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RequestFailed(Exception):
    """How a failed or dropped request reaches Locust's statistics (the text is the record's error)."""


class Client:
    """One protocol's client and every distinct request of the plan, prepared as bytes before the start."""

    def __init__(self, spec: dict):
        plan = spec["plan"]
        self.model = plan["model"]
        self.timeout_s = spec["request_timeout_s"]
        self.http = spec["protocol"] != "grpc"
        self.generative = "generate" in plan
        if self.generative:
            self._init_generate(spec, plan["generate"])
            return
        self.inputs = [(i["name"], i["datatype"]) for i in plan["inputs"]]
        self.outputs = list(plan["outputs"])
        self.shapes = plan["shapes"]
        # One flat buffer per input, as long as the longest request needs: every request sends a prefix.
        longest = [max((math.prod(shape[k]) for shape in self.shapes), default=0)
                   for k in range(len(self.inputs))]
        self.data = [memoryview(_http.tensor_data(datatype, n, seed=k))
                     for k, ((_, datatype), n) in enumerate(zip(self.inputs, longest, strict=True))]
        if self.http:
            self.host = spec["url"]
            self.connections = _http.Connections(spec["url"], timeout_s=self.timeout_s)
            self.connections.open(min(PREOPEN, spec["max_in_flight"]))
        else:
            self._init_grpc(spec["url"])
        self._prepare()

    def _prepare(self) -> None:
        """Every distinct request as bytes, made before the start, not at send time (up to
        PREPARED_BYTES; the rest are made per send)."""
        self.prepared: list = [None] * len(self.shapes)
        self.prepared_bytes = 0
        for shape_id in range(len(self.shapes)):
            self.prepared[shape_id] = self._keep(self._build(shape_id))

    def _init_generate(self, spec: dict, plan: dict) -> None:
        """Streaming generate requests over HTTP: one per distinct (prompt tokens, output tokens,
        first prompt piece), prepared like the tensor requests."""
        self.http = True
        self.pieces, self.special = plan["pieces"], plan["special"]
        self.shapes = plan["requests"]  # shape id -> [prompt tokens, output tokens, first piece]
        self.host = spec["url"]
        self.connections = _http.Connections(spec["url"], timeout_s=self.timeout_s)
        self.connections.open(min(PREOPEN, spec["max_in_flight"]))
        self._prepare()

    def generate(self, shape_id: int, on_event) -> str:
        """Send one streaming request; each event's data goes to `on_event` on arrival. "" when it
        was answered with a stream, else the error."""
        request = self.prepared[shape_id] or self._build(shape_id)
        status, body = self.connections.stream(request, on_event)
        return "" if status == 200 else _http.error_text(status, body)

    def _init_grpc(self, url: str) -> None:
        import grpc
        import grpc.experimental.gevent as grpc_gevent

        grpc_gevent.init_gevent()
        from tritonclient.grpc import service_pb2

        self.pb = service_pb2
        # Prepared bytes in, raw bytes out: no protobuf work per request.
        self.channel = grpc.insecure_channel(url, options=[
            ("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)])
        self.grpc_infer = self.channel.unary_unary(GRPC_INFER)
        self.grpc_error = grpc.RpcError

    def _parts(self, shape_id: int) -> tuple[list, list]:
        """(name, datatype, shape) of each input for this shape id, and each input's bytes."""
        inputs = [(name, datatype, shape)
                  for (name, datatype), shape in zip(self.inputs, self.shapes[shape_id], strict=True)]
        data = [buf[:math.prod(shape) * _http.ITEMSIZE[datatype]]
                for buf, (_, datatype, shape) in zip(self.data, inputs, strict=True)]
        return inputs, data

    def _build(self, shape_id: int):
        if self.generative:
            prompt, output, start = self.shapes[shape_id]
            text = compose(self.pieces, prompt - self.special, start)
            return _http.generate_request(self.host, self.model, text, tokens=output)
        inputs, data = self._parts(shape_id)
        if self.http:
            parts = _http.infer_request(self.host, self.model, inputs, outputs=self.outputs, data=data)
            # Small requests go out in one write; large ones as the head and views of the buffers.
            return b"".join(parts) if sum(len(p) for p in parts) <= JOIN_BYTES else parts
        request = self.pb.ModelInferRequest(model_name=self.model)
        for name, datatype, shape in inputs:
            tensor = request.inputs.add()
            tensor.name, tensor.datatype = name, datatype
            tensor.shape.extend(shape)
        request.raw_input_contents.extend(bytes(d) for d in data)
        for name in self.outputs:
            request.outputs.add().name = name
        return request.SerializeToString()

    def _keep(self, request):
        """The request itself while the prepared ones fit PREPARED_BYTES, else None (built per send)."""
        size = len(request) if isinstance(request, bytes) else len(request[0])
        if self.prepared_bytes + size > PREPARED_BYTES:
            return None
        self.prepared_bytes += size
        return request

    def infer(self, shape_id: int) -> str:
        """Send one request of this shape and wait for the answer: "" when it succeeded, else the error."""
        request = self.prepared[shape_id] or self._build(shape_id)
        if self.http:
            status, body = self.connections.post((request,) if isinstance(request, bytes) else request)
            return "" if status == 200 else _http.error_text(status, body)
        try:
            self.grpc_infer(request, timeout=self.timeout_s)
        except self.grpc_error as exc:
            return exc.details() or str(exc.code())
        return ""


class Share:
    """This process's rows of the schedule and their records."""

    def __init__(self, schedule: dict[str, np.ndarray], index: int, count: int):
        self.rows = schedule["row"][index::count]
        self.due = schedule["due_s"][index::count].astype(float)
        self.shape_id = schedule["shape_id"][index::count].tolist()  # Python ints: no numpy scalar per send
        n = len(self.rows)
        self.send = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.ok = np.zeros(n, dtype=bool)
        self.errors: dict[int, str] = {}
        self.finished: list[int] = []  # in the order the requests ended, for Locust's statistics
        self.sent = 0
        self.done = 0
        self.index = index

    def columns(self, t0: float) -> dict[str, np.ndarray]:
        """The share's records, one row per request, times from `t0` (unsent or unanswered: an error)."""
        error = np.full(len(self.rows), "", dtype=object)
        # Requests still open when the walk was given up on (request timeout + 5 s).
        error[np.isnan(self.end) & ~np.isnan(self.send)] = "no response before the replay ended"
        error[np.isnan(self.send)] = "never sent"
        for k, text in self.errors.items():
            error[k] = text
        return {
            "row": self.rows,
            "due_s": self.due,
            "send_s": self.send - t0,
            "end_s": self.end - t0,
            "latency_ms": (self.end - t0 - self.due) * 1000.0,
            "send_lag_ms": (self.send - t0 - self.due) * 1000.0,
            "ok": self.ok,
            "error": error.astype(str),
            "worker": np.full(len(self.rows), self.index, dtype=np.int16),
        }


class GenerativeShare(Share):
    """A share of streaming requests: besides each request's send and end, the arrival of each
    response that carried tokens and how many it carried."""

    def __init__(self, schedule: dict[str, np.ndarray], index: int, count: int, *, requests: list):
        super().__init__(schedule, index, count)
        n = len(self.rows)
        self.asked = np.array([requests[i][1] for i in self.shape_id], dtype=np.int64)
        self.prompt = np.array([requests[i][0] for i in self.shape_id], dtype=np.int64)
        self.token_times: list[list[float] | None] = [None] * n
        self.token_counts: list[list[int] | None] = [None] * n
        self.cut = np.zeros(n, dtype=bool)

    def streamed(self, start: float, end: float) -> float:
        """The output tokens streamed between monotonic times `start` and `end` by every request so far,
        open ones included, as `tuner.measurement_tokens` counts them (a request's tokens spread evenly
        over its responses). A copy of `tuner.measurement_tokens._streamed_per_s`'s count on live lists:
        that module needs pandas, which this process never imports (~1 s of CPU each replay)."""
        total = 0.0
        for times, counts in zip(self.token_times, self.token_counts, strict=True):
            if times:
                inside = sum(1 for t in times if start <= t < end)
                total += sum(counts) / len(times) * inside
        return total

    def columns(self, t0: float) -> dict[str, np.ndarray]:
        """Share.columns, then prompt_tokens, output_tokens (asked), tokens (received), first_token_s,
        last_token_s (seconds from t0), itl_ms (the gaps between token responses, every request's
        in one array, `itl_count` of them per request: `_processes` splits them again) and cut (the
        stream was open when the walk cut it: see the module doc)."""
        out = super().columns(t0)
        first = np.full(len(self.rows), np.nan)
        last = np.full(len(self.rows), np.nan)
        tokens = np.zeros(len(self.rows), dtype=np.int64)
        itl = []
        for k, times in enumerate(self.token_times):
            if times:
                first[k], last[k] = times[0] - t0, times[-1] - t0
                tokens[k] = sum(self.token_counts[k])
            itl.append((np.diff(times) * 1000.0) if times else np.empty(0))
        out["prompt_tokens"] = self.prompt
        out["output_tokens"] = self.asked
        out["tokens"] = tokens
        out["first_token_s"] = first
        out["last_token_s"] = last
        out["itl_ms"] = np.concatenate(itl) if itl else np.empty(0)
        out["itl_count"] = np.array([len(x) for x in itl], dtype=np.int64)
        out["cut"] = self.cut
        return out


class Replayer:
    """Walks a share of the schedule from t0; `run` returns once every request has finished.

    Each request is recorded straight into preallocated arrays by its sender; Locust's `request`
    event is fired for it later, in the walk's idle gaps and at the end (`_report`), so Locust's
    statistics count every request without the event costing anything at send time.
    """

    def __init__(self, spec: dict, environment: Environment):
        self.spec = spec
        self.env = environment
        self.client = Client(spec)
        with np.load(spec["schedule"]) as schedule:  # numpy's own files: pandas and pyarrow take ~1 s to import
            self.schedule = {name: schedule[name] for name in schedule.files}
        self.share: Share | None = None
        self.t0 = 0.0
        self.started = gevent.event.Event()
        self.finished = gevent.event.Event()
        self.drained = gevent.event.Event()
        self.in_flight = 0
        self.walking = False
        self.reported = 0
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.walked = False
        self.error = ""
        self.gc = GcPauses()
        self.slack_ms = 0.0
        self.cut_at: float | None = None  # when the cut rule ended the open streams (monotonic)
        # A full collection walks every object of locust, pandas, grpc...: one took 78 ms mid-replay,
        # and one right at the start could eat the lead time. So it runs now, before this process
        # reports ready; frozen objects are skipped, so collections during the walk only see what the
        # walk makes.
        gc.collect()
        gc.freeze()

    def assign(self, index: int, count: int, t0: float) -> None:
        """Take rows `index`, `index + count`, ... of the schedule and start the walk at `t0`."""
        if self.client.generative:
            self.share = GenerativeShare(self.schedule, index, count, requests=self.client.shapes)
        else:
            self.share = Share(self.schedule, index, count)
        self.t0 = t0
        self.started.set()

    def _send(self, k: int, shape_id: int) -> None:
        share = self.share
        share.send[k] = time.monotonic()
        share.sent += 1
        try:
            error = self.client.infer(shape_id)
        except BaseException as exc:  # the server's failures are data, not the load generator's
            error = first_line(exc)
        share.end[k] = time.monotonic()
        self._finish(k, error)

    def _send_stream(self, k: int, shape_id: int) -> None:
        """_send of a streaming request: the arrival of each response carrying tokens is kept; a
        stream that ends in an error event, or with other than the tokens asked (when the server
        counts them), is an error."""
        share = self.share
        share.send[k] = time.monotonic()
        share.sent += 1
        times: list[float] = []
        counts: list[int] = []
        share.token_times[k], share.token_counts[k] = times, counts  # live: the cut rule reads open streams
        problems: list[str] = []
        counted = False

        def on_event(data: bytes) -> None:
            nonlocal counted
            now = time.monotonic()
            try:
                event = json.loads(data)
            except ValueError:
                problems.append(f"not a JSON event: {bytes(data[:80])!r}")
                return
            if not isinstance(event, dict):
                problems.append(f"not a JSON object event: {bytes(data[:80])!r}")
                return
            if "error" in event:
                problems.append(str(event["error"]) or "an error event")
                return
            n = event.get("num_output_tokens")
            if n is None:  # a server that does not count: one token per response with text
                n = 1 if event.get("text_output") else 0
            else:
                counted = True
                n = int(n[0] if isinstance(n, list) else n)
            if n:
                times.append(now)
                counts.append(n)

        try:
            error = self.client.generate(shape_id, on_event)
        except BaseException as exc:  # the server's failures are data, not the load generator's
            error = first_line(exc)
        share.end[k] = time.monotonic()
        if self.cut_at is not None and error and not problems:  # ended by the cut, not by the server
            share.cut[k] = True
            error = CUT_ERROR
        error = error or (problems[0] if problems else "")
        if not error and counted and sum(counts) != share.asked[k]:
            error = f"{sum(counts)} of {share.asked[k]} output tokens streamed"
        if not error and not times:
            error = "no tokens streamed"
        self._finish(k, error)

    def _finish(self, k: int, error: str) -> None:
        """Row `k` answered: its outcome recorded (an error, or ok), and the walk told when it was the last."""
        share = self.share
        if error:
            share.errors[k] = error[:300]
        else:
            share.ok[k] = True
        share.done += 1
        share.finished.append(k)
        self.in_flight -= 1
        if not self.in_flight and not self.walking:
            self.drained.set()

    def _drop(self, k: int) -> None:
        share = self.share
        share.errors[k] = (f"not sent: {self.spec['max_in_flight']} requests already in flight "
                           f"(replay.max_in_flight)")
        share.done += 1
        share.finished.append(k)

    def _cut_if_behind(self, rule: dict) -> None:
        """At `end_s` from the start: cut the open streams when fewer than `tokens` output tokens were
        streamed since `start_s` (the module doc)."""
        end = self.t0 + rule["end_s"]
        gevent.sleep(max(0.0, end - time.monotonic()))
        if self.share.done >= len(self.share.rows):
            return
        if self.share.streamed(self.t0 + rule["start_s"], end) < rule["tokens"]:
            self.cut_at = time.monotonic()
            self.client.connections.cut()

    def _report(self, until: float = math.inf) -> None:
        """Fire Locust's request event for requests that ended, until the clock reaches `until`."""
        share, fire, now = self.share, self.env.events.request.fire, time.monotonic
        finished, name, t0 = share.finished, self.client.model, self.t0
        while self.reported < len(finished):
            k = finished[self.reported]
            self.reported += 1
            failed = not share.ok[k]
            fire(request_type="infer", name=name,
                 response_time=0.0 if np.isnan(share.end[k]) else (share.end[k] - t0 - share.due[k]) * 1000.0,
                 response_length=0, exception=RequestFailed(share.errors[k]) if failed else None, context={})
            if not self.reported % REPORT_CHUNK and now() >= until:
                return

    def fail(self, exc: BaseException) -> None:
        """Record the walk's failure and let the process finish."""
        log.error("the replay failed: %s", exc, exc_info=exc)
        self.error = f"{type(exc).__name__}: {exc}"
        self.finished.set()

    def run(self) -> None:
        """Walk the share from t0, wait for the requests in flight and write the records (once)."""
        if self.walked:
            return
        self.walked = True
        self.started.wait()
        self.slack_ms = (self.t0 - time.monotonic()) * 1000.0  # negative: this walk started late
        self.gc.reset()
        share = self.share
        limit = self.spec["max_in_flight"]
        progress = gevent.spawn(self._progress)
        rule = self.spec.get("cut") if self.client.generative else None
        cutter = gevent.spawn(self._cut_if_behind, rule) if rule else None
        cpu0 = cpu_seconds()
        t0 = self.t0
        now = time.monotonic
        hub = gevent.get_hub()
        walker = gevent.getcurrent()
        run_callback = hub.loop.run_callback
        shape_ids = share.shape_id
        send = self._send_stream if self.client.generative else self._send
        timer = DueTimer()
        self.walking = True
        for k, offset in enumerate(share.due.tolist()):
            due = t0 + offset
            if due - now() > EARLY_S:
                if self.reported < len(share.finished) and due - now() > REPORT_GAP_S:
                    self._report(until=due - REPORT_MARGIN_S)
                timer.wait_until(due)
            while now() - t0 < offset:  # as the records count it; at most EARLY_S (or gevent's timer's error)
                pass
            # Open loop: send and move on. With max_in_flight requests already open the request is
            # dropped and counted as an error (as k6 drops iterations): waiting for a free slot would
            # turn an overloaded server into send lag, and the trial into an invalid one.
            if self.in_flight >= limit:
                self._drop(k)
            else:
                # Run the sender now, up to its first wait on the network (the request is written
                # by then); the hub resumes this walk from the callback queued first. A plain
                # greenlet under the hub: nothing links to it, nothing waits for it.
                self.in_flight += 1
                run_callback(walker.switch)
                greenlet(send, hub).switch(k, shape_ids[k])
        self.walking = False
        if self.in_flight:
            self.drained.clear()
            # a stream may rightly last longer than one request's timeout (each read waits at most
            # that long): streams are waited for until they end
            self.drained.wait(timeout=None if self.client.generative else self.spec["request_timeout_s"] + 5.0)
        self._report()  # what the gaps left: its cost is counted with the rest
        self.cpu_s = cpu_seconds() - cpu0
        self.wall_s = now() - t0
        progress.kill()
        if cutter is not None:
            cutter.kill()
        self._print_progress()
        np.savez(self.spec["records"].format(index=share.index), **self.share.columns(t0))
        self.finished.set()

    def _print_progress(self) -> None:
        try:
            print(f"P {self.share.sent} {self.share.done}", flush=True)
        except OSError:  # the parent is gone (broken pipe): nobody will read the records
            os._exit(3)

    def _progress(self) -> None:
        while True:
            self._print_progress()
            gevent.sleep(PROGRESS_EVERY_S)

    def summary(self) -> dict:
        """What the walk cost and met: CPU and wall time, GC pauses, slack, connections, events."""
        return {"index": self.share.index, "cpu_s": self.cpu_s, "wall_s": self.wall_s,
                "requests": len(self.share.rows), "gc_pauses": self.gc.count,
                "gc_max_ms": self.gc.max_ms, "gc_total_ms": self.gc.total_ms, "slack_ms": self.slack_ms,
                "connections": self.client.connections.opened if self.client.http else 0,
                "locust_events": self.reported}


class ScheduleUser(User):
    """The one user per process: walks the process's share of the schedule, then stops."""

    replayer: Replayer | None = None

    @task
    def walk(self) -> None:
        """Walk this process's share of the schedule once, then stop the user."""
        # Locust runs a task again after an exception: a failed walk must stop, not restart.
        try:
            self.replayer.run()
        except Exception as exc:
            self.replayer.fail(exc)
        raise StopUser()


def main(argv: list[str] | None = None) -> int:
    """Run the load generator in `argv`'s role on its spec; the process's exit code."""
    parser = argparse.ArgumentParser(prog="python -m tuner.replay")
    parser.add_argument("spec")
    parser.add_argument("--role", choices=("local", "master", "worker"), default="local")
    args = parser.parse_args(argv)
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.spec) as f:
        spec = json.load(f)
    if args.role == "master":
        return _master(spec)
    env = Environment(user_classes=[ScheduleUser])
    replayer = Replayer(spec, env)
    ScheduleUser.replayer = replayer
    if args.role == "local":
        return _local(spec, env, replayer)
    return _worker(spec, env, replayer)


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process when the process that started it dies (a killed
    tuner must not leave load generators running)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the prctl
            os._exit(3)
    except (OSError, AttributeError):
        pass


def _write_summary(spec: dict, name: str, data: dict) -> None:
    with open(spec["summary"].format(name=name), "w") as f:
        json.dump(data, f)


def _local(spec: dict, env: Environment, replayer: Replayer) -> int:
    runner = env.create_local_runner()
    t0 = time.monotonic() + LOCAL_LEAD_S
    print(f"START {t0!r}", flush=True)
    replayer.assign(0, 1, t0)
    runner.start(1, spawn_rate=1)
    replayer.finished.wait()
    runner.quit()
    if replayer.error:
        return 1
    _write_summary(spec, "0", replayer.summary())
    _write_summary(spec, "locust", _locust_totals(env))
    return 0


def _worker(spec: dict, env: Environment, replayer: Replayer) -> int:
    runner = env.create_worker_runner("127.0.0.1", spec["master_port"])
    runner.register_message("tuner_start", lambda msg, **_kw: replayer.assign(
        msg.data["index"], msg.data["count"], msg.data["t0"]))
    # Locust's worker already handles messages while it connects, before a handler can be registered:
    # the master waits for this word, not for Locust's "ready", before it sends "tuner_start".
    runner.send_message("tuner_ready", None)
    replayer.finished.wait()
    summary = replayer.summary() if not replayer.error else {"error": replayer.error}
    if not replayer.error:
        _write_summary(spec, str(summary["index"]), summary)
    # Every request's statistics reach the master before "tuner_done" does (one ordered connection);
    # the report Locust sends when told to quit may come after the master stopped listening.
    report: dict = {}
    env.events.report_to_master.fire(client_id=runner.client_id, data=report)
    runner.send_message("stats", report)
    runner.send_message("tuner_done", summary)
    runner.greenlet.join(timeout=30)  # the master's quit ends it
    return 1 if replayer.error else 0


def _master(spec: dict) -> int:
    env = Environment(user_classes=[ScheduleUser])
    count = spec["workers"]
    runner = env.create_master_runner("127.0.0.1", spec["master_port"])
    done: list[dict] = []
    all_done = gevent.event.Event()

    def on_done(msg, **_kw) -> None:
        done.append(msg.data)
        if len(done) == count:
            all_done.set()

    ready: set[str] = set()  # the workers that can take "tuner_start" (see _worker)
    runner.register_message("tuner_done", on_done)
    runner.register_message("tuner_ready", lambda msg, **_kw: ready.add(msg.node_id))
    deadline = time.monotonic() + spec.get("connect_timeout_s", 60.0)
    while len(ready) < count or len(runner.clients.ready) < count:
        if time.monotonic() > deadline:
            print(f"only {len(ready)} of {count} Locust workers connected", file=sys.stderr)
            runner.quit()
            return 1
        gevent.sleep(0.05)
    # Every worker has its clients and tensors ready: one start time for all of them.
    t0 = time.monotonic() + LEAD_S
    print(f"START {t0!r}", flush=True)
    for index, client_id in enumerate(sorted(ready)):
        runner.send_message("tuner_start", {"index": index, "count": count, "t0": t0}, client_id)
    runner.start(count, spawn_rate=count)
    all_done.wait()
    runner.quit()
    failed = [d["error"] for d in done if "error" in d]
    if failed:
        print(f"a Locust worker failed: {failed[0]}", file=sys.stderr)
        return 1
    _write_summary(spec, "locust", _locust_totals(env))
    return 0


def _locust_totals(env: Environment) -> dict:
    """What Locust's own statistics counted (the master's: every worker's final report included)."""
    total = env.stats.total
    return {"requests": total.num_requests, "failures": total.num_failures}


if __name__ == "__main__":
    sys.exit(main())
