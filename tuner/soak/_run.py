"""The soak itself (IO): one configuration on a server, the recorded traffic replayed window after
window, each finished window written at once, and the findings at the end (or at Ctrl-C).

Before the first window the configuration's capacity is measured on the fresh server, as a trial's
is (the recorded load, then the capacity search: `tuner.trial.run.make_measure`): it is the capacity
at 0 h that the compute-time trend projects forward. Each window is one open-loop replay of the
next stretch of the (repeated) recording at the soak's speed, measured after the study's warm-up,
once (a window whose send lag broke its budget is kept and marked invalid, not replayed again: the
soak's clock moves on). With `restart_at_hours`, the server is stopped and started again (the
configuration applied anew) before the first window from that hour on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import psutil
from tqdm import tqdm

from tuner import space
from tuner.errors import ServerError, TunerError
from tuner.measurement import Measurement
from tuner.modelconfig import ModelConfig
from tuner.score import check_sla
from tuner.server import Launcher, make_launcher
from tuner.settings import StudySettings
from tuner.soak import _files
from tuner.soak.analysis import TIME_AXIS, QuietWindows, SoakFindings, SoakPlan, analyze, window_traffic
from tuner.soak.analysis._windows import (  # the window's row: built here, where the window is measured
    EXECUTION_COLUMNS,
    execution_rows,
    fixed_mix,
    latency_column,
    memory_figures,
    size_times,
    split_failures,
    window_columns,
    window_row,
)
from tuner.traffic import mean_rps
from tuner.trial import MEASURED, Hints
from tuner.trial.run import make_measure
from tuner.trial.step import replay_measured
from tuner.trial.warmup import warm_up

GPU_MEMORY_METRIC = "nv_gpu_memory_used_bytes"


@dataclass(frozen=True)
class SoakResult:
    """What a finished (or interrupted) soak leaves: its directory and findings."""

    folder: Path
    findings: SoakFindings
    windows: int
    interrupted: bool = False


def run_soak(settings: StudySettings, config: ModelConfig, plan: SoakPlan, *, traffic: pd.DataFrame,
             output: str | Path, quiet: QuietWindows | None, config_source: str, measure_capacity: bool = True,
             replace: bool = False, margin: float = 0.2, progress: bool = True,
             launcher_factory: Callable[[StudySettings], Launcher] = make_launcher) -> SoakResult:
    """Soak `config` on the study's server for `plan` and write `OUTPUT/soak/` (see `tuner.soak`).
    A KeyboardInterrupt (Ctrl-C, SIGTERM) still writes the findings of the finished windows, then
    goes on up."""
    folder = _files.prepare(output, replace=replace)
    model = settings.model
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    meta = {
        "study": settings.source, "name": settings.name, "model": model, "launcher": settings.server.launcher,
        "traffic": settings.traffic.path, "config_source": config_source,
        "config": space.deployed(config),
        "plan": {"hours": plan.hours, "speed": plan.speed, "window_minutes": plan.window_wall_s / 60,
                 "windows": plan.windows, "cycle_s": plan.cycle_s, "restart_at_hours": plan.restart_at_hours},
        "window_hours": plan.window_s / 3600.0,
        "time_axis": TIME_AXIS,
        "sla": dataclasses.asdict(settings.sla),
        # None: the recording is too short for a restart window (no quiet windows in the findings)
        "quiet": None if quiet is None else {"length_s": quiet.length_s, "period_s": quiet.period_s,
                                             "step_s": quiet.step_s, "slot_offset_s": quiet.slot_offset_s},
        "margin": margin, "started_utc": _now(), "interrupted": False, "capacity": None,
    }
    interrupted, failure = False, None
    try:
        with launcher_factory(settings) as launcher:
            running = launcher.apply_config(model, config)
            mbs = int(running.max_batch_size)
            if measure_capacity:  # measured as a trial is: warmed up first
                meta["capacity"] = _capacity(launcher, settings, traffic, running=running, say=say)
            else:
                meta["warmup"] = _warm(launcher, settings, traffic, mbs=mbs, say=say)
            meta["executions_before_soak"] = _executions(launcher, model)
            _files.write_json(folder / _files.META, meta)
            _windows(launcher, settings, config, plan=plan, traffic=traffic, folder=folder, mbs=mbs, progress=progress)
    except KeyboardInterrupt:
        interrupted = True
        if not (folder / _files.META).exists():
            raise
    except TunerError as exc:  # the server died in the middle: the windows so far are still findings
        if not (folder / _files.META).exists():
            raise
        failure = exc
    meta.update(interrupted=interrupted, failed=str(failure).splitlines()[0] if failure else None,
                finished_utc=_now())
    _files.write_json(folder / _files.META, meta)
    windows = _files.read_windows(folder)
    findings = analyze(windows, _files.read_executions(folder), meta, traffic=traffic, margin=margin)
    _files.write_json(folder / _files.FINDINGS, {"interrupted": interrupted, **findings.as_dict()})
    if interrupted or failure:
        print(f"soak {'interrupted' if interrupted else 'stopped'} after {len(windows)} finished window(s), "
              f"kept in {folder} (findings.json from those)", file=sys.stderr)
    if interrupted:
        raise KeyboardInterrupt
    if failure is not None:
        raise failure
    return SoakResult(folder, findings, len(windows), interrupted)


def _windows(launcher: Launcher, settings: StudySettings, config: ModelConfig, *, plan: SoakPlan,
             traffic: pd.DataFrame, folder: Path, mbs: int, progress: bool) -> None:
    """Replay every window, appending each to windows.csv and executions.csv as it finishes."""
    model, sla = settings.model, settings.sla
    latency = latency_column(sla.percentile)
    warmup = min(settings.replay.warmup_s, plan.window_wall_s / 4)
    columns = window_columns(sla.percentile)
    segment, segment_start_s, restarted = 0, 0.0, False
    reference: dict[int, tuple[int, float]] | None = None  # the first window's batches: the fixed mix
    t0 = time.monotonic()
    print(_header(latency), flush=True)
    with tqdm(total=plan.windows, unit="window", desc="soak", file=sys.stderr, disable=not progress,
              dynamic_ncols=True) as bar:
        for k in range(plan.windows):
            start_s, end_s = plan.bounds(k)
            if plan.restart_before(k):
                bar.set_postfix_str("restarting the server")
                _restart(launcher, model, config)
                _warm(launcher, settings, traffic, mbs=mbs, say=lambda text: None)
                segment, segment_start_s, restarted = segment + 1, start_s, True
            started = _now()
            part = window_traffic(traffic, start_s, end_s, cycle_s=plan.cycle_s)
            measured_from = start_s + warmup * plan.speed
            place = {"window": k, "segment": segment, "restarted": restarted,
                     "t_hours": (measured_from + end_s) / 2 / 3600.0,
                     "age_hours": ((measured_from + end_s) / 2 - segment_start_s) / 3600.0,
                     "start_hours": start_s / 3600.0, "end_hours": end_s / 3600.0, "started_utc": started}
            restarted = False
            if len(part) < 2:  # nothing to replay in this stretch: the clock moves on
                row = {**place, "requests": 0, "valid": False, "sla_ok": True}
                histogram, failed, times = {}, 0, {}
            else:
                m, errors, since_load, times = _replay(launcher, settings, part, speed=plan.speed, warmup=warmup, mbs=mbs)
                histogram = m.batch_histogram
                failed = max(sum(s * c for s, c in histogram.items()) - m.inference_count, 0)
                failures = {s: bad for s, (_, bad) in split_failures(histogram, failed).items() if bad}
                if reference is None and times:
                    reference = {s: t for s, t in times.items() if s not in failures}
                figures = window_row(m, errors, sla_percentile=sla.percentile, sla_ok=check_sla(m, sla).ok,
                                     executions_since_load=since_load, memory=_memory(launcher),
                                     fixed_mix_ms=fixed_mix(reference or {}, times, failures))
                row = {**place, **figures}
            row["wall_s"] = time.monotonic() - t0
            _files.append_rows(folder / _files.WINDOWS, [row], columns)
            _files.append_rows(folder / _files.EXECUTIONS, execution_rows(k, histogram, failed, times=times),
                               EXECUTION_COLUMNS)
            bar.update()
            tqdm.write(_line(row, plan.windows, latency), file=sys.stdout)


def _replay(launcher: Launcher, settings: StudySettings, part: pd.DataFrame, *, speed: float, warmup: float,
            mbs: int) -> tuple[Measurement, pd.Series, int | None, dict[int, tuple[int, float]]]:
    """One window: replay and measure (the measurement step, once); the measured requests' errors,
    Triton's execution count since the load and the compute time per execution of each batch size."""
    m, result = replay_measured(launcher, settings, part, speed=speed, warmup_s=warmup, max_batch_size=mbs)
    measured = result.measured()
    errors = measured.loc[~measured["ok"].astype(bool), "error"].astype(str)
    after = result.stats_after or {}
    since_load = int(after["execution_count"]) if "execution_count" in after else None
    return m, errors, since_load, size_times(result.stats_before, result.stats_after)


