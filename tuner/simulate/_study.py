"""A study's trials in simulation: the same steps, SLA check, capacity bisection and scores as the
real search (`tuner.trial.run`), with each replay replaced by a simulated one (pure).

A step at speed `s` simulates what the real step replays: `tuner.traffic.step_window(traffic, s,
warmup_s, step_duration_s)` (the busiest stretch at that speed after a warm-up lead), cut to the
requests due before warm-up + step, and measured like `tuner.measurement.measure` measures a replay:
requests due after the warm-up; latency from the due time over the successful ones; executions,
fill rate and busy time over the executions that end after the warm-up (when the real replay takes
its first statistics snapshot). Busy time is what Triton's `batch_stats` count (each execution's
time on its instance: host work, waiting for the device, device time), as the utilization score
reads it; the device time alone is kept beside it (`device_s`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tuner import space
from tuner.cost import price_for
from tuner.errors import SettingsError, TrafficError, traffic_row
from tuner.measurement import Measurement, assemble, percentile_key
from tuner.settings import CapacitySettings, SlaSettings, StudySettings
from tuner.simulate._batcher import OK, BatcherConfig, BatchRun, Requests, batcher_config, simulate
from tuner.simulate._profile import Profile
from tuner.simulate._support import equal_shapes_of, queue_policy_of
from tuner.traffic import BATCH_SIZE, SEQ_LEN, mean_rps, peak_rps, shape_columns, step_window
from tuner.traffic.io import TIMESTAMP
from tuner.trial import Capacity, Step, TrialRecord, assess, find_capacity, to_attrs

CONFIG_KEYS = space.NAMES


def config_row(config: BatcherConfig, params: dict | None = None) -> dict:
    """A configuration's knob columns in a ranking: the parameters it was given as given (a searched
    preferred-size strategy by its name: the study's parameter, as the model strategy enqueues and
    matches it), the rest as simulated (preferred sizes as a label, `default` or `4,8`)."""
    given = {k: v for k, v in (params or {}).items() if k in space.NAMES and not isinstance(v, tuple)}
    return {**{k.name: space.sizes_text(getattr(config, k.name)) if k.sizes else getattr(config, k.name)
               for k in space.KNOBS}, **given}


# --- traffic -> requests ---------------------------------------------------------------------------


def length_column(traffic: pd.DataFrame) -> str | None:
    """The column that gives each request's sequence length: the `<INPUT>:<k>` column (the first of
    several that hold one length on every row: a BERT's INPUT_IDS:0, ATTENTION_MASK:0 and
    TOKEN_TYPE_IDS:0), else `seq_len`, else none (every request has length 1). Several that differ on
    a row are refused: the simulation charges one length per request."""
    dims = [str(c) for c in shape_columns(traffic) if ":" in str(c)]
    if len(dims) > 1:
        values = traffic[dims].to_numpy()
        differ = (values != values[:, :1]).any(axis=1)
        if differ.any():
            i = int(np.argmax(differ))
            row = ", ".join(f"{c}={traffic[c].iloc[i]}" for c in dims)
            raise TrafficError(f"{traffic_row(traffic, i)}: {len(dims)} input dim columns differ ({row}): "
                               f"the simulation charges one sequence length per request; keep one of them")
    if dims:
        return dims[0]
    return SEQ_LEN if SEQ_LEN in traffic.columns else None


def _requests_at(traffic: pd.DataFrame, speed: float, column: str | None = None) -> Requests:
    """The traffic's requests due at `speed` (seconds from its first request), rows and lengths."""
    ts = traffic[TIMESTAMP].to_numpy(dtype=np.float64)
    due = (ts - ts[0]) / speed if len(ts) else ts
    rows = (traffic[BATCH_SIZE].to_numpy(dtype=np.int64) if BATCH_SIZE in traffic.columns
            else np.ones(len(ts), dtype=np.int64))
    lengths = (traffic[column].to_numpy(dtype=np.int64) if column is not None
               else np.ones(len(ts), dtype=np.int64))
    return Requests(due_s=due, rows=rows, length=lengths)


