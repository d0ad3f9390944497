"""The soak itself (IO): one configuration on a server, the recorded traffic replayed window after
window, each finished window written at once, and the findings at the end (or at Ctrl-C).

Before the first window the configuration's capacity is measured on the fresh server, as a trial's
is (the recorded load, then the capacity search: `tuner.trial.run.make_measure`): it is the capacity
at 0 h that the compute-time trend projects forward. Each window is one open-loop replay of the
next stretch of the (repeated) recording at the soak's speed, measured after the study's warm-up,
once (a window whose send lag broke its budget is kept and marked invalid, not replayed again: the
soak's clock moves on). With `restart_at_hours`, the server is stopped and started again (the
configuration applied anew) before the first window from that hour on.

A vLLM-served model (`engine`: its engine arguments) is soaked the same way, its engine arguments
written into the served copy's model.json as a trial's are (`Launcher.apply_engine_args`; config.pbtxt
stays the model's): the capacity, when measured, is a generative trial's (streamed, the token SLA);
there is no warm-up (it reads Triton's batch statistics, which an engine batching on its own has not);
each window is streamed and measured in tokens with the engine's own statistics (`_generate`), and
soak.json says `unit: tokens` so that the analysis and the report read the windows as such.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import psutil
from tqdm import tqdm

from tuner import space
from tuner.errors import ServerError, TunerError
from tuner.formats import first_line
from tuner.measurement import Measurement, percentile_key, rows_executed
from tuner.modelconfig import ModelConfig
from tuner.score import check_sla, check_tokens, sla_verdict
from tuner.server import Launcher, make_launcher
from tuner.settings import StudySettings
from tuner.soak import _files, _generate
from tuner.soak.analysis import TIME_AXIS, QuietWindows, SoakFindings, SoakPlan, analyze, window_traffic
from tuner.soak.analysis._common import window_number
from tuner.soak.analysis._tokens import NOT_MEASURED, UNIT, tpot_column, ttft_column
from tuner.soak.analysis._tokens import window_columns as token_columns
from tuner.soak.analysis._windows import (  # the window's row: built here, where the window is measured
    EXECUTION_COLUMNS,
    PLACE_COLUMNS,
    execution_rows,
    fixed_mix,
    latency_column,
    memory_figures,
    size_times,
    split_failures,
    window_columns,
    window_row,
)
from tuner.traffic import TIMESTAMP, mean_rps
from tuner.trial import MEASURED, Hints
from tuner.trial.run import make_measure
from tuner.trial.step import replay_measured
from tuner.trial.warmup import warm_up

GPU_MEMORY_METRIC = "nv_gpu_memory_used_bytes"
# the engine arguments soak.json records as what was soaked (the knobs tuner tunes, and the context)
ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "gpu_memory_utilization",
               "kv_cache_memory_bytes", "max_model_len")
# (title, width, column, format) of the line printed per window; {latency}/{ttft}/{tpot}: the SLA's percentile
Column = tuple[str, int, str, str]


@dataclass(frozen=True)
class SoakResult:
    """What a finished (or interrupted) soak leaves: its directory and findings."""

    folder: Path
    findings: SoakFindings
    windows: int
    interrupted: bool = False


def run_soak(settings: StudySettings, config: ModelConfig, plan: SoakPlan, *, traffic: pd.DataFrame,
             output: str | Path, quiet: QuietWindows | None, config_source: str, engine: dict | None = None,
             measure_capacity: bool = True, replace: bool = False, margin: float = 0.2, progress: bool = True,
             launcher_factory: Callable[[StudySettings], Launcher] | None = None) -> SoakResult:
    """Soak `config` on the study's server for `plan` and write `OUTPUT/soak/` (see `tuner.soak`);
    `engine`: a vLLM-served model's engine arguments (its model.json), soaked with `config` as is.
    A KeyboardInterrupt (Ctrl-C, SIGTERM) still writes the findings of the finished windows, then
    goes on up. `launcher_factory`: the study's server (default: `make_launcher`; a vLLM model is then
    loaded once, with `engine`, not also at start)."""
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
    if engine is not None:  # what the analysis and the report read the windows as
        meta.update(unit=UNIT, engine=dict(engine), config={k: engine.get(k) for k in ENGINE_KEYS if k in engine},
                    sla={**meta["sla"], "latency_ms": None},  # an encoder's limit: a generative study's SLA is in tokens
                    not_measured=NOT_MEASURED, warmup=None)
    interrupted, failure = False, None
    try:
        factory = launcher_factory or functools.partial(make_launcher, load_models=engine is None)
        with factory(settings) as launcher:
            if engine is None:
                running = launcher.apply_config(model, config)
                mbs = int(running.max_batch_size)
                if measure_capacity:  # measured as a trial is: warmed up first
                    meta["capacity"] = _capacity(launcher, settings, traffic, params=space.from_config(
                        running, settings.search), say=say)
                else:
                    meta["warmup"] = _warm(launcher, settings, traffic, mbs=mbs, say=say)
                meta["executions_before_soak"] = _executions(launcher, model)
                kind = _encoder(launcher, settings, config, traffic=traffic, mbs=mbs)
            else:
                launcher.apply_engine_args(model, config, engine)
                if measure_capacity:  # a generative trial's: streamed, the token SLA, no warm-up
                    meta["capacity"] = _capacity(launcher, settings, traffic, say=say, generative=True,
                                                 params={k: engine[k] for k in space.ENGINE_NAMES if k in engine})
                kind = _generative(launcher, settings, config, engine=engine)
            _files.write_json(folder / _files.META, meta)
            _windows(launcher, settings, kind, plan=plan, traffic=traffic, folder=folder, progress=progress)
    except KeyboardInterrupt:
        interrupted = True
        if not (folder / _files.META).exists():
            raise
    except TunerError as exc:  # the server died in the middle: the windows so far are still findings
        if not (folder / _files.META).exists():
            raise
        failure = exc
    meta.update(interrupted=interrupted, failed=first_line(failure) if failure else None,
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


@dataclass(frozen=True)
class _Kind:
    """How one kind of model is soaked: each window measured, the server restarted, the row printed."""

    # (part, speed, warm-up, *, duration_s: the window's wall length, where its measured part ends) -> figures, executions
    measure: Callable[..., tuple[dict, list[dict]]]
    restart: Callable[[], None]
    columns: list[str]                 # windows.csv
    printed: tuple[Column, ...]        # the line per window
    executions: bool = True            # executions.csv is written


def _encoder(launcher: Launcher, settings: StudySettings, config: ModelConfig, *, traffic: pd.DataFrame,
             mbs: int) -> _Kind:
    """An encoder's soak: Triton's batcher measured in requests, its batches and compute time."""
    model, sla = settings.model, settings.sla
    reference: dict[int, tuple[int, float]] | None = None  # the first window's batches: the fixed mix

    def measure(part: pd.DataFrame, speed: float, warmup: float, *, duration_s: float) -> tuple[dict, list[dict]]:
        nonlocal reference
        m, errors, since_load, times = _replay(launcher, settings, part, speed=speed, warmup=warmup, mbs=mbs,
                                               duration_s=duration_s)
        histogram = m.batch_histogram
        failed = max(rows_executed(histogram) - m.inference_count, 0)
        failures = {s: bad for s, (_, bad) in split_failures(histogram, failed).items() if bad}
        if reference is None and times:
            reference = {s: t for s, t in times.items() if s not in failures}
        figures = window_row(m, errors, sla_percentile=sla.percentile, sla_ok=check_sla(m, sla).ok,
                             executions_since_load=since_load, memory=_memory(launcher),
                             fixed_mix_ms=fixed_mix(reference or {}, times, failures))
        return figures, execution_rows(-1, histogram, failed, times=times)  # the loop numbers the window

    def restart() -> None:
        _restart(launcher, lambda: launcher.apply_config(model, config))
        _warm(launcher, settings, traffic, mbs=mbs, say=lambda text: None)

    return _Kind(measure, restart, window_columns(sla.percentile), _ENCODER_LINE)


def _generative(launcher: Launcher, settings: StudySettings, config: ModelConfig, *, engine: dict) -> _Kind:
    """A vLLM-served model's soak: each window streamed and measured in tokens, the engine's statistics."""
    model = settings.model

    def measure(part: pd.DataFrame, speed: float, warmup: float, *, duration_s: float) -> tuple[dict, list[dict]]:
        return _generate.measure_window(launcher, settings, part, speed=speed, warmup_s=warmup, duration_s=duration_s,
                                        memory=lambda: _memory(launcher)), []

    def restart() -> None:  # no warm-up: the engine starts with the window's load, as a trial's does
        _restart(launcher, lambda: launcher.apply_engine_args(model, config, engine))

    return _Kind(measure, restart, token_columns(settings.sla.percentile, PLACE_COLUMNS,
                                                 memory_figures(rss_bytes=None, gpu_bytes=None)),
                 _TOKEN_LINE, executions=False)


def _windows(launcher: Launcher, settings: StudySettings, kind: _Kind, *, plan: SoakPlan, traffic: pd.DataFrame,
             folder: Path, progress: bool) -> None:
    """Replay every window, appending each to windows.csv (and executions.csv) as it finishes."""
    warmup = min(settings.replay.warmup_s, plan.window_wall_s / 4)
    pct = settings.sla.percentile
    t0 = time.monotonic()
    print(_header(kind.printed, pct), flush=True)
    with tqdm(total=plan.windows, unit="window", desc="soak", file=sys.stderr, disable=not progress,
              dynamic_ncols=True) as bar:
        for k in range(plan.windows):
            if plan.restart_before(k):
                bar.set_postfix_str("restarting the server")
                kind.restart()
            place = {**plan.place(k, warmup_wall_s=warmup), "started_utc": _now()}
            part = window_traffic(traffic, *plan.bounds(k), cycle_s=plan.cycle_s)
            if len(part) < 2:  # nothing to replay in this stretch: the clock moves on
                row, executions = {**place, "requests": 0, "valid": False, "sla_ok": True}, []
            else:
                # the window lasts its stretch of the traffic, from its first request (where a replay's
                # schedule starts) to the stretch's end, wherever its last request is due
                end = plan.bounds(k)[1]
                figures, executions = kind.measure(part, plan.speed, warmup,
                                                   duration_s=(end - float(part[TIMESTAMP].min())) / plan.speed)
                row = {**place, **figures}
            row["wall_s"] = time.monotonic() - t0
            _files.append_rows(folder / _files.WINDOWS, [row], kind.columns)
            if kind.executions:
                _files.append_rows(folder / _files.EXECUTIONS, [{**e, "window": k} for e in executions],
                                   EXECUTION_COLUMNS)
            bar.update()
            tqdm.write(_line(row, plan.windows, kind.printed, percentile=pct), file=sys.stdout)


def _replay(launcher: Launcher, settings: StudySettings, part: pd.DataFrame, *, speed: float, warmup: float,
            mbs: int, duration_s: float | None = None) -> tuple[Measurement, pd.Series, int | None, dict[int, tuple[int, float]]]:
    """One window: replay and measure (the measurement step, once; `duration_s`: where its window ends);
    the measured requests' errors, Triton's execution count since the load and the compute time per
    execution of each batch size."""
    m, result = replay_measured(launcher, settings, part, speed=speed, warmup_s=warmup, max_batch_size=mbs,
                                duration_s=duration_s)
    measured = result.measured()
    errors = measured.loc[~measured["ok"].astype(bool), "error"].astype(str)
    after = result.stats_after or {}
    since_load = int(after["execution_count"]) if "execution_count" in after else None
    return m, errors, since_load, size_times(result.stats_before, result.stats_after)


def _capacity(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, params: space.Params,
              say: Callable[[str], None], generative: bool = False) -> dict | None:
    """The configuration's capacity on the fresh server, measured as a trial's (`params`: its knobs'
    values; `generative`: a vLLM-served model's trial, streamed and held to the token SLA)."""
    pct, sla = settings.sla.percentile, settings.sla
    say(f"soak: measuring the capacity of {settings.model} on the fresh server (as a trial is measured)")

    def step(m) -> None:
        if generative:
            check = check_tokens(m, sla)
            figure = f"TTFT {percentile_key(pct)} {m.ttft(pct):.1f} ms, TPOT {percentile_key(pct)} {m.tpot(pct):.1f} ms"
        else:
            check = check_sla(m, sla)
            figure = f"{percentile_key(pct)} {m.latency(pct):.1f} ms"
        say(f"  replay at speed {m.speed:.2f}: {m.throughput_rps:.1f} req/s, {figure}, "
            f"errors {m.error_rate:.2%}: {sla_verdict(check)}")

    record = make_measure(launcher, settings, traffic, on_measure=step, generative=generative)(params, Hints())
    rate = mean_rps(traffic) * settings.traffic.speed
    out = {"rate_rps": rate, "load_speed": settings.traffic.speed, "outcome": record.outcome,
           "sla_met_at_load": record.meets_sla, "sla_reason": record.sla_reason or record.note}
    if record.outcome != MEASURED or record.capacity_rps <= 0:
        say(f"soak: no capacity at the start ({out['sla_reason'] or record.outcome})"
            + ("" if generative else ": no capacity projection"))
        return {**out, "capacity_rps": None}
    at_capacity = record.capacity.at_capacity if record.capacity else None
    tokens = at_capacity.output_tokens_per_s if at_capacity is not None else None
    say(f"soak: capacity {record.capacity_rps:.1f} req/s (speed {record.capacity_speed:.2f})"
        + (f", {tokens:.0f} output tokens/s" if tokens is not None else "")
        + f" against the recorded load's {rate:.1f} req/s (speed {settings.traffic.speed:g})")
    return {**out, "capacity_rps": record.capacity_rps, "capacity_speed": record.capacity_speed,
            "converged": record.capacity.converged if record.capacity else None,
            **({"output_tokens_per_s": tokens} if tokens is not None else {})}


def _warm(launcher: Launcher, settings: StudySettings, traffic: pd.DataFrame, *, mbs: int,
          say: Callable[[str], None]) -> dict | None:
    """Warm the freshly loaded model before its windows (as a trial's measurement is): a cold start
    is not drift, and a trend fitted through one reads as one. None when the study turns warm-up off."""
    if not settings.measurement.warmup:
        return None
    warm = warm_up(launcher, settings, traffic, max_batch_size=mbs)
    say(f"soak: warmed up in {warm.seconds:.0f} s" + ("" if warm.stable else f" ({warm.reason})"))
    return dataclasses.asdict(warm)


def _restart(launcher: Launcher, apply: Callable[[], object]) -> None:
    """Stop the server and start it again, the configuration applied anew (`apply`): its memory and
    counters start afresh."""
    launcher.stop()
    launcher.start()
    launcher.wait_ready()
    apply()


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


_ENCODER_LINE: tuple[Column, ...] = (
    ("offered/s", 9, "offered_rps", ".1f"), ("{latency}", 10, "{latency}", ".1f"), ("errors", 7, "errors", "d"),
    ("oom", 5, "oom_errors", "d"), ("compute/req ms", 14, "compute_ms_per_request", ".3f"),
    ("fixed mix ms", 12, "compute_ms_fixed_mix", ".3f"), ("largest ok", 10, "largest_ok_batch", ".0f"),
    ("memory MB", 9, "memory_mb", ".0f"))
_TOKEN_LINE: tuple[Column, ...] = (
    ("offered/s", 9, "offered_rps", ".2f"), ("TTFT {ttft}", 13, "{ttft}", ".1f"), ("TPOT {tpot}", 13, "{tpot}", ".1f"),
    ("out tok/s", 9, "output_tokens_per_s", ".1f"), ("errors", 7, "errors", "d"), ("preempt", 7, "preemptions", ".0f"),
    ("KV peak", 7, "kv_cache_usage_peak", ".1%"), ("waiting", 7, "waiting_peak", ".0f"),
    ("memory MB", 9, "memory_mb", ".0f"))
_PLACE_LINE = (("window", 7), ("hours", 13))


def _columns_at(text: str, percentile: float) -> str:
    """A column name or title with the SLA's percentile's columns filled in."""
    latency, ttft, tpot = latency_column(percentile), ttft_column(percentile), tpot_column(percentile)
    return text.replace("{latency}", latency).replace("{ttft}", ttft).replace("{tpot}", tpot)


def _title(text: str, percentile: float) -> str:
    named = _columns_at(text, percentile)
    return named.replace("latency_", "").replace("ttft_", "").replace("tpot_", "").replace("_ms", " ms")


def _header(printed: tuple[Column, ...], percentile: float) -> str:
    cells = [f"{n:>{w}}" for n, w in _PLACE_LINE]
    cells += [f"{_title(title, percentile):>{w}}" for title, w, _, _ in printed]
    return "  ".join(cells) + f"   (hours: {TIME_AXIS})"


def _line(row: dict, total: int, printed: tuple[Column, ...], *, percentile: float) -> str:
    def num(key: str, fmt: str) -> str:
        value = row.get(_columns_at(key, percentile))
        try:
            return "-" if value is None or value != value else format(value, fmt)
        except (TypeError, ValueError):
            return "-"

    cells = [f"{window_number(row['window'])}/{total}", f"{row['start_hours']:.2f}-{row['end_hours']:.2f}"]
    cells += [num(key, fmt) for _, _, key, fmt in printed]
    widths = [w for _, w in _PLACE_LINE] + [w for _, w, _, _ in printed]
    text = "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
    notes = []
    if row.get("restarted"):
        notes.append("after a restart")
    if row.get("requests") and not row.get("valid"):
        notes.append("invalid: send lag over budget")
    if row.get("requests") and not row.get("sla_ok"):
        notes.append("SLA broken" + (f" ({row['sla_reason']})" if row.get("sla_reason") else ""))
    return text + (f"   {'; '.join(notes)}" if notes else "")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