def _capacity(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, running: ModelConfig,
              say: Callable[[str], None]) -> dict | None:
    """The configuration's capacity on the fresh server, measured as a trial's (None: not measured)."""
    pct = settings.sla.percentile
    say(f"soak: measuring the capacity of {settings.model} on the fresh server (as a trial is measured)")

    def step(m: Measurement) -> None:
        say(f"  replay at speed {m.speed:.2f}: {m.throughput_rps:.1f} req/s, p{pct:g} {m.latency(pct):.1f} ms, "
            f"errors {m.error_rate:.2%}: {'ok' if check_sla(m, settings.sla).ok else 'over the SLA'}")

    record = make_measure(launcher, settings, traffic, on_measure=step)(
        space.from_config(running, settings.search), Hints())
    rate = mean_rps(traffic) * settings.traffic.speed
    out = {"rate_rps": rate, "load_speed": settings.traffic.speed, "outcome": record.outcome,
           "sla_met_at_load": record.meets_sla, "sla_reason": record.sla_reason or record.note}
    if record.outcome != MEASURED or record.capacity_rps <= 0:
        say(f"soak: no capacity at the start ({out['sla_reason'] or record.outcome}): no capacity projection")
        return {**out, "capacity_rps": None}
    say(f"soak: capacity {record.capacity_rps:.1f} req/s (speed {record.capacity_speed:.2f}) against the "
        f"recorded load's {rate:.1f} req/s (speed {settings.traffic.speed:g})")
    return {**out, "capacity_rps": record.capacity_rps, "capacity_speed": record.capacity_speed,
            "converged": record.capacity.converged if record.capacity else None}