# --- configurations --------------------------------------------------------------------------------


# --- measuring a simulated replay ------------------------------------------------------------------


def measurement(run: BatchRun, requests: Requests, *, speed: float, warmup_s: float, max_batch_size: int,
                sla_percentile: float = 99.0, end_s: float | None = None) -> Measurement:
    """The simulated replay's figures, defined as `tuner.measurement.measure` defines the real ones;
    `end_s`: where the window ends (the step's end; default: the last due time)."""
    due = requests.due_s
    measured = due >= warmup_s
    good = measured & (run.status == OK)
    counted = run.exec_ok & (run.exec_end_s >= warmup_s)
    sizes, freq = np.unique(run.exec_rows[counted], return_counts=True)
    queue = (run.dispatch_s[good] - due[good]) * 1e3
    return assemble(
        speed=speed, warmup_s=warmup_s, end_s=end_s if end_s is not None else float(due[-1]) if len(due) else 0.0,
        requests=int(measured.sum()),
        latencies_ms=(run.done_s[good] - due[good]) * 1e3,
        last_done_s=float(run.done_s[good].max()) if good.any() else warmup_s,
        send_lag_ms={"p50": 0.0, "p99": 0.0, "max": 0.0},  # a simulated request leaves on time
        executions=int(counted.sum()), inferences=int(run.exec_rows[counted].sum()),
        histogram={int(s): int(c) for s, c in zip(sizes, freq, strict=True)},
        queue_ms_mean=float(queue.mean()) if len(queue) else 0.0,
        busy_s=float((run.exec_end_s[counted] - run.exec_start_s[counted]).sum()),
        max_batch_size=max_batch_size, sla_percentile=sla_percentile,
    )


def _device_seconds(run: BatchRun, warmup_s: float) -> float:
    """Device time of the successful executions that end after the warm-up."""
    counted = run.exec_ok & (run.exec_end_s >= warmup_s)
    return float(run.exec_device_s[counted].sum())


# --- the simulator ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimStep:
    """One simulated step: its schedule, what happened, and the measurement of it."""

    speed: float
    warmup_s: float
    requests: Requests
    run: BatchRun
    measurement: Measurement

    @property
    def device_s(self) -> float:
        """Device seconds of the executions the measurement counts."""
        return _device_seconds(self.run, self.warmup_s)

    @property
    def latency_ms(self) -> np.ndarray:
        """Every request's latency from its due time (NaN where it was refused), warm-up included."""
        return (self.run.done_s - self.requests.due_s) * 1e3


