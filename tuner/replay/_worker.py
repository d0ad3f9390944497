"""The load generator: a Locust process that walks its share of the schedule open loop.

Run as `python -m tuner.replay SPEC.json --role local|master|worker` by `tuner.replay.replay`, never
imported by the rest of tuner: importing locust monkey-patches the whole process with gevent.

- local: one process, a LocalRunner and one user that walks the whole schedule;
- master + workers: the master waits for N workers, picks a common start time, gives each worker its
  index, and spawns one user per worker; worker k sends the rows i with i % N == k.

The user sleeps (gevent) until each row's due time and sends it from a greenlet pool, whatever earlier
requests are doing. Every finished request fires Locust's `events.request` with its latency measured
from the due time; a listener keeps the per-request record, which is written to Parquet at the end.
Progress goes to stdout as `START <t0>` (monotonic clock, system-wide on Linux) and `P <sent> <done>`.
"""

from __future__ import annotations

# locust first: it monkey-patches the process before anything else opens sockets or threads.
import locust  # noqa: F401  isort: skip
from locust import User, task  # isort: skip

import argparse
import gc
import json
import logging
import os
import resource
import sys
import time

import gevent
import gevent.event
import gevent.pool
import numpy as np
import pandas as pd
from gevent import monkey
from locust.env import Environment
from locust.exception import StopUser

LEAD_S = 0.5  # between picking the start time and the first due time: every process is waiting by then
PROGRESS_EVERY_S = 0.5
# Prebuilt request tensors are kept up to this many bytes; past it they are made per request.
TENSOR_CACHE_BYTES = 256 << 20
# gevent's timers wake up to ~1 ms late (epoll waits in whole milliseconds). So the walk sleeps on a
# timer until SPIN_S before a due time, then alternates handling ready answers (gevent.sleep(0)) with
# blocking naps of at most NAP_S, and sends by switching straight into the new request's greenlet
# (a spawned one would wait behind every answer ready at that moment). Measured at 500 req/s on the
# shared 2-core machine against the echo test model: send lag p50 0.10 ms,
# p90 0.2-0.7 ms, against 0.65 / 1.2-1.4 ms with timers alone, at half the CPU of a pure spin.
SPIN_S = 0.0012
NAP_S = 0.0001
# In the last FINAL_S before a due time only naps: answers wait (< FINAL_S) rather than the send.
FINAL_S = 0.0003

_NUMPY = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
          "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_}

log = logging.getLogger("tuner.replay")
_nap = monkey.get_original("time", "sleep")  # blocks the whole process: only for sub-ms naps


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
        self.count, self.max_ms, self.total_ms = 0, 0.0, 0.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Dropped(Exception):
    """A request the replay did not send because max_in_flight requests were open."""


class Client:
    """One protocol's client, the requested outputs, and the request tensors made once per shape."""

    def __init__(self, spec: dict):
        self.model = spec["plan"]["model"]
        self.timeout_s = spec["request_timeout_s"]
        if spec["protocol"] == "grpc":
            import grpc.experimental.gevent as grpc_gevent

            grpc_gevent.init_gevent()
            import tritonclient.grpc as tc

            self.client = tc.InferenceServerClient(spec["url"])
            self.outputs = [tc.InferRequestedOutput(name) for name in spec["plan"]["outputs"]]
            self._infer = lambda inputs: self.client.infer(
                self.model, inputs, outputs=self.outputs, client_timeout=self.timeout_s)
        else:
            import tritonclient.http as tc

            # One connection per request in flight (HTTP/1.1 has no multiplexing).
            self.client = tc.InferenceServerClient(
                spec["url"], concurrency=spec["max_in_flight"], connection_timeout=self.timeout_s,
                network_timeout=self.timeout_s)
            self.outputs = [tc.InferRequestedOutput(name, binary_data=True)
                            for name in spec["plan"]["outputs"]]
            self._infer = lambda inputs: self.client.infer(self.model, inputs, outputs=self.outputs)
        self.tc = tc
        self.http = spec["protocol"] != "grpc"
        self.inputs = spec["plan"]["inputs"]
        self.shapes = spec["plan"]["shapes"]
        self.largest = [self._largest(k) for k in range(len(self.inputs))]
        self.cache: dict[int, list] = {}
        self.cached_bytes = 0
        for shape_id in range(len(self.shapes)):  # made before the start, not at send time
            self.inputs_for(shape_id)

    def _largest(self, k: int) -> np.ndarray:
        """The biggest tensor any request needs for input k; requests take slices of it."""
        dims = np.max([s[k] for s in self.shapes], axis=0).tolist() if self.shapes else []
        datatype = self.inputs[k]["datatype"]
        size = int(np.prod(dims)) if dims else 1
        if datatype == "BYTES":
            return np.full(size, b"0", dtype=np.object_).reshape(dims)
        if datatype.startswith("FP"):
            return np.random.default_rng(k).random(size).astype(_NUMPY[datatype]).reshape(dims)
        if datatype == "BOOL":
            return np.zeros(dims, dtype=np.bool_)
        # Integers look like token ids: small, non-negative, varied along the last dim.
        last = dims[-1] if dims else 1
        row = (np.arange(last) % 100 + 1).astype(_NUMPY[datatype])
        return np.broadcast_to(row, dims).copy() if dims else row[:1].reshape(())

    def inputs_for(self, shape_id: int) -> list:
        cached = self.cache.get(shape_id)
        if cached is not None:
            return cached
        built, nbytes = [], 0
        for k, spec in enumerate(self.inputs):
            shape = self.shapes[shape_id][k]
            data = np.ascontiguousarray(self.largest[k][tuple(slice(0, d) for d in shape)])
            tensor = self.tc.InferInput(spec["name"], shape, spec["datatype"])
            if self.http:
                tensor.set_data_from_numpy(data, binary_data=True)
            else:
                tensor.set_data_from_numpy(data)
            built.append(tensor)
            nbytes += data.nbytes
        if self.cached_bytes + nbytes <= TENSOR_CACHE_BYTES:
            self.cache[shape_id] = built
            self.cached_bytes += nbytes
        return built

    def infer(self, shape_id: int) -> None:
        self._infer(self.inputs_for(shape_id))


