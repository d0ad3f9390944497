"""The discrete-event simulation of Triton's dynamic batcher, model instances and device (pure).

The rules, as Triton core implements them (triton-inference-server/core, `src/`):

- **Queue.** Requests join one FIFO queue in arrival order (`DynamicBatchScheduler::Enqueue`,
  `PriorityQueue::Enqueue` in `scheduler_utils.cc`). With `max_queue_size` set, a request arriving
  to a queue that already holds that many is refused at once ("Exceeds maximum queue size",
  `PriorityQueue::PolicyQueue::Enqueue`): an error. Requests already taken into a batch no longer
  count. A request of more rows than `max_batch_size` is refused at once as well (Triton checks the
  batch dimension before scheduling): an error.
- **Forming a batch** (`DynamicBatchScheduler::GetDynamicBatch`): requests are taken from the head
  in order; the scan stops at the first request whose rows would push the batch above
  `max_batch_size` (`send_now`: that request is not split or skipped, it opens the next batch).
  Each time the rows so far equal a preferred size, that prefix is marked; the batch is the
  *largest* marked prefix. When the next request would exceed the largest preferred size and no
  preferred size was hit, the prefix so far is marked instead (`best_preferred_batch_size =
  pending_batch_size_`). Without `preferred_batch_size` Triton uses `[max_batch_size]`
  (`NormalizeModelConfig` in `model_config_utils.cc`).
- **Equal shapes** (`equal_shapes`: an input with a variable dim and no `allow_ragged_batch`): the
  scan also stops at the first request whose length differs from the batch's first request's
  (`RequiredEqualInputs::HasEqualInputs` fails: the payload is saturated and sent as it is, like
  `send_now`); that request opens the next batch. Otherwise requests of any length batch together and
  the batch is padded to its longest.
- **When it is dispatched**, with a model instance free (`BatcherThread` waits for a payload slot,
  `WaitForPayloadSlotAvailable`; `RateLimiter::PayloadSlotAvailable`):
  1. a preferred prefix exists and the oldest request has not waited `max_queue_delay` yet: that
     prefix goes now (with delay 0 too: `delay_is_exceeded` is false when the delay is 0);
  2. otherwise, the batch cannot grow (`send_now`, or rows >= the largest preferred size), or the
     oldest request has waited the delay, or the delay is 0: everything scanned goes now;
  3. otherwise the batcher sleeps until the oldest request's delay expires or a request arrives
     (`return wait_ns / 1000`), and decides again.
  The delay thus bounds only the wait for a *larger* batch: a preferred size reached earlier goes
  at once, and with delay 0 what is queued goes as soon as an instance is free (the documented
  behaviour: server `docs/user_guide/batcher.md`, "Dynamic Batcher", "Preferred Batch Sizes",
  "Delayed Batching").
- **Instances.** The batcher forms one batch at a time and the instance free longest takes it
  (`RateLimiter::DequeuePayload`). Triton may form payloads ahead while every instance is busy and
  let them absorb later arrivals until an instance takes them (prefetching, `PayloadSlotAvailable`
  with `support_prefetching`); forming the batch when the instance frees gives the same batches
  in arrival order, and is exactly what Triton does with a queue policy (`max_queue_size` turns
  prefetching off: `PriorityQueue::PriorityQueue`). Not modelled: `InstanceQueue::Dequeue` merging
  two queued unsaturated payloads; priorities, timeouts, ordering with several instances and the
  response cache (a config using them is refused up front: `_support`).
- **Execution.** An execution of R rows whose longest request has L tokens holds its instance for
  the host pre-processing (half of `host_ms_per_row` x R + `host_ms_per_execution`), then waits for
  the device, holds it for `profile.device_ms(R, L)`, then does the host post-processing (the other
  half); each request after the first adds `host_ms_per_request`, split alike. The device runs
  `profile.concurrent_executions` executions at a time, granted in dispatch order (1: instances
  serialise on it, as the emulated GPU's lock does). An execution the profile says runs out of
  memory (`profile.fails(R, L)`: by measured length) fails every request in it after `oom_ms` on
  the device. A request completes when its execution does, plus `overhead_ms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tuner import space
from tuner.errors import SettingsError, TrafficError
from tuner.simulate._profile import Profile

OK, QUEUE_FULL, OUT_OF_MEMORY, TOO_LARGE = 0, 1, 2, 3
STATUS_NAMES = {OK: "ok", QUEUE_FULL: "queue full", OUT_OF_MEMORY: "out of memory",
                TOO_LARGE: "rows above max_batch_size"}


@dataclass(frozen=True)
class BatcherConfig:
    """One configuration of the dynamic batcher and the model's instances."""

    max_batch_size: int
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] | None = None  # None: Triton's default, [max_batch_size]
    instance_count: int = 1
    max_queue_size: int = 0  # 0: unbounded (Triton's default)
    equal_shapes: bool = False  # only requests of one length batch together (no allow_ragged_batch)

    def __post_init__(self) -> None:
        def integer(key: str, minimum: int) -> None:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
                raise SettingsError(f"{key} must be an integer >= {minimum}, got {value!r}")

        integer("max_batch_size", 1)
        integer("max_queue_delay_microseconds", 0)
        integer("instance_count", 1)
        integer("max_queue_size", 0)
        if self.preferred_batch_size is not None:
            sizes = tuple(int(s) for s in self.preferred_batch_size)
            for size in sizes:
                if not 1 <= size <= self.max_batch_size:
                    raise SettingsError(f"preferred_batch_size: 1 <= size <= max_batch_size must hold, but got "
                                        f"(size={size}, max_batch_size={self.max_batch_size})")
            object.__setattr__(self, "preferred_batch_size", tuple(sorted(set(sizes))) or None)

    @property
    def preferred(self) -> tuple[int, ...]:
        """The preferred sizes Triton uses: the configured ones, or [max_batch_size]."""
        return self.preferred_batch_size or (self.max_batch_size,)