class Simulator:
    """Simulates a study's trials on its traffic with a model profile. Each speed's step schedule is
    cut once and reused by every configuration; device times are memoized by (rows, length)."""

    def __init__(self, traffic: pd.DataFrame, profile: Profile, *, sla: SlaSettings,
                 capacity: CapacitySettings, warmup_s: float, load_speed: float, price_per_hour: float,
                 scoring: str = "capacity", length: str | None = None) -> None:
        if len(traffic) == 0:
            raise TrafficError("traffic: no requests to simulate")
        if not price_per_hour > 0:
            raise SettingsError(f"price per hour must be > 0, got {price_per_hour}")
        if not load_speed > 0:
            raise SettingsError(f"traffic.speed must be > 0, got {load_speed}")
        self.traffic = traffic.reset_index(drop=True)
        self.profile = profile
        self.sla = sla
        self.capacity_settings = capacity
        self.warmup_s = float(warmup_s)
        self.load_speed = float(load_speed)
        self.price_per_hour = float(price_per_hour)
        self.scoring = scoring
        self.length = length if length is not None else length_column(traffic)
        if self.length is not None and self.length not in traffic.columns:
            raise TrafficError(f"traffic: no column {self.length!r} (columns: {', '.join(traffic.columns)})")
        self.rate = mean_rps(self.traffic)
        self.peak_rps = peak_rps(self.traffic, self.load_speed)
        self._schedules: dict[float, tuple[Requests, float, float]] = {}  # speed -> requests, warm-up, end
        self._device: dict = {}

    @classmethod
    def for_study(cls, settings: StudySettings, traffic: pd.DataFrame, profile: Profile, *,
                  price_per_hour: float | None = None, length: str | None = None) -> Simulator:
        """A simulator with the study's SLA, capacity search, warm-up, load and price."""
        price = price_per_hour if price_per_hour is not None else price_for(settings.cost, source=settings.source).price_per_hour
        return cls(traffic, profile, sla=settings.sla, capacity=settings.search.capacity,
                   warmup_s=settings.replay.warmup_s, load_speed=settings.traffic.speed,
                   price_per_hour=price, scoring=settings.scoring, length=length)

    @property
    def speeds(self) -> dict[float, int]:
        """The step speeds simulated so far and the requests each step holds."""
        return {speed: len(schedule[0]) for speed, schedule in sorted(self._schedules.items())}

    def unprofiled_lengths(self) -> str | None:
        """A line when requests of the traffic are longer (as the model computes them: truncated to the
        profile's `max_length`) than the longest length the profile measured: how far beyond, and what
        share of the requests. Executions at those lengths are inferred from shorter ones, times and
        memory limits alike (a profile of one length misses an out-of-memory limit at 512 tokens);
        None when the profile's lengths cover the traffic's."""
        if self.length is None:  # every request has length 1
            return None
        profile = self.profile
        measured = max(profile.length_of(p.length) for p in profile.points)
        raw = self.traffic[self.length].to_numpy(dtype=np.int64)
        lengths = raw if profile.max_length is None else np.minimum(raw, profile.max_length)
        longer = lengths > measured
        if not longer.any():
            return None
        longest = int(lengths.max())
        truncated = profile.max_length is not None and int(raw.max()) > profile.max_length
        return (f"the profile measured lengths up to {measured}; {int(longer.sum())} of the traffic's {len(lengths)} "
                f"requests ({longer.mean():.1%}) are longer, up to {longest} ({longest / measured:.1f}x"
                + (f", the model truncating at {profile.max_length}" if truncated else "")
                + "): executions at those lengths are inferred from shorter ones, times and out-of-memory limits "
                "alike (profile again on this traffic to measure them)")

    # --- one step --------------------------------------------------------------------------------

    def schedule(self, speed: float) -> tuple[Requests, float, float]:
        """What a real step at `speed` replays (`tuner.trial.step.step_windows`): the requests (due from
        the window's first), the warm-up and the window's end in seconds (the step's end, wherever its
        last request is due; a traffic no longer than a step: its own span)."""
        speed = float(speed)
        cached = self._schedules.get(speed)
        if cached is None:
            step_s = self.capacity_settings.step_duration_s
            part, warmup = step_window(self.traffic, speed, self.warmup_s, measured_s=step_s)
            requests = _requests_at(part, speed, self.length)
            end = warmup + step_s
            if part is self.traffic and (not len(requests.due_s) or requests.due_s[-1] < end):
                end = float(requests.due_s[-1]) if len(requests.due_s) else 0.0
            keep = requests.due_s < warmup + step_s
            if not keep.all():
                requests = Requests(requests.due_s[keep], requests.rows[keep], requests.length[keep])
            cached = self._schedules[speed] = (requests, warmup, end)
        return cached

    def run(self, config: BatcherConfig, speed: float) -> SimStep:
        """Simulate the step at `speed` under `config`."""
        requests, warmup, end = self.schedule(speed)
        run = simulate(requests, config, self.profile, device_cache=self._device)
        m = measurement(run, requests, speed=float(speed), warmup_s=warmup, end_s=end,
                        max_batch_size=config.max_batch_size, sla_percentile=self.sla.percentile)
        return SimStep(float(speed), warmup, requests, run, m)

    def step(self, config: BatcherConfig, speed: float) -> Measurement:
        """The measurement of the step at `speed` (what `find_capacity` asks a replay for)."""
        return self.run(config, speed).measurement

    # --- one trial -------------------------------------------------------------------------------

    def capacity(self, config: BatcherConfig, lower: Step | None = None,
                 tolerance: float | None = None) -> Capacity:
        """The capacity bisection of the real search (`tuner.trial.capacity.find_capacity`) on simulated steps."""
        cap = self.capacity_settings
        if tolerance is not None:
            cap = CapacitySettings(tolerance=tolerance, start_speed=cap.start_speed, max_speed=cap.max_speed,
                                   step_duration_s=cap.step_duration_s, max_steps=cap.max_steps)
        return find_capacity(lambda speed: self.step(config, speed), self.sla, cap,
                             start_speed=max(cap.start_speed, self.load_speed), min_speed=self.load_speed,
                             rate=self.rate, lower=lower)

    def trial(self, config: BatcherConfig, *, capacity: bool = True,
              tolerance: float | None = None) -> TrialRecord:
        """A trial as the real search measures it: the step at the recorded load decides feasibility
        and the utilization score; if the SLA holds there, the capacity bisection gives the capacity."""
        return self._trial(config, capacity=capacity, tolerance=tolerance)[0]

    def _trial(self, config: BatcherConfig, *, capacity: bool = True,
               tolerance: float | None = None) -> tuple[TrialRecord, float]:
        load_step = self.run(config, self.load_speed)
        params = {name: getattr(config, name) for name in (space.MAX_BATCH_SIZE, space.QUEUE_DELAY, space.INSTANCES)}
        search = (lambda lower: self.capacity(config, lower=lower, tolerance=tolerance)) if capacity else None
        record = assess(params, load_step.measurement, self.sla, capacity=search, price_per_hour=self.price_per_hour,
                        load_speed=self.load_speed, peak_rps=self.peak_rps, note="simulated")
        return record, load_step.device_s

    def capped_by_traffic(self, table: pd.DataFrame) -> str | None:
        """A line when configurations of a ranking (`rank`'s, with the incumbent's row or not) that met
        the SLA reached the end of what the traffic can show: their capacity search stopped at a speed
        whose step holds no request after its warm-up (`limited_by` "traffic", as the real search
        stops), so their capacity is a floor the traffic sets and their ties are the traffic's, not
        the configurations'; None when none did."""
        if table.empty or "limited_by" not in table:
            return None
        met = table[table["value"] > 0]
        capped = met[met["limited_by"] == "traffic"]
        if capped.empty:
            return None
        # the slowest step with nothing to measure (of this simulator's): every capped search stopped at one
        empty = sorted((s, sched) for s, sched in self._schedules.items() if not (sched[0].due_s >= sched[1]).any())
        where = ""
        if empty:
            speed, (requests, warmup, _) = empty[0]
            lasts = float(requests.due_s[-1]) if len(requests) else 0.0
            where = (f": at speed {speed:g} a step holds no request after its {warmup:g} s warm-up (the traffic "
                     f"lasts {lasts:.3g} s there)")
        figures = sorted(set(capped["capacity_rps"].round(1)))
        shown = (f"each {figures[0]:.1f} req/s" if len(figures) == 1 else
                 f"{figures[0]:.1f}-{figures[-1]:.1f} req/s")
        tags = capped["tag"] if "tag" in capped else pd.Series("", index=capped.index)
        who = [what for what, among in (("the best", capped.index[0] == met.index[0]),
                                        ("the incumbent", tags.str.contains("incumbent").any())) if among]
        return (f"{len(capped)} of the {len(met)} configurations that met the SLA"
                + (f" ({' and '.join(who)} among them)" if who else "")
                + f" reached the end of the traffic{where}, so their capacity ({shown}, the last speed that "
                "passed) is a floor the traffic sets and their ties are the traffic's, not the configurations' "
                "(a traffic of more requests, or a shorter replay.warmup_s, measures further)")

    # --- a whole space ---------------------------------------------------------------------------

    def rank(self, configs: Iterable[BatcherConfig | dict], *, tolerance: float | None = None,
             on_config: Callable[[int, int], None] | None = None, **defaults) -> pd.DataFrame:
        """Every configuration's trial, best first under the study's scoring (then the other score,
        then capacity; those missing the SLA, nearest to it first). `configs`: BatcherConfig or parameter dicts (`batcher_config` keys; `defaults`
        go to `batcher_config`). `on_config(done, total)` reports progress."""
        given = [None if isinstance(c, BatcherConfig) else c for c in configs]
        configs = [c if isinstance(c, BatcherConfig) else batcher_config(c, **defaults) for c in configs]
        pct = percentile_key(self.sla.percentile)  # 100: max
        other = "utilization" if self.scoring == "capacity" else "capacity"
        rows = []
        for done, (config, params) in enumerate(zip(configs, given, strict=True), start=1):
            result, device_s = self._trial(config, tolerance=tolerance)
            a = to_attrs(result)
            rows.append({
                **config_row(config, params),
                "feasible": result.meets_sla,
                "capacity_rps": result.capacity_rps,
                "capacity_speed": result.capacity_speed,
                "latency_p50_ms": a.get("latency_p50_ms"),
                "latency_p95_ms": a.get("latency_p95_ms"),
                "latency_p99_ms": a.get("latency_p99_ms"),
                f"latency_{pct}_ms": a.get(f"latency_{pct}_ms"),
                "error_rate": a.get("error_rate"),
                "fill_rate": a.get("fill_rate"),
                "mean_batch_size": a.get("mean_batch_size"),
                "busy_s": a.get("busy_s"),
                "device_s": device_s,
                "capacity_latency_ms": a.get(f"capacity_latency_{pct}_ms"),
                "capacity_fill_rate": a.get("capacity_fill_rate"),
                "score_capacity": result.scores["capacity"],
                "score_utilization": result.scores["utilization"],
                "value": result.value(self.scoring),
                "violation": result.violation,  # how far the SLA is missed at the load (<= 0: met)
                # why the capacity search stopped: "traffic" where a faster step held no request to measure
                "limited_by": result.capacity.limited_by if result.capacity else "",
                "sla_reason": a.get("sla_reason", ""),
            })
            if on_config is not None:
                on_config(done, len(configs))
        table = pd.DataFrame(rows)
        if table.empty:
            return table
        # the configurations that miss the SLA (value 0) closest to it first: the first is "the closest"
        table = table.sort_values(["value", f"score_{other}", "capacity_rps", "violation"],
                                  ascending=[False, False, False, True], na_position="last",
                                  kind="stable").reset_index(drop=True)
        table.insert(0, "rank", np.arange(1, len(table) + 1))
        return table


