"""The discrete-event simulation of Triton's dynamic batcher, model instances and device (pure).

The rules, as Triton core implements them (triton-inference-server/core, `src/`, read at r24.10, the
tritonserver 2.51 the tests run; these files' batching code is unchanged since). Threads are idealised:
the batcher's work takes no time, and an instance that ends an execution takes the next queued payload
before the batcher runs again.

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
- **When it goes** (`GetDynamicBatch`'s return; the batcher rescans from the queue's head each time,
  as Triton's cursor does without timeouts, `PriorityQueue::IsCursorValid`):
  1. a preferred prefix exists and the oldest request has not waited `max_queue_delay` yet: that
     prefix goes now; with delay 0 the payload is closed (`payload_saturated_`);
  2. otherwise, the batch cannot grow (`send_now`, or rows >= the largest preferred size: closed), or the
     oldest request has waited the delay, or the delay is 0: everything scanned goes now;
  3. a payload already queued, below a preferred size and not closed, takes what is scanned now (it grows);
  4. otherwise the batcher sleeps until the oldest request's delay (or the closest timeout) expires.
  A payload that goes and is not closed stays the batcher's: later rescans add to it until an instance
  takes it (`curr_payload_` is replaced only when saturated or `IsStaleState`).
- **Forming ahead** (`BatcherThread`, `WaitForPayloadSlotAvailable`, `RateLimiter::PayloadSlotAvailable`):
  without a queue policy Triton forms and queues up to 2 x instances payloads while the instances are
  busy; with one (`max_queue_size`, a timeout, `allow_timeout_override`: `support_prefetching_` is off
  in `PriorityQueue::PriorityQueue`) only when an instance waits. An arrival wakes a sleeping batcher
  only when a slot is free and (equal shapes are enforced, or the payload is closed, or the queued rows
  reach `next_preferred_batch_size_`: `DynamicBatchScheduler::Enqueue`); otherwise it sleeps on (500 ms
  with an empty queue), so a queued payload may not grow. An instance that ends an execution or takes a
  payload wakes it (`Payload::Callback`). The instance free longest takes the queue's front payload
  (`RateLimiter::DequeuePayload`) and, with a delay, merges the next queued payloads older than the
  delay while they fit (`InstanceQueue::Dequeue`, `Payload::MergePayload`: equal shapes too); one that
  does not fit is frozen (EXECUTING) and runs on its own.
- **Queue timeouts** (`default_queue_policy`, `PolicyQueue::ApplyPolicy`): a request queued past
  `default_timeout_microseconds` is found when a scan reaches it, or, with REJECT, every 500 ms while
  the batcher waits for a slot (`RejectTimeoutRequests`): REJECT fails it (TIMEOUT, an error, as the
  server's "Request timeout expired"), DELAY moves it behind the queue (`delayed_queue_`). Requests
  due at one instant arrive together. Not modelled (refused up front: `_support`): priorities, ordering
  with several instances, the response cache.
- **Execution.** An execution of R rows whose longest request has L tokens holds its instance for
  the host pre-processing (half of `host_ms_per_row` x R + `host_ms_per_execution`), then waits for
  the device, holds it for `profile.device_ms(R, L)`, then does the host post-processing (the other
  half); each request after the first adds `host_ms_per_request`, split alike. The device runs
  `profile.concurrent_executions` executions at a time, granted in dispatch order (1: instances
  serialise on it, as the emulated GPU's lock does); of the device time, the share
  `profile.device_overlap` holds the instance but not the device (another execution runs beside it).
  An execution the profile says runs out of memory (`profile.fails(R, L)`: by measured length) fails
  every request in it after `oom_ms` on
  the device. A request completes when its execution does, plus `overhead_ms`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner import space
from tuner.errors import SettingsError, TrafficError
from tuner.simulate._profile import Profile

OK, QUEUE_FULL, OUT_OF_MEMORY, TOO_LARGE, TIMEOUT = 0, 1, 2, 3, 4
STATUS_NAMES = {OK: "ok", QUEUE_FULL: "queue full", OUT_OF_MEMORY: "out of memory",
                TOO_LARGE: "rows above max_batch_size", TIMEOUT: "queue timeout"}
TIMEOUT_ACTIONS = ("reject", "delay")


@dataclass(frozen=True, kw_only=True)
class BatcherConfig:
    """One configuration of the dynamic batcher and the model's instances."""

    max_batch_size: int
    max_queue_delay_microseconds: int = 0
    preferred_batch_size: tuple[int, ...] | None = None  # None: Triton's default, [max_batch_size]
    instance_count: int = 1
    max_queue_size: int = 0  # 0: unbounded (Triton's default)
    equal_shapes: bool = False  # only requests of one length batch together (no allow_ragged_batch)
    # dynamic_batching.default_queue_policy
    default_timeout_microseconds: int = 0  # 0: none
    timeout_action: str = "reject"         # or "delay": behind the queue instead of an error
    allow_timeout_override: bool = False   # the replay sets no request timeout: it only turns prefetching off

    def __post_init__(self) -> None:
        def integer(key: str, minimum: int) -> None:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
                raise SettingsError(f"{key} must be an integer >= {minimum}, got {value!r}")

        integer("max_batch_size", 1)
        integer("max_queue_delay_microseconds", 0)
        integer("instance_count", 1)
        integer("max_queue_size", 0)
        integer("default_timeout_microseconds", 0)
        if self.timeout_action not in TIMEOUT_ACTIONS:
            raise SettingsError(f"timeout_action must be one of {', '.join(TIMEOUT_ACTIONS)}, "
                                f"got {self.timeout_action!r}")
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

    @property
    def prefetching(self) -> bool:
        """Whether Triton forms batches ahead of busy instances: only without a queue policy
        (`support_prefetching_` in `PriorityQueue::PriorityQueue`)."""
        return not (self.default_timeout_microseconds or self.allow_timeout_override or self.max_queue_size)


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
             device_cache: dict | None = None, instance_first: bool | Sequence[bool] = True) -> BatchRun:
    """Run `requests` through the dynamic batcher of `config` on a model costed by `profile`.

    `device_cache` memoizes device seconds by (rows, length) across calls with the same profile.

    `instance_first` settles a race in Triton. When an execution ends, its instance thread goes on to
    take the next queued batch (or to wait for one), while the batcher, notified by the same end
    (`Payload::Execute`'s callback), looks at its queue. True (the default): the instance goes first,
    as on an idle host. False: the batcher does, as on a host with every core busy, where it won on
    most ends (measured against Triton 2.51: tests/test_simulate_conformance.py). Then a batch queued
    behind the instance still grows by what arrived since; and without prefetching (a queue policy)
    the batcher finds no instance waiting (`RateLimiter::PayloadSlotAvailable`) and waits on, until
    the next arrival or its 500 ms wait ends. The race is run again at every end, and a loaded host
    does not decide it the same way each time (CI: the instance at one end, the batcher at the next):
    a sequence gives each execution end's winner in turn (True: the instance), its last for any later
    ends."""
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

    inf = math.inf
    # who wins each execution end's race (see the docstring): ends[0] for the first end, and so on
    ends = [instance_first] if isinstance(instance_first, bool) else [bool(x) for x in instance_first] or [True]
    # the batcher's wait for a slot has a timer (Triton's is always 500 ms) where a missed instance, or a
    # REJECT timeout, needs one; where the instance wins every end the batcher never misses it
    timer = not all(ends)
    ended = 0               # execution ends so far
    ninst = config.instance_count
    free = [0.0] * ninst          # when each instance is free again
    busy = [False] * ninst
    device = [0.0] * profile.concurrent_executions  # when each device slot is free again
    exclusive = 1.0 - profile.device_overlap  # the device time's share no other execution runs beside
    prefetch = config.prefetching
    slots = 2 * ninst             # RateLimiter::PayloadSlotAvailable: 2 x instances queued payloads
    timeout = config.default_timeout_microseconds * 1e-6
    reject = config.timeout_action == "reject"
    expire = [inf] * n if timeout else None
    preferred_sorted = sorted(preferred)
    q: list[int] = []       # PolicyQueue::queue_: accepted requests, arrival order; q[head:] still queued
    delayed: list[int] = []  # PolicyQueue::delayed_queue_: expired under timeout_action DELAY
    pq: list[list] = []     # the rate limiter's payload queue: formed batches no instance has taken yet
    # a payload: [requests, rows, oldest due, shape, shape-saturated (Payload::MarkSaturated), stale, queued]
    head = 0                # q[:head] left the queue
    idle = ninst            # instances waiting for a payload
    sat = False             # payload_saturated_: the batcher starts a new payload
    next_pref = 0           # next_preferred_batch_size_: an arrival wakes the batcher from this many rows
    queued_rows = 0         # queued_batch_size_
    slot_wait = False       # the batcher waits for a payload slot
    wake = inf              # when the batcher wakes by itself
    cur: list = [[], 0, inf, -1, False, False, False]  # curr_payload_

    def slot_ok() -> bool:
        # RateLimiter::PayloadSlotAvailable: with prefetching, fewer than 2 x instances payloads queued;
        # without (a queue policy: PriorityQueue::PriorityQueue), an instance waiting for one
        return len(pq) < slots if prefetch else idle > 0

    def execute(pl: list, now: float) -> None:
        """An instance takes the payload at the queue's front (RateLimiter::DequeuePayload) and runs it."""
        nonlocal idle
        idle -= 1
        pl[5] = True  # EXECUTING: the batcher starts a new payload
        k = 0 if ninst == 1 else min((x for x in range(ninst) if not busy[x]), key=free.__getitem__)  # free longest
        take = pl[0]
        # InstanceQueue::Dequeue: with a delay, merge the next queued payloads older than the delay
        # while they fit (Payload::MergePayload also wants equal shapes); one that does not is frozen
        if delay > 0 and mbs > 1 and not pl[4]:
            while pq and not pq[0][4] and now - pq[0][2] > delay:
                nxt = pq[0]
                nxt[5] = True
                if pl[1] + nxt[1] > mbs or (equal and nxt[3] != pl[3]):
                    break
                take = take + nxt[0]
                pl[1] += nxt[1]
                pq.pop(0)
        batch_rows = longest = 0
        for i in take:
            batch_rows += rows[i]
            if lens[i] > longest:
                longest = lens[i]
            dispatch[i] = now
        host = exec_half + host_half * batch_rows + request_half * (len(take) - 1)
        ready = now + host
        d = 0 if len(device) == 1 else min(range(len(device)), key=device.__getitem__)
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
        device[d] = start + held * exclusive
        free[k] = finish
        busy[k] = True
        for i in take:
            done[i] = finish + overhead
            if not ok:
                status[i] = OUT_OF_MEMORY
        ex_start.append(now)
        ex_end.append(finish)
        ex_rows.append(batch_rows)
        ex_len.append(longest)
        ex_req.append(len(take))
        ex_dev.append(held)
        ex_ok.append(ok)

    def expired(i: int, now: float) -> None:
        """PolicyQueue::ApplyPolicy / RejectTimeoutRequests: a request past its timeout."""
        if reject:
            status[i] = TIMEOUT
            done[i] = now + overhead
        else:
            delayed.append(i)

    def dynamic_batch(now: float) -> tuple[float, int, int]:
        """DynamicBatchScheduler::GetDynamicBatch, rescanning from the queue's head (the cursor is
        reset on every call without timeouts, `PriorityQueue::IsCursorValid`, and a valid one holds what
        a rescan finds). Returns (when to look again, 0 to take now; requests to take; their rows)."""
        nonlocal sat, next_pref, queued_rows
        p = cur[1]
        bshape = cur[3]
        pending = cnt = best = mark = 0
        send_now = False
        oldest = closest = inf
        pos = head
        dpos = 0
        while True:
            if pos < len(q):
                i = q[pos]
                if timeout and now > expire[i]:  # ApplyPolicyAtCursor
                    del q[pos]
                    if reject:
                        queued_rows -= rows[i]
                    expired(i, now)
                    continue
                main = True
            elif dpos < len(delayed):
                i = delayed[dpos]
                main = False
            else:
                break
            r = rows[i]
            if p + pending == 0:
                bshape = shape[i]
            else:
                if p + pending + r > max_preferred and best == 0:
                    best, mark = pending, cnt
                    sat = True
                if p + pending + r > mbs:
                    send_now = True
                    break
                if equal and shape[i] != bshape:
                    cur[4] = True
                    send_now = True
                    break
            pending += r
            cnt += 1
            if due[i] < oldest:
                oldest = due[i]
            if main:
                pos += 1
                if timeout and expire[i] < closest:
                    closest = expire[i]
            else:
                dpos += 1
            if p + pending in preferred:
                best, mark = pending, cnt
        exceeded = delay > 0 and now >= oldest + delay
        if best and not exceeded:  # a preferred size: now (delay 0 closes the payload)
            if delay == 0:
                sat = True
            return 0.0, mark, best
        if cnt == 0:
            return 0.0, 0, 0
        if send_now or p + pending >= max_preferred:  # it cannot grow: now, and closed
            sat = True
            return 0.0, cnt, pending
        if exceeded or delay == 0:
            return 0.0, cnt, pending
        nxt = next((s for s in preferred_sorted if s > p + pending), preferred_sorted[0])
        next_pref = nxt - p
        if not sat and p and p not in preferred:  # a queued payload below a preferred size grows
            return 0.0, cnt, pending
        until = oldest + delay  # the wait also ends at the pending batch's closest timeout
        if closest < inf:
            until = min(closest, until) if now < closest else now + 1e-6
        return until, 0, 0

    def batcher(now: float) -> None:
        """DynamicBatchScheduler::BatcherThread, run until it waits."""
        nonlocal cur, sat, next_pref, queued_rows, slot_wait, wake, head
        while True:
            if sat or cur[5]:  # NewPayload
                cur = [[], 0, inf, -1, False, False, False]
                sat = False
                next_pref = 0
            if head == len(q) and not delayed:
                slot_wait = False
                wake = now + 0.5  # default_wait_microseconds
                return
            if not slot_ok():  # WaitForPayloadSlotAvailable
                if not slot_wait:
                    slot_wait = True
                    # its wait ends every 500 ms: REJECT drops expired requests, and an instance it did
                    # not see free (instance_first) is seen
                    wake = now + 0.5 if (timeout and reject) or timer else inf
                return
            slot_wait = False
            until, take, taken = dynamic_batch(now)
            if take:
                reqs = cur[0]
                for _ in range(take):
                    if head < len(q):
                        i = q[head]
                        head += 1
                    else:
                        i = delayed.pop(0)
                    reqs.append(i)
                    if due[i] < cur[2]:
                        cur[2] = due[i]
                    if cur[3] < 0:
                        cur[3] = shape[i]
                cur[1] += taken
                queued_rows -= taken
            if until:
                wake = until
                return
            if take and not cur[6]:  # READY: EnqueuePayload; an idle instance takes it at once
                cur[6] = True
                pq.append(cur)
                if idle:
                    execute(pq.pop(0), now)
            elif not take and not sat:
                wake = now + 0.5
                return

    j = 0               # next request to arrive
    while True:
        t_arr = due[j] if j < n else inf
        if ninst == 1:
            t_fin, kf = (free[0], 0) if busy[0] else (inf, -1)
        else:
            t_fin, kf = inf, -1
            for k in range(ninst):
                if busy[k] and free[k] < t_fin:
                    t_fin, kf = free[k], k
        t_wake = wake if head < len(q) or delayed else inf  # with nothing queued it would sleep on
        if t_arr == inf and t_fin == inf and t_wake == inf:
            break
        if t_arr <= t_fin and t_arr <= t_wake:  # arrivals (DynamicBatchScheduler::Enqueue), a burst at once
            now = t_arr
            woken = False
            while j < n and due[j] == now:
                r = rows[j]
                if r > mbs:
                    status[j] = TOO_LARGE
                else:
                    queued_rows += r  # counted before the queue may refuse it, as Enqueue does
                    if qmax and len(q) - head + len(delayed) >= qmax:
                        status[j] = QUEUE_FULL
                    else:
                        q.append(j)
                        if timeout:
                            expire[j] = now + timeout
                        # the batcher is woken when it may decide otherwise now
                        woken = woken or (slot_ok() and (equal or sat or cur[5]
                                                         or queued_rows >= next_pref))
                j += 1
            if woken:
                batcher(now)
        elif t_fin <= t_wake:  # an execution ends: the instance takes the next payload, the batcher is told
            now = t_fin
            busy[kf] = False
            queued = head < len(q) or delayed
            first = ends[min(ended, len(ends) - 1)]  # who wins this end's race (instance_first)
            ended += 1
            if not first and queued:  # the batcher looks before the instance is back
                if prefetch:
                    batcher(now)  # a payload queued behind the instance grows
                else:  # no instance waiting: it waits for a slot
                    if sat or cur[5]:
                        cur = [[], 0, inf, -1, False, False, False]
                        sat = False
                        next_pref = 0
                    if not slot_wait:
                        slot_wait = True
                        wake = now + 0.5
            idle += 1
            if pq:
                execute(pq.pop(0), now)
            if not first and queued and not prefetch:
                pass  # it waits on for an arrival or its timer
            elif head == len(q) and not delayed:  # the batcher's first steps, inline: it finds nothing queued
                if sat or cur[5]:
                    cur = [[], 0, inf, -1, False, False, False]
                    sat = False
                    next_pref = 0
                slot_wait = False
                wake = now + 0.5
            else:
                batcher(now)
        else:  # the batcher's own timer
            now = t_wake
            if slot_wait:  # every 500 ms while waiting for a slot, REJECT drops expired requests
                if timeout and reject:
                    keep = [i for i in q[head:] if not now > expire[i]]
                    for i in q[head:]:
                        if now > expire[i]:
                            expired(i, now)
                    q[head:] = keep
                wake = now + 0.5
                if slot_ok():  # an instance it did not see free (instance_first)
                    batcher(now)
            else:
                wake = inf
                batcher(now)

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
                   max_queue_size: int = 0, equal_shapes: bool = False,
                   queue_policy: dict | None = None) -> BatcherConfig:
    """A `BatcherConfig` from trial parameters (keys: the knobs' names, `tuner.space.NAMES`); absent keys take the
    keyword defaults (the base config's values; `equal_shapes` is the model's, `equal_shapes_of`;
    `queue_policy` its timeout settings, `queue_policy_of`)."""
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
        **(queue_policy or {}),
    )
