"""A soak's findings from its windows (pure), the one analysis of a soak: the trend test and everything
`fit_windows` reads from them, on the soak's own columns, plus the SLA breaks the windows saw.

Time is the server's age: `age_hours`, hours of recorded traffic since the server's last start (a
soak with `--restart-at` starts the clock again at the restart, so the windows after it are young
again). Only valid windows count (the load generator kept its send-lag budget and requests were
due). The projected breach is where a trend reaches its limit: the SLA's latency percentile, and the
capacity (measured at the start, projected by the compute time per request at a fixed batch mix:
see `_windows`) falling below the recorded load. Errors are a trend figure but not projected:
out-of-memory failures begin when the budget falls below a batch the traffic forms, a step rather
than a line. An SLA break the soak saw
(errors or latency) is reported as observed when it persists: the first window whose SLA broke and
the window after it too (or it is the last); a single bad window is a blip, not a breach. The
restart advice is taken from the earlier of the projected and the observed breach.

A generative soak (soak.json's `unit` is `tokens`: a vLLM-served model, see `_tokens`) is read the same
way on its own columns: the trends of TTFT and TPOT, errors, the engine's KV-cache use and preemptions
and the server's memory, the offered tokens per second as the load covariate, the token SLA's TTFT and
TPOT limits projected and observed; no batch limits and no capacity projection (Triton's batcher and
compute time are not an engine's), and a table of what the engine's own statistics did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from tuner import formats
from tuner.llm.engine_metrics import OVERRUN_LIMIT
from tuner.soak.analysis._common import SoakDataError, window_number
from tuner.soak.analysis._fit import SoakAnalysis, fit_windows
from tuner.soak.analysis._plan import MIN_WINDOWS, TIME_AXIS
from tuner.soak.analysis._projection import ABOVE, Crossing, Limit
from tuner.soak.analysis._restart import DAY_S, QuietWindows, RestartAdvice, restart_advice
from tuner.soak.analysis._tokens import (
    LOAD as TOKEN_LOAD,
)
from tuner.soak.analysis._tokens import (
    NOT_MEASURED,
    UNIT,
    broken_figure,
    engine_table,
    is_tokens,
    sla_limits,
    trend_figures,
)
from tuner.soak.analysis._trend import UP
from tuner.soak.analysis._windows import CAPACITY_FIGURE, TREND_FIGURES, latency_column

TIME = "age_hours"
LOAD = "offered_rps"
# the batch limits are read from the last windows: two, because a window of a few minutes holds thousands
# of executions (one quiet window may form no large batch; more would count a size that just stopped)
LAST_WINDOWS = 2


@dataclass(frozen=True, kw_only=True)
class SoakFindings:
    """The analysis of a soak's windows, the observed SLA break and the restart advice."""

    analysis: SoakAnalysis | None
    restart: RestartAdvice | None
    observed: Crossing | None = None
    windows: int = 0               # windows the analysis used
    left_out: int = 0              # finished windows it did not (invalid, or no requests)
    error: str = ""                # why there is no analysis
    notes: tuple[str, ...] = field(default_factory=tuple)
    unit: str = "requests"         # "tokens": a generative soak (a vLLM-served model)
    engine: pd.DataFrame | None = field(default=None, compare=False)  # a generative soak's engine statistics

    @property
    def verdict(self) -> str:
        """The analysis's verdict, or why there is none."""
        return self.analysis.verdict if self.analysis is not None else "not analysed"

    @property
    def restart_from_observed(self) -> bool:
        """True when the restart advice is taken from the observed break (earlier than any projection)."""
        return self.restart is not None and self.observed is not None and self.restart.breach is self.observed

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tables a person reads, by name (the restart advice the final one)."""
        out = dict(self.analysis.tables()) if self.analysis is not None else {}
        batches = self.analysis.batches if self.analysis is not None else None
        if batches is not None:  # its windows numbered as the soak's lines number them, and which it read
            recent = ", ".join(str(window_number(w)) for w in batches.recent_windows)
            named = {}
            for name, table in out.items():
                if name == "batches":
                    name = f"batches (the largest still succeeding as of window(s) {recent}, where the server was oldest)"
                    table = batches.table(label=window_number)
                named[name] = table
            out = named
        if self.engine is not None and not self.engine.empty:
            out["engine (vLLM's own statistics)"] = self.engine
        if self.observed is not None:
            out["observed SLA break"] = self.observed.table()
        if self.restart is not None:
            table = self.restart.table()
            if self.restart_from_observed:  # the advice's table words its breach as projected
                o = self.observed
                table.loc[table["what"] == "projected breach", ["what", "value"]] = [
                    "observed breach", f"{o.figure} > {o.limit:.6g} from {o.hours:.3g} h on ({o.note})"]
            out["restart"] = table
        return out

    def text(self) -> str:
        """Every table as text, under a line saying what the hours are."""
        head = (f"soak findings{' (a vLLM-served model, in tokens)' if self.unit == UNIT else ''}: "
                f"{self.windows} window(s) analysed"
                + (f", {self.left_out} left out (invalid or empty)" if self.left_out else "")
                + f"; verdict: {self.verdict}. Times (h) are {TIME_AXIS} since the server's start.")
        parts = [head]
        if self.error:
            parts.append(f"no analysis: {self.error}")
        for name, table in self.tables().items():
            parts.append(f"{name}\n{_text(table)}")
        if self.analysis is not None and self.analysis.quiet is not None:
            parts.append(f"restart window: {quiet_line(self.analysis.quiet)}")
        parts.extend(f"note: {n}" for n in self.notes)
        return "\n\n".join(parts)

    def as_dict(self) -> dict:
        """The findings as JSON-ready values (findings.json)."""
        base = self.analysis.as_dict() if self.analysis is not None else {"verdict": self.verdict}
        return {
            **base,
            "time_axis": f"{TIME_AXIS} since the server's start ({TIME})",
            "restart": None if self.restart is None else self.restart.as_dict(),
            "observed_breach": None if self.observed is None else self.observed.as_dict(),
            "windows_analysed": self.windows,
            "windows_left_out": self.left_out,
            "error": self.error or None,
            "notes": list(self.notes),
            "unit": self.unit,
            "engine": None if self.engine is None else self.engine.to_dict(orient="records"),
        }


def analyze(windows: pd.DataFrame, executions: pd.DataFrame, meta: dict, *,
            traffic: pd.DataFrame | None = None, margin: float = 0.2) -> SoakFindings:
    """The findings of a soak from its tables and soak.json (`traffic`: the recording, for the
    quiet windows)."""
    tokens = is_tokens(meta)
    unit = UNIT if tokens else "requests"
    if windows.empty:
        return SoakFindings(analysis=None, restart=None, error="no window finished", unit=unit)
    usable = windows[windows["valid"] & (windows["requests"] > 0)] if "valid" in windows else windows
    usable = usable.sort_values("window").reset_index(drop=True)
    left_out = len(windows) - len(usable)
    sla = meta.get("sla") or {}
    notes = []
    if tokens:  # a vLLM-served model: its own figures, the token SLA's limits
        wanted, load, bounds = trend_figures(sla), TOKEN_LOAD, sla_limits(sla)
        notes.append(NOT_MEASURED)
    else:
        latency = latency_column(float(sla.get("percentile", 99)))
        wanted, load = (*TREND_FIGURES, latency), LOAD
        bounds = {latency: float(sla["latency_ms"])} if sla.get("latency_ms") is not None else {}
    figures = [f for f in dict.fromkeys(wanted)
               if f in usable.columns and np.isfinite(pd.to_numeric(usable[f], errors="coerce")).sum() >= MIN_WINDOWS]
    limits = {f: Limit(value, bad=ABOVE) for f, value in bounds.items() if f in figures}
    capacity = meta.get("capacity") or {}
    cap_rps, rate_rps = capacity.get("capacity_rps"), capacity.get("rate_rps")
    if tokens or not (cap_rps and rate_rps and CAPACITY_FIGURE in figures):
        cap_rps = rate_rps = None
        if not tokens:
            notes.append("no capacity at the start: the capacity projection is left out")
    if "quiet" in meta and meta["quiet"] is None:
        traffic = None  # the soak found the recording too short for a restart window: none to search
        notes.append("no restart window: the recording is shorter than the restart")
    quiet = meta.get("quiet") or {}
    engine = None
    if tokens:  # every window that replayed, valid or not: the engine's counts do not need the send lag
        served = windows[pd.to_numeric(windows["requests"], errors="coerce").fillna(0) > 0]
        engine = engine_table(served.sort_values("window").reset_index(drop=True))
    observed = observed_break(usable, sla, window_hours=float(meta.get("window_hours") or 0.0), tokens=tokens)
    try:
        if len(usable) < MIN_WINDOWS:
            raise SoakDataError(f"{len(usable)} usable window(s); the trend test needs at least {MIN_WINDOWS}")
        if not figures:
            raise SoakDataError("no figure was measured in enough windows")
        analysis = fit_windows(
            usable, figures=figures, time=TIME, load=load, limits=limits,
            worse=dict.fromkeys(figures, UP),  # every figure measured is worse when it grows
            compute=CAPACITY_FIGURE, capacity_rps=cap_rps, rate_rps=rate_rps,
            executions=None if tokens or executions.empty else executions, last=LAST_WINDOWS,
            recent=None if tokens else _oldest_windows(executions, usable), traffic=traffic,
            restart_s=float(quiet.get("length_s", 300.0)), period_s=float(quiet.get("period_s", DAY_S)),
            step_s=float(quiet.get("step_s", 1.0)), margin=margin)
    except SoakDataError as exc:
        return SoakFindings(analysis=None, restart=None, observed=observed, windows=len(usable), left_out=left_out,
                            error=str(exc), notes=tuple(notes), unit=unit, engine=engine)
    restart = analysis.restart
    if observed is not None and (analysis.breach is None or observed.hours < analysis.breach.hours):
        restart = restart_advice(observed, analysis.quiet, margin=margin)
        # the advice's words are for a projection: this breach was seen
        restart = replace(restart, reason=restart.reason.replace("is projected to break", "broke").replace(
            "the projected breach", "the observed breach"))
    return SoakFindings(analysis=analysis, restart=restart, observed=observed, windows=len(usable), left_out=left_out,
                        notes=tuple(notes), unit=unit, engine=engine)


def observed_break(windows: pd.DataFrame, sla: dict, *, window_hours: float, tokens: bool = False) -> Crossing | None:
    """The first window from which the SLA stays broken (it and the next), as a crossing at the
    server's age when that window began (0: already broken from a start); None when the SLA held. `tokens`: a generative soak's windows, broken
    by errors, TTFT or TPOT."""
    if "sla_ok" not in windows.columns or windows.empty:
        return None
    broken = ~windows["sla_ok"].to_numpy(dtype=bool)
    for k in np.flatnonzero(broken):
        if k + 1 < len(broken) and not broken[k + 1]:
            continue
        row = windows.iloc[k]
        max_errors = float(sla.get("max_error_rate", 0.0))
        if tokens:
            figure, limit = broken_figure(row, sla)
        elif float(row.get("error_rate", 0.0)) > max_errors:
            figure, limit = "error_rate", max_errors
        else:
            figure, limit = latency_column(float(sla.get("percentile", 99))), float(sla.get("latency_ms", math.nan))
        first = float(windows[figure].iloc[0]) if figure in windows else math.nan
        start = _start_age(row, window_hours=window_hours)
        return Crossing(figure=figure, limit=limit, bad=ABOVE, level=first, hours=start, low_hours=start, high_hours=start, confidence=1.0, already=start == 0.0,
                        note=f"observed: the SLA broke in window {window_number(row['window'])} "
                             f"({float(row[figure]):.4g}) and stayed broken")
    return None


def _start_age(row: pd.Series, *, window_hours: float) -> float:
    """The server's age (hours) when a window began. `age_hours` is the midpoint of the window's
    measured part (after its warm-up), not of the window; `t_hours - age_hours` is the start of the
    window's segment, so the window's `start_hours` less it is its start in age. A table without the
    place columns (not a soak's) is taken as measured over the whole window."""
    if "start_hours" in row.index and "t_hours" in row.index:
        start = float(row["start_hours"]) - (float(row["t_hours"]) - float(row[TIME]))
    else:
        start = float(row[TIME]) - window_hours / 2
    return 0.0 if start < 1e-9 else start  # the first window of a segment: float rounding aside, 0


def _oldest_windows(executions: pd.DataFrame, windows: pd.DataFrame) -> tuple | None:
    """The last LAST_WINDOWS windows with executions of the run that reached the greatest age (the one
    before a restart, on a tie too): the largest batch still succeeding is read where the server was
    oldest, the windows after a restart (young again) would hide it. None: the soak's last windows."""
    if executions.empty or "segment" not in windows.columns or windows.empty:
        return None
    age = windows[TIME].round(9)  # segments of equal length reach equal ages, float rounding aside
    oldest = windows.loc[age.idxmax(), "segment"]
    ran = set(executions["window"].tolist())
    keep = [w for w in windows.loc[windows["segment"] == oldest, "window"].tolist() if w in ran]
    return tuple(sorted(keep)[-LAST_WINDOWS:]) or None


def summary_lines(findings: dict, meta: dict) -> list[str]:
    """One or two lines on a soak's findings (findings.json and soak.json as read), for the audit and
    the nightly summary."""
    plan = meta.get("plan") or {}
    head = (f"last soak ({str(meta.get('started_utc', '?'))[:16]}, "
            + ("vLLM engine, in tokens, " if is_tokens(meta) else "")
            + f"{plan.get('hours', '?')} h of recorded "
            f"traffic at speed {plan.get('speed', '?')}, {findings.get('windows_analysed', 0)} windows"
            + (", interrupted" if meta.get("interrupted") else "") + f"): {findings.get('verdict', '?')}")
    drifting = [t for t in findings.get("trends") or [] if t.get("verdict") == "drift"]
    if drifting:
        head += " in " + ", ".join(f"{t['figure']} {_pct(t.get('relative_per_hour'))}/h" for t in drifting)
    second = []
    breach = findings.get("observed_breach") or findings.get("breach")
    if breach:
        kind = "broke" if findings.get("observed_breach") else "projected to break"
        hours = formats.number(breach.get("hours"), missing="?")
        second.append(f"SLA {kind} after {hours} h ({breach.get('figure')})")
    batches = findings.get("batches") or {}
    if batches.get("smallest_failing") is not None:
        second.append(f"largest batch still succeeding {batches.get('largest_recent')}, "
                      f"{batches.get('smallest_failing')} and up failed")
    engine = {row.get("figure"): row for row in findings.get("engine") or []}
    if engine:
        preempted = (engine.get("preemptions") or {}).get("total")
        kv = (engine.get("kv_cache_usage_peak") or {}).get("largest")
        second.append(f"engine: {formats.number(preempted, missing='?')} preemption(s), KV cache at most "
                      + ("?" if kv is None else f"{100 * float(kv):.0f}%") + " full")
        late = (engine.get("emulated_overrun_share") or {}).get("largest")
        if late is not None and float(late) > OVERRUN_LIMIT:  # the emulated GPU's figures are partly the CPU's
            second.append(f"emulated GPU: up to {100 * float(late):.0f}% of a window's steps ran past their "
                          "emulated time (raise the model's time_scale)")
    restart = findings.get("restart") or {}
    if restart.get("reason"):
        second.append(restart["reason"])
    if findings.get("error"):
        second.append(f"no analysis: {findings['error']}")
    return [head] + (["; ".join(second)] if second else [])


def quiet_line(quiet: QuietWindows) -> str:
    """The daily restart slot in one line (its start also in seconds of the day, for scripts)."""
    day_rps = float(np.mean([w.day_rps for w in quiet.windows])) if quiet.windows else math.nan
    return (f"the recording's quietest {quiet.length_s / 60:g} min of each {quiet.period_s / 3600:.4g} h day "
            f"start {formats.hms(quiet.slot_offset_s)} into the day (at {quiet.slot_offset_s:g} s): "
            f"{quiet.slot_requests / quiet.length_s:.3g} req/s there against {day_rps:.3g} req/s on average "
            f"({quiet.slot_days} day(s))")


def _pct(value) -> str:
    return "?" if value is None else f"{100 * float(value):+.2g}%"


def _text(table: pd.DataFrame) -> str:
    return table.to_string(index=False, float_format=lambda x: f"{x:.4g}")
