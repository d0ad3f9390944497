"""Measure a model's execution-time profile through Triton (`tuner profile`): the IO side of
`tuner.simulate.Profile`, which the dynamic-batcher simulation (`tuner.simulate`) charges executions by.

    measure_profile(launcher, settings, traffic, base, length_column=...) -> ProfileRun
    row_grid(max_batch_size), length_buckets(traffic, column, max_length)   the sizes measured
    padded_lengths(settings, traffic, base=, profile=, column=)             and the incumbent's padded ones
    largest_rows(settings, given)                                            rows up to (the space's largest)
    build_profile(samples, ...) -> (Profile, notes)                          the samples as a profile (pure)
    table(run) -> str, request_table(run) -> str                             rows x lengths; N requests vs N rows

**How.** The server loads the model with `max_batch_size` = the space's largest, no queue delay and one
instance (the profile is per execution: how instances share the device is the profile's
`concurrent_executions`, see "Instances at once" below). The configuration is warmed
up as a trial is (`tuner.trial.warmup.warm_up`: the shape sweep, then the traffic until steady). Then each
point of the grid, rows (`row_grid`: 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, ... up to the largest
max_batch_size) x padded length (`length_buckets`: quantiles of the traffic's length column, capped at
the model's maximum length), then the lengths the incumbent's batches are padded to (`padded_lengths`:
the base config simulated on the study's traffic at its load with the points measured so far; those
not within 15 % of a measured length), is sent closed loop: one request of `rows` rows x `length` tokens, alone
on the server (`tuner.replay.send_one_by_one`), so it is one execution of exactly that size; the first
request of a point is not measured (a shape's first run pays compilation/autotuning on a GPU, and
`encoder_sim` emulates that), then one is; the other `repeats` - 1 are sent in rounds over the whole
grid (one request of every point that ran per round), so that a stall of a busy host lifts one sample
of many points rather than every sample of one. Each request's execution is read from Triton's
statistics before and after it (`batch_stats` of its batch size); a request whose two reads do not show
exactly its one execution (Triton counted it late on a loaded host) is sent again.

**Batches of separate requests.** Then, at the shortest measured length, for each rows N >= 2 of the
grid that ran there, `repeats` batches of N separate one-row requests are timed (after one that is not
measured), to compare with the one request of N rows: the instance is held by a *blocker* (the
slowest measured point of other rows, alone on the idle instance), and while it runs the N requests
are sent at once (`tuner.replay.send_together`); they queue behind it and Triton's batcher puts them
in one payload, which grows until the instance frees (with delay 0 and N <= max_batch_size: exactly
one execution of N requests, as `DynamicBatchScheduler::BatcherThread` / `GetDynamicBatch` add
requests to a payload waiting for its instance). A try counts only when Triton's statistics show
exactly the two executions, the blocker's and one of N; otherwise it is tried again (at most
`HELD_TRIES` times, the later tries after growing pauses, so that a burst of load on the host does not
spoil them all). Triton's `TRITONSERVER_DELAY_SCHEDULER` variable is not used: the batcher thread
reads it once, when the model loads, and holds only the first batch after each load (core
`src/dynamic_batch_scheduler.cc`), so every batch would need a reload and be a cold instance's.

**Instances at once.** When the space tries more than one instance (`search.instance_count`), the
profile measures how many executions the device runs at once (`concurrent_executions`): the model is
loaded again with that many instances (k) and `max_batch_size` = the rows of the slowest point measured
(so that no two of its requests share a batch), warmed with rounds of k such requests sent together
(every instance runs one per round) until the mean of the last three is within 5 % of the three
before (a cold start still fading makes the together rounds slower than the one alone), then
`CONCURRENCY_REPEATS` times one request alone and k together, alternately, the median of each: k x
(one alone) / (k together), rounded, between 1 and k. One GPU shared by its instances takes turns (1, as
the emulated GPU's lock does); a CPU whose instances each run a thread on a core of their own, or
instances on separate GPUs, run k at once. When that rounds to 1, what the k together gained over k in
turn is the profile's `device_overlap` f, the share of an execution's device time another one runs
beside (each of the k - 1 others adds (1 - f) x its device time to one alone): the Python backend's own
work inside compute_infer, a model's host work, kernels sharing the device. A space of one instance
leaves both at 1 and 0; `--concurrent-executions N` (or the CSV's `# concurrent_executions:` line) sets
the count instead. The simulation grants whole device slots: a device that runs two executions at 1.6x
the speed of one counts as 2 (the printed line says the ratio). When the k together fail (k copies of a
model too large for the device's memory), the count stays 1 and a note says why.

**What maps to what.** Triton times an execution in three parts (`batch_stats`): `compute_input`
(Triton hands the requests' inputs to the backend), `compute_infer` (the backend's execute: for the
Python backend the whole `execute()` of the model) and `compute_output` (the outputs handed back).
- **Device time** of a point = `compute_infer`: median, p10 and p90 over the repeats. Triton cannot see
  inside the model's execute, so host work the model does there (tokenizing, copies, `encoder_sim`'s
  `host_us_per_request` x `time_scale` = 0.12 ms per row) is counted as device time: with one instance
  this changes nothing (host and device time follow each other on the instance either way); with
  several instances on one device it makes the simulation slightly pessimistic (that host work could
  overlap another instance's device time).
- **Host time** `host_ms_per_row`, `host_ms_per_execution` = a least-squares line of `compute_input` +
  `compute_output` per execution against its rows (over the points' medians, never negative): the
  instance is busy with it, the device is not. Measured on `encoder_sim` this is ~0.15 ms per execution
  and ~0 per row (the Python backend's shared-memory exchange).
- **Per request** `host_ms_per_request` = a least-squares slope through the origin of (N batch's
  execution - one N-row request's execution, both input + infer + output, medians) against N - 1:
  what each request after the first adds (tensor fetch, response creation, the stub's IPC per
  request). Never negative; 0 when no batch of separate requests could be held.
- **Overhead** `overhead_ms` = the client's latency of a 1-row request minus its execution's three
  parts (median): HTTP, Triton's scheduling (queue time of a request that found the instance idle) and
  the response, which add to every request's latency but occupy no instance.
- **Out of memory**: a request failing with an out-of-memory error (`OOM_ERROR`; `encoder_sim`: "CUDA
  out of memory (emulated)") makes its point fail; the rows between the last size that ran and the
  failing one are bisected, so `oom_rows` holds, at each measured length, the smallest failing rows
  (one row above the largest that ran), and rows stop growing at that length. `oom_ms` = the failing
  executions' `compute_infer` (median). Any other error stops the profile with the model's message.
- **Maximum length**: the model truncates longer inputs to `max_length` tokens when it says so (the
  config's `max_sequence_length` parameter, as `encoder_sim`'s) or `--max-length` is given; lengths are
  measured up to it, and the simulation truncates lengths alike.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tuner import space
from tuner.errors import ProfileError, ServerError, ServerSetupError, SettingsError, TrafficError
from tuner.measurement import stat_deltas
from tuner.modelconfig import ModelConfig
from tuner.server import Launcher
from tuner.settings import StudySettings
from tuner.simulate import ExecutionSize, Profile, ProfilePoint, Simulator, batcher_config, equal_shapes_of
from tuner.study import model_digest
from tuner.traffic import SEQ_LEN
from tuner.trial import Warmup
from tuner.trial.warmup import warm_up

__all__ = ["CONCURRENCY_REPEATS", "HELD_TRIES", "LENGTH_QUANTILES", "OOM_ERROR", "REPEATS", "ProfileRun", "Sample",
           "build_profile", "concurrency_of", "describe_split", "largest_rows", "length_buckets", "measure_profile",
           "model_max_length", "overlap_of", "padded_lengths", "request_extras", "request_table", "row_grid", "table"]

REPEATS = 7                      # measured requests per point, after one that is not measured
LENGTH_QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 1.0)
MERGE_LENGTHS = 0.15             # a length within 15 % below the next one is measured as that one
OOM_ERROR = re.compile(r"out of memory|OutOfMemory|\bOOM\b", re.IGNORECASE)
CONCURRENCY_REPEATS = 5          # timings of one request alone and k together, for the instances at once
CONCURRENCY_WARM_ROUNDS = 60     # at most, until the mean of the last CONCURRENCY_SETTLED rounds is within
CONCURRENCY_SETTLED = 3          # 5 % of the 3 before (encoder_sim's cold start, 21x fading by half every 4
                                 # executions, takes ~35 rounds; rounds that agree with each other can still fall)
MAX_OVERLAP = 0.95               # device_overlap at most: executions counted as taking turns do, a little
STATS_WAIT_S = 1.0               # Triton counts an execution just after its response: wait this long at most
# pauses before the 1st, 2nd, ... send of a request whose execution the statistics did not show alone:
# time for a late count to land before the next send reads its "before"
SEND_PAUSES_S = (0.0, 1.0, 3.0)
HELD_TRIES = 8                   # tries per batch of separate requests before its N is given up
# pauses before the 2nd, 3rd, ... try: a burst of load on the host (another process starting) can make
# every try within a few ms miss; spread over ~10 s, the tries outlast it (only a failing N waits)
HELD_PAUSES_S = (0.0, 0.1, 0.3, 0.6, 1.0, 2.0, 3.0, 3.0)
_PARTS = ("compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True, kw_only=True)
class Sample(ExecutionSize):
    """One execution of `rows` x `length`: one request sent alone, or (`requests` > 1) that many one-row
    requests batched together; and Triton's timing of the execution (ms)."""

    ok: bool
    client_ms: float
    input_ms: float = 0.0
    infer_ms: float = 0.0
    output_ms: float = 0.0
    queue_ms: float = 0.0
    measured: bool = True       # False: the point's first request (a shape's first run)
    error: str = ""
    requests: int = 1           # separate requests in the execution (each of rows // requests rows)

    @property
    def execution_ms(self) -> float:
        """The execution's time on its instance: input + infer + output."""
        return self.input_ms + self.infer_ms + self.output_ms

    @property
    def out_of_memory(self) -> bool:
        """Whether the request failed because the server ran out of memory."""
        return not self.ok and bool(OOM_ERROR.search(self.error))