# --- a study's space, as the search sees it ----------------------------------------------------------


def study_space(settings: StudySettings, base, *, every_batch_size: bool = True) -> tuple[list[dict], dict]:
    """The configurations of the study's space and the defaults `batcher_config` needs for the knobs
    the study does not tune (the base config's own, and whether it batches only equal shapes:
    `equal_shapes_of`). `every_batch_size`: each integer batch size the
    search can sample (else the grid's points)."""
    search = settings.search
    values = space.grid(search)
    if every_batch_size:  # the batch size and the instance count: every integer, not the grid's points
        for name in (space.MAX_BATCH_SIZE, space.INSTANCES):
            r = getattr(search, name)
            if r is not None:
                values[name] = list(range(r.low, r.high + 1, 1 if r.log else r.step))
    names = list(values)
    configs = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*values.values())]
    strategy = getattr(search, space.PREFERRED)
    defaults = {
        "preferred": strategy if strategy in space.STRATEGIES else "none",  # a searched one: each config's
        "base_preferred": space.value_in(base, space.PREFERRED) or None,
        space.INSTANCES: space.value_in(base, space.INSTANCES),
        space.QUEUE_SIZE: space.value_in(base, space.QUEUE_SIZE),
        "equal_shapes": equal_shapes_of(base),
        "queue_policy": queue_policy_of(base),
    }
    return configs, defaults