class Share:
    """This process's rows of the schedule and their records."""

    def __init__(self, schedule: pd.DataFrame, index: int, count: int):
        mine = schedule.iloc[index::count]
        self.rows = mine["row"].to_numpy()
        self.due = mine["due_s"].to_numpy(dtype=float)
        self.shape_id = mine["shape_id"].to_numpy()
        n = len(self.rows)
        self.send = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.ok = np.zeros(n, dtype=bool)
        self.errors: dict[int, str] = {}
        self.sent = 0
        self.done = 0
        self.index = index

    def frame(self, t0: float) -> pd.DataFrame:
        error = np.full(len(self.rows), "", dtype=object)
        # Requests still open when the pool was given up on (request timeout + 5 s).
        error[np.isnan(self.end) & ~np.isnan(self.send)] = "no response before the replay ended"
        error[np.isnan(self.send)] = "never sent"
        for k, text in self.errors.items():
            error[k] = text
        return pd.DataFrame({
            "row": self.rows,
            "due_s": self.due,
            "send_s": self.send - t0,
            "end_s": self.end - t0,
            "latency_ms": (self.end - t0 - self.due) * 1000.0,
            "send_lag_ms": (self.send - t0 - self.due) * 1000.0,
            "ok": self.ok,
            "error": error.astype(str),
            "worker": np.full(len(self.rows), self.index, dtype=np.int16),
        })