@dataclass(frozen=True, kw_only=True)
class ProfileRun:
    """A measured profile with what it came from: every sample, the grid, the warm-up, the time taken."""

    profile: Profile
    samples: tuple[Sample, ...]
    rows: tuple[int, ...]
    lengths: tuple[int, ...]
    max_batch_size: int
    warmup: Warmup | None
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    padded_lengths: tuple[int, ...] = ()  # quantiles of the incumbent's simulated padded lengths
    # the instances-at-once measurement: (instances, rows, length, ms alone, ms together), None if not measured
    concurrency: tuple[int, int, int, float, float] | None = None


# --- the grid --------------------------------------------------------------------------------------


def row_grid(max_batch_size: int) -> tuple[int, ...]:
    """Rows to measure: 1, 2, 4, 8, then steps of x1.5 and x4/3 (12, 16, 24, 32, 48, 64, 96, ...),
    up to and including `max_batch_size`."""
    if max_batch_size < 1:
        raise SettingsError(f"max_batch_size must be >= 1, got {max_batch_size}")
    rows, r = [], 1
    while r < max_batch_size:
        rows.append(r)
        r = r * 2 if r < 8 else (r * 3 // 2 if (r & (r - 1)) == 0 else r * 4 // 3)
    return (*rows, max_batch_size)


def length_buckets(traffic: pd.DataFrame, column: str | None, max_length: int | None = None,
                   *,
                   quantiles: tuple[float, ...] = LENGTH_QUANTILES) -> tuple[int, ...]:
    """Padded lengths to measure: quantiles of the traffic's `column` (each capped at `max_length`),
    a length within `MERGE_LENGTHS` below the next measured as that one; (1,) without a column."""
    if column is None:
        return (1,)
    if column not in traffic.columns:
        raise TrafficError(f"traffic: no column {column!r} (columns: {', '.join(map(str, traffic.columns))})")
    values = traffic[column].to_numpy(dtype=np.int64)
    if not len(values):
        raise TrafficError("traffic: no requests to take lengths from")
    if max_length is not None:
        values = np.minimum(values, max_length)
    found = sorted({max(int(np.quantile(values, q, method="higher")), 1) for q in quantiles})
    kept: list[int] = []
    for length in reversed(found):  # longest first: a near neighbour below it is dropped
        if not kept or length < kept[-1] * (1 - MERGE_LENGTHS):
            kept.append(length)
    return tuple(sorted(kept))


def most_points(rows_grid: tuple[int, ...]) -> int:
    """The most points one length can take: its rows up to the first that runs out of memory, then the
    bisection down to one row below it (ceil(log2(gap)) probes). At least the whole grid. The batches of
    separate requests take at most one point fewer (every rows of a length that ran, but 1)."""
    most, below = len(rows_grid), 0
    for k, rows in enumerate(rows_grid):
        most = max(most, k + 1 + math.ceil(math.log2(rows - below)))
        below = rows
    return most


def padded_lengths(settings: StudySettings, traffic: pd.DataFrame, *, base: ModelConfig, profile: Profile,
                   column: str, quantiles: tuple[float, ...] = LENGTH_QUANTILES) -> tuple[int, ...]:
    """The lengths the incumbent's (`base`'s) executions are padded to on the study's traffic at its load,
    simulated with `profile`: quantiles over the executions' rows (each row counts), truncated as the
    profile truncates."""
    params = {name: space.value_in(base, name) for name in space.NAMES}
    config = batcher_config(params | {space.PREFERRED: params[space.PREFERRED] or None},
                            equal_shapes=equal_shapes_of(base))
    step = Simulator.for_study(settings, traffic, profile, price_per_hour=1.0, length=column).run(
        config, settings.traffic.speed)
    rows, lengths = step.run.exec_rows, step.run.exec_length
    if not len(rows):
        return ()
    padded = np.repeat(lengths, rows)
    return tuple(sorted({max(int(np.quantile(padded, q, method="higher")), 1) for q in quantiles}))


def _not_near(found: tuple[int, ...], measured: tuple[int, ...]) -> tuple[int, ...]:
    """The lengths of `found` not within `MERGE_LENGTHS` of a measured one nor of each other (longest kept)."""
    kept: list[int] = []
    for length in sorted(found, reverse=True):
        if all(abs(length - m) > MERGE_LENGTHS * max(length, m) for m in (*measured, *kept)):
            kept.append(length)
    return tuple(sorted(kept))


def model_max_length(config: ModelConfig) -> int | None:
    """The tokens the model truncates inputs to, when its config says (a `max_sequence_length`
    parameter); None otherwise."""
    if "max_sequence_length" not in config.parameters:
        return None
    text = config.parameters["max_sequence_length"].string_value.strip()
    try:
        value = int(text)
    except ValueError:
        raise ProfileError(f"{config.name or 'model'}: parameters.max_sequence_length must be an integer, "
                           f"got {text!r}") from None
    return value if value >= 1 else None


# --- from samples to a profile (pure) --------------------------------------------------------------


def build_profile(samples: list[Sample] | tuple[Sample, ...], *, max_length: int | None = None,
                  concurrent_executions: int = 1, device_overlap: float = 0.0,
                  model: str = "", model_digest: str = "") -> tuple[Profile, list[str]]:
    """The profile the samples give (see the module docstring for each field), and notes on what
    was left out."""
    notes: list[str] = []
    single = [s for s in samples if s.requests == 1]
    failing: dict[int, int] = {}  # length -> the smallest rows that ran out of memory there
    for s in single:
        if s.out_of_memory:
            failing[s.length] = min(failing.get(s.length, s.rows), s.rows)
    oom_runs = [s.infer_ms for s in single if s.out_of_memory and s.infer_ms > 0]
    failed_points = {(s.rows, s.length) for s in single if s.out_of_memory}
    by_point: dict[tuple[int, int], list[Sample]] = {}
    for s in single:
        if s.ok and s.measured and (s.rows, s.length) not in failed_points:
            by_point.setdefault((s.rows, s.length), []).append(s)
    points, host = [], []
    for (rows, length), group in sorted(by_point.items()):
        if rows >= failing.get(length, rows + 1):
            notes.append(f"{rows} rows x {length} ran although {failing[length]} rows failed at that length: the "
                         f"model's memory limit is not steady; the point is left out")
            continue
        infer = np.array([s.infer_ms for s in group])
        p10, median, p90 = (float(v) for v in np.percentile(infer, [10, 50, 90]))
        points.append(ProfilePoint(rows, length, median, min(p10, median), max(p90, median), len(group)))
        host.append((rows, statistics.median(s.input_ms + s.output_ms for s in group)))
    if not points:
        raise ProfileError(f"{model or 'the model'}: no execution ran without an error (the smallest, "
                           f"{min((s.rows for s in samples), default=1)} row(s), failed too): nothing to profile")
    per_row, per_execution = _host_line(host)
    singles = [s.client_ms - s.execution_ms for s in single
               if s.ok and s.measured and s.rows == min(p.rows for p in points)]
    overhead = max(statistics.median(singles), 0.0) if singles else 0.0
    per_request = _request_slope(request_extras(samples))
    profile = Profile(points=tuple(points), host_ms_per_row=round(per_row, 6),
                      host_ms_per_execution=round(per_execution, 6), host_ms_per_request=round(per_request, 6),
                      overhead_ms=round(overhead, 6), oom_rows=tuple(sorted(failing.items())),
                      oom_ms=round(statistics.median(oom_runs), 6) if oom_runs else 0.0,
                      max_length=max_length, concurrent_executions=concurrent_executions,
                      device_overlap=round(device_overlap, 4), model=model, model_digest=model_digest)
    return profile, notes


def request_extras(samples: list[Sample] | tuple[Sample, ...]) -> list[tuple[int, int, float, float]]:
    """(N, length, ms of one N-row request, ms of N one-row requests batched), executions' input + infer +
    output, medians of the measured samples, for each N timed both ways."""
    one: dict[tuple[int, int], list[float]] = {}
    held: dict[tuple[int, int], list[float]] = {}
    for s in samples:
        if s.ok and s.measured:
            if s.requests == 1:
                one.setdefault((s.rows, s.length), []).append(s.execution_ms)
            elif s.requests == s.rows:
                held.setdefault((s.rows, s.length), []).append(s.execution_ms)
    return [(n, length, statistics.median(one[n, length]), statistics.median(ms))
            for (n, length), ms in sorted(held.items()) if (n, length) in one]


def _request_slope(extras: list[tuple[int, int, float, float]]) -> float:
    """ms per request after the first: least squares through the origin of the extra time against N - 1."""
    x = np.array([n - 1 for n, _, _, _ in extras], dtype=float)
    y = np.array([many - one for _, _, one, many in extras], dtype=float)
    if not len(x) or not (x @ x):
        return 0.0
    return float(max((x @ y) / (x @ x), 0.0))


def _host_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(ms per row, ms per execution): least squares through (rows, host ms), neither negative."""
    x = np.array([r for r, _ in points], dtype=float)
    y = np.array([ms for _, ms in points], dtype=float)
    if len(set(x.tolist())) < 2:
        return 0.0, float(max(np.median(y), 0.0))
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:  # host work does not shrink with rows: a constant
        return 0.0, float(max(np.median(y), 0.0))
    if intercept < 0:  # through the origin
        return float(max((x @ y) / (x @ x), 0.0)), 0.0
    return float(slope), float(intercept)


# --- measuring -------------------------------------------------------------------------------------


def largest_rows(settings: StudySettings, given: int | None = None) -> int:
    """The largest rows a profile measures: `given`, else the largest max_batch_size the space may try."""
    return int(given if given is not None else settings.search.max_batch_size.high)


def measure_profile(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, base: ModelConfig,
                    length_column: str | None, max_rows: int | None = None, max_length: int | None = None,
                    repeats: int = REPEATS, concurrent_executions: int | None = None,
                    on_progress: Callable[[int, int, str], None] | None = None,
                    on_window: Callable[[float], None] | None = None) -> ProfileRun:
    """Profile the study's model on a started server (see the module docstring). `length_column`:
    the traffic's sequence-length column (`tuner.simulate.length_column`), None for none; `max_rows`:
    the largest rows measured (`max_rows`); `concurrent_executions`: the device's executions at once,
    None to measure them when the space tries several instances; `on_window(ms)` after each warm-up
    window; `on_progress(done, total, what)` after each point."""
    started = time.monotonic()
    model = settings.model
    mbs = largest_rows(settings, max_rows)
    if mbs < 1:
        raise SettingsError(f"--max-batch-size: must be >= 1, got {mbs}")
    if base.max_batch_size < 1:
        raise ProfileError(f"{model}: max_batch_size is 0 in its config.pbtxt: the model does not batch, "
                           f"there is no batch size to profile")
    if repeats < 1:
        raise SettingsError(f"--repeats: must be >= 1, got {repeats}")
    if max_length is None:
        max_length = model_max_length(base)
    rows_grid, lengths = row_grid(mbs), length_buckets(traffic, length_column, max_length)
    config = space.apply(base, {space.MAX_BATCH_SIZE: mbs, space.QUEUE_DELAY: 0, space.INSTANCES: 1})
    launcher.apply_config(model, config)
    warm = None
    if settings.measurement.warmup:
        warm = warm_up(launcher, settings, traffic, max_batch_size=mbs, on_window=on_window)
    sender = _Sender(launcher, model, length_column, timeout_s=settings.replay.request_timeout_s)
    samples: list[Sample] = []
    # The total is the most points the profile can take, counted up front (each length's bisection, the
    # incumbent's padded lengths, the batches of separate requests), and only ever lowered as the work
    # turns out smaller: a bar whose total grew would go back.
    per_length = most_points(rows_grid)
    most_padded = len(LENGTH_QUANTILES) if length_column is not None else 0
    instances = int(settings.search.instance_count.high) if settings.search.instance_count else 1
    at_once = concurrent_executions is None and instances > 1
    total = (len(lengths) + most_padded) * per_length + (repeats - 1) + (per_length - 1) + at_once
    done = 0

    def fewer(k: int) -> None:
        nonlocal total
        total -= k

    reported = [total]  # the total the bar last had

    def progress_done(what: str) -> None:
        nonlocal done
        done += 1
        reported[0] = total
        if on_progress is not None:
            on_progress(done, total, what)

    ran: list[tuple[int, int]] = []  # the points that ran, in the order measured: the later rounds' order

    def point(rows: int, length: int) -> bool:
        """Measure one point's first round; True when it ran, False when it ran out of memory."""
        got = [sender.send(rows, length, measured=False)]
        if got[-1].ok:
            got.append(sender.send(rows, length))
        samples.extend(got)
        progress_done(f"{rows} x {length}")
        if _ran(got, model, rows=rows, length=length):
            ran.append((rows, length))
            return True
        return False

    def one_length(length: int) -> None:
        last_ok, points = 0, 0
        for rows in rows_grid:
            points += 1
            if point(rows, length):
                last_ok = rows
                continue
            high = rows  # rows stop growing at this length
            while high - last_ok > 1:  # the smallest failing rows, one row apart
                middle = (high + last_ok) // 2
                points += 1
                if point(middle, length):
                    last_ok = middle
                else:
                    high = middle
            break
        fewer(per_length - points)

    for length in lengths:
        one_length(length)
    padded: tuple[int, ...] = ()
    early_notes: list[str] = []
    if length_column is not None:
        try:  # the lengths the incumbent's batches are padded to, simulated with what is measured so far
            provisional, _ = build_profile(samples, max_length=max_length,
                                           concurrent_executions=concurrent_executions or 1)
            padded = padded_lengths(settings, traffic, base=base, profile=provisional, column=length_column)
        except (SettingsError, ProfileError, TrafficError) as exc:
            early_notes.append(f"the incumbent's padded lengths could not be simulated ({exc}): lengths are the "
                               f"requests' only")
    extra = _not_near(padded, lengths)
    fewer((most_padded - len(extra)) * per_length)
    for length in extra:
        one_length(length)
    # The other repeats in rounds over the whole grid, one request of every point each: a stall of a busy
    # host (seconds) then lifts one sample of many points, which their medians leave out, not every
    # sample of one point.
    for k in range(2, repeats + 1):
        for rows, length in ran:
            got = sender.send(rows, length)
            samples.append(got)
            _ran([got], model, rows=rows, length=length)
        progress_done(f"repeat {k} of {repeats}")
    held_notes = _measure_held(sender, samples, repeats=repeats, count=lambda n: fewer(per_length - 1 - n),
                               on_progress=progress_done)
    concurrency, overlap = None, 0.0
    if at_once:
        try:
            concurrency = _measure_concurrency(launcher, base, sender, samples=samples, instances=instances)
        except (ProfileError, ServerError, ServerSetupError) as exc:  # e.g. k copies do not fit the device
            notes_later = [f"instances at once not measured ({exc}): counted as 1"]
        else:
            notes_later = []
            k, rows, length, alone_ms, together_ms = concurrency
            concurrent_executions = concurrency_of(k, alone_ms, together_ms)
            if concurrent_executions == 1:
                device_ms = statistics.median(s.infer_ms for s in samples if s.ok and s.measured and s.requests == 1
                                              and (s.rows, s.length) == (rows, length))
                overlap = overlap_of(k, device_ms, alone_ms=alone_ms, together_ms=together_ms)
        held_notes.extend(notes_later)
        progress_done(f"{instances} instances at once")
    if on_progress is not None and total != reported[0]:  # lowered after the last point (no separate requests)
        on_progress(done, total, "done")
    profile, notes = build_profile(samples, max_length=max_length, concurrent_executions=concurrent_executions or 1,
                                   device_overlap=overlap, model=model, model_digest=model_digest(settings, base))
    notes.extend(early_notes + held_notes)
    if sender.resent:
        notes.append(f"{sender.resent} request(s) sent again: Triton's statistics did not show their one execution "
                     f"within {STATS_WAIT_S:g} s (a loaded host counts late)"
                     + (f"; {sender.untimed} not timed in {len(SEND_PAUSES_S)} tries" if sender.untimed else ""))
    if warm is not None and not warm.stable:
        notes.insert(0, f"the warm-up did not reach steady state ({warm.reason}): the profile may be of a "
                        f"server still warming up")
    return ProfileRun(profile=profile, samples=tuple(samples), rows=rows_grid, lengths=tuple(sorted(lengths + extra)),
                      max_batch_size=mbs, warmup=warm, seconds=time.monotonic() - started, notes=tuple(notes),
                      padded_lengths=padded, concurrency=concurrency)


def concurrency_of(instances: int, alone_ms: float, together_ms: float) -> int:
    """Executions the device runs at once, from one request alone and `instances` sent together: k x
    alone / together, rounded, between 1 and k (pure)."""
    if not alone_ms > 0 or not together_ms > 0:
        return 1
    return min(max(round(instances * alone_ms / together_ms), 1), instances)


def overlap_of(instances: int, device_ms: float, *, alone_ms: float, together_ms: float) -> float:
    """The share of an execution's device time (`device_ms`, Triton's compute_infer) another one runs
    beside, on a device where they otherwise take turns, from one request alone and `instances` together
    (wall times): each of the k - 1 others adds its exclusive part, together - alone = (k - 1) x device x
    (1 - f), as the simulation has it (the time outside the device, HTTP and Triton's own, overlaps
    either way and cancels). f within 0..MAX_OVERLAP (pure)."""
    if instances < 2 or not device_ms > 0 or not together_ms > 0:
        return 0.0
    f = 1.0 - (together_ms - alone_ms) / ((instances - 1) * device_ms)
    return min(max(f, 0.0), MAX_OVERLAP)


def _measure_concurrency(launcher: Launcher, base: ModelConfig, sender: _Sender, *, samples: list[Sample],
                         instances: int) -> tuple[int, int, int, float, float]:
    """(instances, rows, length, ms alone, ms together): see "Instances at once" in the module docstring."""
    points = _points_slowest_first(samples)
    if not points:
        raise ProfileError("no execution ran")
    _, rows, length = points[0]
    launcher.apply_config(sender.model, space.apply(base, {space.MAX_BATCH_SIZE: rows, space.QUEUE_DELAY: 0,
                                                           space.INSTANCES: instances}))
    rounds: list[float] = []  # every instance runs one per round: new instance processes start cold
    n = CONCURRENCY_SETTLED
    while len(rounds) < CONCURRENCY_WARM_ROUNDS:
        rounds.append(sender.wall(rows, length, instances))
        if len(rounds) >= 2 * n:
            last, before = statistics.mean(rounds[-n:]), statistics.mean(rounds[-2 * n:-n])
            if abs(last - before) <= 0.05 * last:
                break
    alone, together = [], []
    for _ in range(CONCURRENCY_REPEATS):
        alone.append(sender.wall(rows, length, 1))
        together.append(sender.wall(rows, length, instances))
    # medians: on a CPU the k together always share the cores with Triton's and the client's threads, one
    # alone only sometimes, so the fastest of each said fewer at once (1.42-1.60 for encoder_torch's two
    # instances on 2 cores, against 1.47-1.97 by medians; under load they served 1.7-2.1x one)
    return instances, rows, length, statistics.median(alone), statistics.median(together)


def _points_slowest_first(samples: list[Sample]) -> list[tuple[float, int, int]]:
    """(median execution ms, rows, length) of each point measured with one request at a time, the
    slowest first: what the batches of separate requests and the instances at once are timed behind."""
    ms: dict[tuple[int, int], list[float]] = {}
    for s in samples:
        if s.ok and s.measured and s.requests == 1:
            ms.setdefault((s.rows, s.length), []).append(s.execution_ms)
    return sorted(((statistics.median(v), r, n) for (r, n), v in ms.items()), reverse=True)


def _ran(got: list[Sample], model: str, *, rows: int, length: int) -> bool:
    """True when every request of a point ran; False when one ran out of memory; ProfileError for
    any other failure."""
    bad = next((s for s in got if not s.ok), None)
    if bad is None:
        return True
    if bad.out_of_memory:
        return False
    raise ProfileError(f"{model}: a request of {rows} rows x {length} failed with an error that is not an "
                       f"out-of-memory: {bad.error}")


def _measure_held(sender: _Sender, samples: list[Sample], *, repeats: int, count: Callable[[int], None],
                  on_progress: Callable[[str], None]) -> list[str]:
    """Time batches of N separate one-row requests at the shortest measured length (see the module
    docstring), appending their samples; returns notes on the N given up. `count(N's)` first, once."""
    slowest = _points_slowest_first(samples)
    if not slowest:
        count(0)
        return []
    length = min(n for _, _, n in slowest)
    ns = sorted({r for _, r, n in slowest if n == length and r >= 2})
    count(len(ns))
    notes = []
    for n in ns:
        blocker = next(((r, b, t) for t, r, b in slowest if r != n), None)
        got: list[Sample] = []
        if blocker is not None:
            rows_b, length_b, blocker_ms = blocker
            for k in range(repeats + 1):
                sample = None
                for pause in HELD_PAUSES_S[:HELD_TRIES]:
                    time.sleep(pause)
                    sample = sender.send_held(n, length, blocker=(rows_b, length_b, blocker_ms), measured=k > 0)
                    if sample is not None:
                        break
                if sample is None:
                    break
                got.append(sample)
        on_progress(f"{n} requests x {length}")
        measured = sum(s.measured for s in got)
        if measured == 0:
            slow = f"{blocker[2]:.1f} ms" if blocker else "none"
            notes.append(f"{n} separate requests x {length} did not form one batch behind the slowest execution "
                         f"({slow}) in {HELD_TRIES} tries: not timed, the per-request cost is fitted without it")
            continue
        if measured < repeats:  # a loaded machine can start the N sends late: keep what was timed, and say so
            notes.append(f"{n} separate requests x {length}: timed {measured} of {repeats} times (the others did "
                         f"not form one batch in {HELD_TRIES} tries)")
        samples.extend(got)
    return notes


class _Sender:
    """Sends one request alone and reads its execution from Triton's statistics; or holds the instance
    with one request while a batch of separate requests queues behind it. A request's length goes in
    `seq_len`, which the replay gives every variable dim: the inputs the traffic's length column sizes
    (one, or several holding one length) and any other variable one alike."""

    def __init__(self, launcher: Launcher, model: str, length_column: str | None, *, timeout_s: float) -> None:
        self.launcher, self.model, self.column, self.timeout_s = launcher, model, length_column, timeout_s
        self.resent = 0    # requests sent more than once: the statistics did not show their one execution
        self.untimed = 0   # of those, not timed in any try (kept as not measured)

    def send(self, rows: int, length: int, *, measured: bool = True) -> Sample:
        """One request of `rows` x `length` alone. Its timing counts only when the statistics show
        exactly one execution of `rows` between the two reads: on a loaded host Triton can count an
        execution after `STATS_WAIT_S`, which left that sample at 0 ms and put the late count into the
        next one (CI saw a point's p10 at half its sleep). Such a request is sent again after a pause
        (`SEND_PAUSES_S`), and after the last try kept as not measured."""
        from tuner.replay import send_one_by_one  # the replay package loads lazily

        frame = pd.DataFrame({"timestamp": [0.0], "batch_size": [rows]})
        if self.column is not None:
            frame[SEQ_LEN] = [length]
        tries = 0
        for pause in SEND_PAUSES_S:
            tries += 1
            time.sleep(pause)
            before = self.launcher.statistics(self.model)
            sent = send_one_by_one(self.launcher.endpoints.http, self.model, frame, timeout_s=self.timeout_s)
            after = self._after(before)
            deltas = stat_deltas(before, after)
            one = deltas["histogram"] == {rows: 1}  # the rule send_held's tries go by, for one execution
            if sent.errors or one:  # a failed request (out of memory) has no execution to time
                break
        else:
            self.untimed += 1
        self.resent += tries > 1
        parts = _batch_parts(before, after, rows)
        return Sample(rows=rows, length=length, ok=sent.errors == 0, client_ms=sent.seconds * 1e3,
                      input_ms=parts["compute_input"], infer_ms=parts["compute_infer"],
                      output_ms=parts["compute_output"], queue_ms=deltas["queue_ns"] / 1e6 if sent.errors == 0 else 0.0,
                      measured=measured and (one or bool(sent.errors)), error=sent.first_error)

    def send_held(self, n: int, length: int, *, blocker: tuple[int, int, float], measured: bool = True
                  ) -> Sample | None:
        """N one-row requests of `length` sent at once while `blocker` (rows, length, ms) holds the
        instance; their execution, or None unless Triton ran exactly the blocker and one batch of N."""
        from tuner.replay import send_together

        rows_b, length_b, blocker_ms = blocker
        frame = pd.DataFrame({"timestamp": [0.0] * (n + 1), "batch_size": [rows_b] + [1] * n})
        if self.column is not None:
            frame[SEQ_LEN] = [length_b] + [length] * n
        before = self.launcher.statistics(self.model)
        # the blocker first, alone on the idle instance; the N requests while it runs
        lead_s = min(max(blocker_ms * 0.2, 2.0), 20.0) / 1e3
        sent = send_together(self.launcher.endpoints.http, self.model, frame, timeout_s=self.timeout_s,
                             first_alone_s=lead_s)
        after = self._after(before, executions=2)
        deltas = stat_deltas(before, after)
        if sent.errors or deltas["histogram"] != {rows_b: 1, n: 1}:
            return None
        parts = _batch_parts(before, after, n)
        return Sample(rows=n, length=length, ok=True, client_ms=sent.seconds * 1e3, input_ms=parts["compute_input"],
                      infer_ms=parts["compute_infer"], output_ms=parts["compute_output"], measured=measured,
                      requests=n)

    def wall(self, rows: int, length: int, count: int) -> float:
        """ms from sending `count` requests of `rows` x `length` at once until the last answer."""
        from tuner.replay import send_together

        frame = pd.DataFrame({"timestamp": [0.0] * count, "batch_size": [rows] * count})
        if self.column is not None:
            frame[SEQ_LEN] = [length] * count
        sent = send_together(self.launcher.endpoints.http, self.model, frame, timeout_s=self.timeout_s)
        if sent.errors:
            raise ProfileError(f"{self.model}: {count} request(s) of {rows} rows x {length} sent at once to as many "
                               f"instances failed: {sent.first_error}")
        return sent.seconds * 1e3

    def _after(self, before: dict, executions: int = 1) -> dict:
        """The statistics once Triton has counted the executions (it does so just after answering)."""
        deadline = time.monotonic() + STATS_WAIT_S
        while True:
            after = self.launcher.statistics(self.model)
            if stat_deltas(before, after)["execution_count"] >= executions or time.monotonic() >= deadline:
                return after
            time.sleep(0.002)


def _batch_parts(before: dict, after: dict, rows: int) -> dict[str, float]:
    """ms of each execution part at batch size `rows` between two snapshots (0 when none ran)."""

    def of(stats: dict) -> dict[str, int]:
        for item in stats.get("batch_stats", []) or []:
            if int(item.get("batch_size", 0)) == rows:
                return {p: int((item.get(p) or {}).get("ns", 0)) for p in _PARTS}
        return dict.fromkeys(_PARTS, 0)

    b, a = of(before), of(after)
    return {p: (a[p] - b[p]) / 1e6 for p in _PARTS}


# --- printing --------------------------------------------------------------------------------------


def table(run: ProfileRun) -> str:
    """Device time per execution (ms): rows down, padded lengths across; median and p10-p90; OOM where
    the point ran out of memory."""
    profile = run.profile
    by_point = {(p.rows, p.length): p for p in profile.points}
    failed = {(s.rows, s.length) for s in run.samples if s.out_of_memory}
    rows = sorted({r for r, _ in by_point} | {r for r, _ in failed})
    lengths = sorted({n for _, n in by_point} | {n for _, n in failed})
    cells = []
    for r in rows:
        line = {"rows": r}
        for n in lengths:
            p = by_point.get((r, n))
            line[f"len {n}"] = ("OOM" if (r, n) in failed else "" if p is None
                                else f"{p.median_ms:.2f} ({p.p10_ms:.2f}-{p.p90_ms:.2f})")
        cells.append(line)
    return pd.DataFrame(cells).to_string(index=False)


def request_table(run: ProfileRun) -> str:
    """N one-row requests batched vs one request of N rows: the execution's ms (input + infer + output,
    medians) and what each request after the first added; empty when none was timed."""
    extras = request_extras(run.samples)
    if not extras:
        return ""
    return pd.DataFrame([{"N": n, "length": length, "1 request of N rows, ms": f"{one:.2f}",
                          "N requests of 1 row, ms": f"{many:.2f}", "ms per request after the first":
                          f"{(many - one) / (n - 1):.3f}"} for n, length, one, many in extras]).to_string(index=False)


def describe_split(run: ProfileRun) -> list[str]:
    """Lines on the costs around the device time, for people."""
    p = run.profile
    lines = [f"host (Triton's compute_input + compute_output): {p.host_ms_per_row:.3f} ms/row + "
             f"{p.host_ms_per_execution:.3f} ms/execution; overhead outside the instance (HTTP, scheduling): "
             f"{p.overhead_ms:.3f} ms/request",
             f"per request (a batch of N separate requests vs one of N rows): {p.host_ms_per_request:.3f} ms for "
             f"each request after the first"]
    if p.oom_rows:
        lines.append("out of memory from " + ", ".join(f"{r} rows at length {n}" for n, r in p.oom_rows)
                     + f" (a failing execution took {p.oom_ms:.2f} ms)")
    else:
        lines.append("no out-of-memory up to the largest size measured")
    if p.max_length is not None:
        lines.append(f"the model truncates inputs to {p.max_length} tokens")
    if run.concurrency is not None:
        k, rows, length, alone, together = run.concurrency
        lines.append(f"instances at once: {k} requests of {rows} x {length} on {k} instances took {together:.1f} ms, "
                     f"one alone {alone:.1f} ms: {k * alone / together:.2f} executions at once, counted as "
                     f"{p.concurrent_executions}" + (f" with {p.device_overlap:.0%} of each overlapping"
                                                     if p.device_overlap else ""))
    w = run.warmup
    if w is not None:
        lines.append(f"warm-up: {w.seconds:.1f} s, {w.sweep_requests} shape-sweep requests, "
                     + ("steady" if w.stable else "NOT steady"))
    return lines