@dataclass(frozen=True)
class Requests:
    """The requests of one schedule: due times (s, increasing), rows and sequence lengths."""

    due_s: np.ndarray
    rows: np.ndarray
    length: np.ndarray

    def __len__(self) -> int:
        return len(self.due_s)


@dataclass(frozen=True, kw_only=True)
class BatchRun:
    """What happened to every request and every execution of one simulated schedule."""

    # per request
    status: np.ndarray       # OK, QUEUE_FULL, OUT_OF_MEMORY, TOO_LARGE
    dispatch_s: np.ndarray   # when its batch left the queue (NaN if refused)
    done_s: np.ndarray       # when its response left Triton (NaN if refused; failures complete too)
    # per execution, in dispatch order
    exec_start_s: np.ndarray
    exec_end_s: np.ndarray   # the instance free again
    exec_rows: np.ndarray
    exec_length: np.ndarray  # longest (truncated) length in the batch
    exec_requests: np.ndarray
    exec_device_s: np.ndarray
    exec_ok: np.ndarray


def simulate(requests: Requests, config: BatcherConfig, profile: Profile,
             *,
             device_cache: dict | None = None) -> BatchRun:
    """Run `requests` through the dynamic batcher of `config` on a model costed by `profile`.

    `device_cache` memoizes device seconds by (rows, length) across calls with the same profile."""
    if len(requests) > 1 and (np.diff(requests.due_s) < 0).any():
        first = int(np.argmax(np.diff(requests.due_s) < 0)) + 1
        raise TrafficError(f"requests: due times must not decrease, but request {first} is due at "
                           f"{requests.due_s[first]:g} s, before request {first - 1} at {requests.due_s[first - 1]:g} s")
    if len(requests) and (requests.rows.min() < 1 or requests.length.min() < 1):
        raise TrafficError("requests: rows and lengths must be >= 1")
    due = requests.due_s.tolist()
    rows = requests.rows.tolist()
    shape = requests.length.tolist()  # as sent: Triton compares the shapes before any truncation
    lens = [profile.length_of(n) for n in shape]
    equal = config.equal_shapes
    n = len(due)
    mbs = config.max_batch_size
    delay = config.max_queue_delay_microseconds * 1e-6
    preferred = frozenset(config.preferred)
    max_preferred = max(preferred)
    qmax = config.max_queue_size
    host_half = profile.host_ms_per_row * 0.5e-3
    exec_half = profile.host_ms_per_execution * 0.5e-3
    request_half = profile.host_ms_per_request * 0.5e-3  # each request after an execution's first
    overhead = profile.overhead_ms * 1e-3
    fails = profile.fails  # the memory limit of the nearest measured lengths
    oom_s = profile.oom_ms * 1e-3
    cache = device_cache if device_cache is not None else {}
    device_ms = profile.device_ms

    status = [OK] * n
    dispatch = [math.nan] * n
    done = [math.nan] * n
    ex_start: list[float] = []
    ex_end: list[float] = []
    ex_rows: list[int] = []
    ex_len: list[int] = []
    ex_req: list[int] = []
    ex_dev: list[float] = []
    ex_ok: list[bool] = []

    free = [0.0] * config.instance_count        # when each instance is free again
    device = [0.0] * profile.concurrent_executions  # when each device slot is free again
    q: list[int] = []   # accepted requests in arrival order; q[head:] still queued
    head = 0
    j = 0               # next request to arrive
    now = 0.0           # the batcher's clock: dispatches happen in time order
    # the batch forming at the head: `cnt` requests / `cum` rows fit; `best`: largest preferred prefix;
    # `full`: the next queued request does not fit
    cnt = cum = best = 0
    full = False

    while True:
        if head == len(q):
            if j >= n:
                break
            if now < due[j]:
                now = due[j]
        else:
            k = min(range(len(free)), key=free.__getitem__)
            if free[k] > now:
                now = free[k]
        # arrivals up to `now` join the queue (or are refused)
        while j < n and due[j] <= now:
            r = rows[j]
            if r > mbs:
                status[j] = TOO_LARGE
            elif qmax and len(q) - head >= qmax:
                status[j] = QUEUE_FULL
            else:
                q.append(j)
                if not full and len(q) - head == cnt + 1:  # extends the scan of the forming batch
                    if cnt == 0:
                        cnt, cum = 1, r
                    else:
                        if cum + r > max_preferred and best == 0:
                            best = cnt
                        if cum + r > mbs or (equal and shape[j] != shape[q[head]]):
                            full = True
                        else:
                            cnt += 1
                            cum += r
                    if not full and cum in preferred:
                        best = cnt
            j += 1
        if head == len(q):
            continue
        k = min(range(len(free)), key=free.__getitem__)
        if free[k] > now:
            continue  # every instance is busy: wait for one (arrivals meanwhile queue up)
        oldest = due[q[head]]
        exceeded = delay > 0 and now >= oldest + delay
        if best and not exceeded:
            take = best
        elif full or cum >= max_preferred or exceeded or delay == 0:
            take = cnt
        else:  # wait for the delay to expire or the next arrival, then decide again
            wake = oldest + delay
            if j < n and due[j] < wake:
                wake = due[j]
            now = wake
            continue

        # dispatch q[head:head+take] to instance k at `now`
        batch_rows = longest = 0
        for x in range(head, head + take):
            i = q[x]
            batch_rows += rows[i]
            if lens[i] > longest:
                longest = lens[i]
            dispatch[i] = now
        host = exec_half + host_half * batch_rows + request_half * (take - 1)
        ready = now + host
        d = min(range(len(device)), key=device.__getitem__)
        start = device[d] if device[d] > ready else ready
        ok = not fails(batch_rows, longest)
        if ok:
            key = (batch_rows, longest)
            held = cache.get(key)
            if held is None:
                held = cache[key] = device_ms(batch_rows, longest) * 1e-3
            finish = start + held + host
        else:
            held = oom_s
            finish = start + held + exec_half  # the model raises: no post-processing of its own
        device[d] = start + held
        free[k] = finish
        for x in range(head, head + take):
            i = q[x]
            done[i] = finish + overhead
            if not ok:
                status[i] = OUT_OF_MEMORY
        ex_start.append(now)
        ex_end.append(finish)
        ex_rows.append(batch_rows)
        ex_len.append(longest)
        ex_req.append(take)
        ex_dev.append(held)
        ex_ok.append(ok)
        head += take

        # rescan the new head's batch
        cnt = cum = best = 0
        full = False
        for x in range(head, len(q)):
            r = rows[q[x]]
            if cnt:
                if cum + r > max_preferred and best == 0:
                    best = cnt
                if cum + r > mbs or (equal and shape[q[x]] != shape[q[head]]):
                    full = True
                    break
            cnt += 1
            cum += r
            if cum in preferred:
                best = cnt

    return BatchRun(
        status=np.asarray(status, dtype=np.int8),
        dispatch_s=np.asarray(dispatch, dtype=float),
        done_s=np.asarray(done, dtype=float),
        exec_start_s=np.asarray(ex_start, dtype=float),
        exec_end_s=np.asarray(ex_end, dtype=float),
        exec_rows=np.asarray(ex_rows, dtype=np.int64),
        exec_length=np.asarray(ex_len, dtype=np.int64),
        exec_requests=np.asarray(ex_req, dtype=np.int64),
        exec_device_s=np.asarray(ex_dev, dtype=float),
        exec_ok=np.asarray(ex_ok, dtype=bool),
    )