class Replayer:
    """Walks a share of the schedule from t0; `run` returns once every request has finished."""

    def __init__(self, spec: dict, environment: Environment):
        self.spec = spec
        self.env = environment
        self.client = Client(spec)
        self.schedule = pd.read_parquet(spec["schedule"])
        self.share: Share | None = None
        self.t0 = 0.0
        self.started = gevent.event.Event()
        self.finished = gevent.event.Event()
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.walked = False
        self.error = ""
        self.gc = GcPauses()
        environment.events.request.add_listener(self._record)

    def assign(self, index: int, count: int, t0: float) -> None:
        self.share = Share(self.schedule, index, count)
        self.t0 = t0
        self.started.set()

    def _record(self, context: dict, exception: BaseException | None, **_kw) -> None:
        k = context.get("k")
        if k is None or self.share is None:
            return
        share = self.share
        share.send[k] = context["send"]
        share.end[k] = context["end"]
        share.ok[k] = exception is None
        if exception is not None:
            share.errors[k] = (str(exception) or type(exception).__name__).splitlines()[0][:300]
        share.done += 1

    def _send(self, k: int, due: float) -> None:
        share = self.share
        send = time.monotonic()
        share.sent += 1
        exception = None
        try:
            self.client.infer(int(share.shape_id[k]))
        except Exception as exc:  # the server's failures are data, not the load generator's
            exception = exc
        end = time.monotonic()
        self.env.events.request.fire(
            request_type="infer", name=self.client.model, response_time=(end - due) * 1000.0,
            response_length=0, exception=exception, context={"k": k, "send": send, "end": end})

    def _drop(self, k: int) -> None:
        self.env.events.request.fire(
            request_type="infer", name=self.client.model, response_time=0.0, response_length=0,
            exception=Dropped(f"not sent: {self.spec['max_in_flight']} requests already in flight "
                              f"(replay.max_in_flight)"),
            context={"k": k, "send": np.nan, "end": np.nan})

    def fail(self, exc: BaseException) -> None:
        log.error("the replay failed: %s", exc, exc_info=exc)
        self.error = f"{type(exc).__name__}: {exc}"
        self.finished.set()

    def run(self) -> None:
        if self.walked:
            return
        self.walked = True
        self.started.wait()
        # A full collection walks every object of locust, pandas, grpc...: one took 78 ms mid-replay.
        # Frozen objects are skipped, so collections during the walk only see what the walk makes.
        gc.collect()
        gc.freeze()
        self.gc.reset()
        share = self.share
        pool = gevent.pool.Pool(self.spec["max_in_flight"])
        progress = gevent.spawn(self._progress)
        cpu0 = cpu_seconds()
        t0 = self.t0
        now = time.monotonic
        hub = gevent.get_hub()
        walker = gevent.getcurrent()
        for k, offset in enumerate(share.due):
            due = t0 + offset
            wait = due - now()
            if wait > SPIN_S:
                gevent.sleep(wait - SPIN_S)
            while (wait := due - now()) > 0:
                if wait > FINAL_S:
                    gevent.sleep(0)  # let answers that arrived meanwhile be handled
                if wait > 0.00005:
                    _nap(min(wait, NAP_S))
            # Open loop: spawn and move on. With max_in_flight requests already open the request is
            # dropped and counted as an error (as k6 drops iterations): waiting for a free slot would
            # turn an overloaded server into send lag, and the trial into an invalid one.
            if pool.full():
                self._drop(k)
            else:
                # Run the sender now, up to its first wait on the network (the request is written
                # by then); the hub resumes this walk from the callback queued first.
                sender = gevent.Greenlet(self._send, k, due)
                pool.add(sender)
                hub.loop.run_callback(walker.switch)
                sender.switch()
        pool.join(timeout=self.spec["request_timeout_s"] + 5.0)
        pool.kill(block=False)
        self.cpu_s = cpu_seconds() - cpu0
        self.wall_s = now() - t0
        progress.kill()
        self._print_progress()
        self.share.frame(t0).to_parquet(self.spec["records"].format(index=share.index), index=False)
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
        return {"index": self.share.index, "cpu_s": self.cpu_s, "wall_s": self.wall_s,
                "requests": len(self.share.rows), "gc_pauses": self.gc.count,
                "gc_max_ms": self.gc.max_ms, "gc_total_ms": self.gc.total_ms}


class ScheduleUser(User):
    """The one user per process: walks the process's share of the schedule, then stops."""

    replayer: Replayer | None = None

    @task
    def walk(self) -> None:
        # Locust runs a task again after an exception: a failed walk must stop, not restart.
        try:
            self.replayer.run()
        except Exception as exc:
            self.replayer.fail(exc)
        raise StopUser()


def main(argv: list[str] | None = None) -> int:
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
    t0 = time.monotonic() + LEAD_S
    print(f"START {t0!r}", flush=True)
    replayer.assign(0, 1, t0)
    runner.start(1, spawn_rate=1)
    replayer.finished.wait()
    runner.quit()
    if replayer.error:
        return 1
    _write_summary(spec, "0", replayer.summary())
    return 0


def _worker(spec: dict, env: Environment, replayer: Replayer) -> int:
    runner = env.create_worker_runner("127.0.0.1", spec["master_port"])
    runner.register_message("tuner_start", lambda msg, **_kw: replayer.assign(
        msg.data["index"], msg.data["count"], msg.data["t0"]))
    replayer.finished.wait()
    summary = replayer.summary() if not replayer.error else {"error": replayer.error}
    if not replayer.error:
        _write_summary(spec, str(summary["index"]), summary)
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

    runner.register_message("tuner_done", on_done)
    deadline = time.monotonic() + spec.get("connect_timeout_s", 60.0)
    while len(runner.clients.ready) < count:
        if time.monotonic() > deadline:
            print(f"only {len(runner.clients.ready)} of {count} Locust workers connected", file=sys.stderr)
            runner.quit()
            return 1
        gevent.sleep(0.05)
    # Every worker has its clients and tensors ready: one start time for all of them.
    t0 = time.monotonic() + LEAD_S
    print(f"START {t0!r}", flush=True)
    for index, client_id in enumerate(sorted(runner.clients)):
        runner.send_message("tuner_start", {"index": index, "count": count, "t0": t0}, client_id)
    runner.start(count, spawn_rate=count)
    all_done.wait()
    runner.quit()
    failed = [d["error"] for d in done if "error" in d]
    if failed:
        print(f"a Locust worker failed: {failed[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