def _warm(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, mbs: int,
          say: Callable[[str], None]) -> dict | None:
    """Warm the freshly loaded model before its windows (as a trial's measurement is): a cold start
    is not drift, and a trend fitted through one reads as one. None when the study turns warm-up off."""
    if not settings.measurement.warmup:
        return None
    warm = warm_up(launcher, settings, traffic, max_batch_size=mbs)
    say(f"soak: warmed up in {warm.seconds:.0f} s" + ("" if warm.stable else f" ({warm.reason})"))
    return dataclasses.asdict(warm)


def _restart(launcher: Launcher, model: str, config: ModelConfig) -> None:
    """Stop the server and start it again with the configuration: its memory and counters start afresh."""
    launcher.stop()
    launcher.start()
    launcher.wait_ready()
    launcher.apply_config(model, config)


def _executions(launcher: Launcher, model: str) -> int | None:
    with contextlib.suppress(ServerError, KeyError, ValueError, TypeError):
        return int(launcher.statistics(model).get("execution_count", 0))
    return None


def _memory(launcher: Launcher) -> dict:
    """The server's memory now: GPU memory used (Triton's metrics) where there is a GPU, and the
    resident memory of the server's process tree where the launcher knows its process."""
    gpu = None
    with contextlib.suppress(ServerError):
        metrics = launcher.metrics()
        if GPU_MEMORY_METRIC in metrics:
            gpu = float(metrics[GPU_MEMORY_METRIC])
    rss = None
    pid = getattr(launcher, "pid", None)
    if pid:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            rss = 0.0
            for proc in (root, *root.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
    return memory_figures(rss_bytes=rss, gpu_bytes=gpu)


_COLUMNS = (("window", 7), ("hours", 13), ("offered/s", 9), ("{latency}", 10), ("errors", 7), ("oom", 5),
            ("compute/req ms", 14), ("fixed mix ms", 12), ("largest ok", 10), ("memory MB", 9))


def _header(latency: str) -> str:
    names = [name.replace("{latency}", latency.replace("latency_", "").replace("_ms", " ms")) for name, _ in _COLUMNS]
    return "  ".join(f"{n:>{w}}" for n, (_, w) in zip(names, _COLUMNS, strict=True)) + \
        f"   (hours: {TIME_AXIS})"


def _line(row: dict, total: int, latency: str) -> str:
    def num(key: str, fmt: str) -> str:
        value = row.get(key)
        try:
            return "-" if value is None or value != value else format(value, fmt)
        except (TypeError, ValueError):
            return "-"

    cells = [f"{row['window'] + 1}/{total}", f"{row['start_hours']:.2f}-{row['end_hours']:.2f}",
             num("offered_rps", ".1f"), num(latency, ".1f"), num("errors", "d"), num("oom_errors", "d"),
             num("compute_ms_per_request", ".3f"), num("compute_ms_fixed_mix", ".3f"), num("largest_ok_batch", ".0f"),
             num("memory_mb", ".0f")]
    text = "  ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, _COLUMNS, strict=True))
    notes = []
    if row.get("restarted"):
        notes.append("after a restart")
    if row.get("requests") and not row.get("valid"):
        notes.append("invalid: send lag over budget")
    if row.get("requests") and not row.get("sla_ok"):
        notes.append("SLA broken")
    return text + (f"   {'; '.join(notes)}" if notes else "")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