# --- from trial parameters ----------------------------------------------------------------------


def _preferred_for(strategy, max_batch_size: int, base: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
    """Preferred sizes of a configuration, as `tuner.space.apply` writes them: a strategy name
    (`none` keeps the base config's sizes that fit) or the sizes themselves."""
    if strategy is not None and not isinstance(strategy, str):
        return tuple(int(s) for s in strategy)
    if strategy not in (None, *space.STRATEGIES):
        raise SettingsError(f"preferred_batch_size: must be one of {', '.join(space.STRATEGIES)} "
                            f"or a list of sizes, got {strategy!r}")
    sizes = space.preferred_sizes(strategy or "none", max_batch_size)
    if sizes is None:
        sizes = tuple(s for s in (base or ()) if s <= max_batch_size)
    return sizes or None


def batcher_config(params: dict, *, preferred: str | tuple[int, ...] | None = "none",
                   base_preferred: tuple[int, ...] | None = None, instance_count: int = 1,
                   max_queue_size: int = 0, equal_shapes: bool = False) -> BatcherConfig:
    """A `BatcherConfig` from trial parameters (keys: the knobs' names, `tuner.space.NAMES`); absent keys take the
    keyword defaults (the base config's values; `equal_shapes` is the model's, `equal_shapes_of`)."""
    unknown = sorted(set(params) - set(space.NAMES))
    if unknown:
        raise SettingsError(f"configuration: {unknown[0]}: unknown key (expected one of: {', '.join(space.NAMES)})")
    if "max_batch_size" not in params:
        raise SettingsError("configuration: max_batch_size: required key missing")
    mbs = params["max_batch_size"]
    if isinstance(mbs, bool) or not isinstance(mbs, int | np.integer) or mbs < 1:
        raise SettingsError(f"configuration: max_batch_size must be an integer >= 1, got {mbs!r}")
    return BatcherConfig(
        max_batch_size=int(mbs),
        max_queue_delay_microseconds=int(params.get("max_queue_delay_microseconds", 0)),
        preferred_batch_size=_preferred_for(params.get("preferred_batch_size", preferred), int(mbs), base_preferred),
        instance_count=int(params.get("instance_count", instance_count)),
        max_queue_size=int(params.get("max_queue_size", max_queue_size)),
        equal_shapes=bool(equal_shapes),
    )
