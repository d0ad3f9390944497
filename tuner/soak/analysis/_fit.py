"""The fit of a table of windows, any columns: trends, breaches, batches, restart (the step `analyze`
takes on a soak's own columns; see `_findings`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from tuner.soak.analysis import _projection as projection
from tuner.soak.analysis._batches import BatchLimits, batch_limits
from tuner.soak.analysis._common import SoakDataError
from tuner.soak.analysis._projection import ABOVE, BELOW, CapacityTrend, Crossing, Limit
from tuner.soak.analysis._restart import DAY_S, QuietWindows, RestartAdvice, quiet_windows, restart_advice
from tuner.soak.analysis._trend import DRIFT, NO_DRIFT, Trend, fit_trend

_NOT_FIGURES = ("window",)  # numeric columns that identify a window rather than measure it


@dataclass(frozen=True, kw_only=True)
class SoakAnalysis:
    """Everything read from a soak's windows: each figure's trend, the breaches it projects, the
    capacity over time, the largest batch still succeeding and the restart advice."""

    trends: tuple[Trend, ...]
    crossings: tuple[Crossing, ...]      # every limit a trend reaches, the capacity's included
    breach: Crossing | None              # the earliest of them
    capacity: CapacityTrend | None = None
    batches: BatchLimits | None = None
    quiet: QuietWindows | None = None
    restart: RestartAdvice | None = None
    limits: dict[str, str] = field(default_factory=dict)  # figure -> its limit as read ("> 200")

    @property
    def verdict(self) -> str:
        """`drift` when any figure drifts, else `no drift detected`."""
        return DRIFT if any(t.drifting for t in self.trends) else NO_DRIFT

    def trend(self, figure: str) -> Trend:
        """The trend of one figure."""
        for t in self.trends:
            if t.figure == figure:
                return t
        raise KeyError(f"no trend of {figure!r} (figures: {', '.join(t.figure for t in self.trends)})")

    def table(self) -> pd.DataFrame:
        """One row per figure (and the capacity): level, slope and interval, drift, verdict, breach."""
        by_figure = {c.figure: c for c in self.crossings}
        rows = []
        for t in self.trends:
            rows.append(_with_breach(t.row(), self.limits.get(t.figure, ""), by_figure.get(t.figure)))
        if self.capacity is not None:
            rows.append(_with_breach(_capacity_row(self.capacity), self.limits.get("capacity_rps", ""),
                                     by_figure.get("capacity_rps")))
        return pd.DataFrame(rows)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table a person reads, by name: trends, and batches, quiet windows, restart when known."""
        out = {"trends": self.table()}
        if self.batches is not None:
            out["batches"] = self.batches.table()
        if self.quiet is not None:
            out["quiet windows"] = self.quiet.table()
        if self.restart is not None:
            out["restart"] = self.restart.table()
        return out

    def text(self) -> str:
        """The tables as plain text, one after another under their names."""
        parts = []
        for name, table in self.tables().items():
            body = table.to_string(index=False, float_format=lambda x: f"{x:.4g}")
            parts.append(f"{name}\n{body}")
        return "\n\n".join(parts)

    def as_dict(self) -> dict:
        """The findings as JSON-ready values."""
        return {
            "verdict": self.verdict,
            "trends": [t.as_dict() for t in self.trends],
            "crossings": [c.as_dict() for c in self.crossings],
            "breach": None if self.breach is None else self.breach.as_dict(),
            "capacity": None if self.capacity is None else self.capacity.as_dict(),
            "batches": None if self.batches is None else self.batches.as_dict(),
            "quiet_windows": None if self.quiet is None else self.quiet.as_dict(),
            "restart": None if self.restart is None else self.restart.as_dict(),
        }


def fit_windows(
    windows: pd.DataFrame,
    *,
    figures: Sequence[str] | None = None,
    time: str = "t_hours",
    load: str | None = "offered_rps",
    confidence: float = 0.95,
    min_drift_per_hour: float = 0.01,
    worse: Mapping[str, str] | None = None,
    limits: Mapping[str, float | Limit] | None = None,
    compute: str = "compute_ms_per_request",
    capacity_rps: float | None = None,
    rate_rps: float | None = None,
    executions: pd.DataFrame | Mapping | None = None,
    last: int = 3,
    recent: Sequence | None = None,
    traffic: pd.DataFrame | None = None,
    restart_s: float = 300.0,
    period_s: float = DAY_S,
    step_s: float = 1.0,
    margin: float = 0.2,
    basis: str = "estimate",
) -> SoakAnalysis:
    """The analysis of a table of windows (one row each: `time` in hours since load, `load`, figures).

    Each figure (default: every numeric column but `time`, `load` and `window`) gets a trend with the
    load as covariate when that column exists (`worse`: figure -> UP or DOWN, the direction that is a
    drift; a figure not named drifts either way); each `limits` entry a crossing; with `capacity_rps`
    (measured on a fresh server) and `rate_rps` (the rate to serve, e.g. the recorded peak), the
    `compute` figure's trend gives the capacity trend and when it drops below the rate. `executions`
    (per-window batch histograms) gives the batch limits (the largest still succeeding read from the
    last `last` windows, or the `recent` windows given), `traffic` the quiet windows; with either a
    breach or the traffic, the restart advice. Breach times are in the unit of `time`: for a soak
    replayed faster than recorded, give `time` in hours of traffic so that the restart interval is
    in the recording's days."""
    if not isinstance(windows, pd.DataFrame):
        raise SoakDataError(f"soak windows: expected a table, got {type(windows).__name__}")
    if time not in windows.columns:
        found = ", ".join(map(str, windows.columns)) or "none"
        raise SoakDataError(f"soak windows: no column {time!r} (columns found: {found})")
    covariate = load if load is not None and load in windows.columns else None
    if figures is None:
        skip = {time, load, *_NOT_FIGURES}
        figures = [c for c in windows.columns
                   if c not in skip and pd.api.types.is_numeric_dtype(windows[c])
                   and not pd.api.types.is_bool_dtype(windows[c])]
        if not figures:
            raise SoakDataError(f"soak windows: no numeric figure besides {time!r} and {load!r}")
    trends = []
    for figure in figures:
        t = fit_trend(windows, figure, time=time, load=covariate, confidence=confidence,
                      min_drift_per_hour=min_drift_per_hour, worse=(worse or {}).get(figure))
        if load is not None and covariate is None:
            t = _with_note(t, f"no column {load!r}: fitted without the load")
        trends.append(t)
    by_figure = {t.figure: t for t in trends}

    crossings, labels = [], {}
    for figure, limit in (limits or {}).items():
        if figure not in by_figure:
            raise SoakDataError(f"limit on {figure!r}: no such figure (figures: {', '.join(by_figure)})")
        labels[figure] = _limit_label(by_figure[figure], limit)
        c = projection.crossing_time(by_figure[figure], limit)
        if c is not None:
            crossings.append(c)
    capacity = None
    if (capacity_rps is None) != (rate_rps is None):
        raise SoakDataError("capacity drift needs both capacity_rps and rate_rps, got only "
                            + ("capacity_rps" if capacity_rps is not None else "rate_rps"))
    if capacity_rps is not None:
        if compute not in by_figure:
            raise SoakDataError(f"capacity drift: no trend of {compute!r} (figures: {', '.join(by_figure)})")
        capacity = projection.capacity_trend(by_figure[compute], capacity_rps)
        labels["capacity_rps"] = f"< {float(rate_rps):.6g}"
        c = projection.capacity_crossing(by_figure[compute], capacity_rps=capacity_rps, rate_rps=rate_rps)
        if c is not None:
            crossings.append(c)
    breach = min(crossings, key=lambda c: c.hours) if crossings else None

    batches = batch_limits(executions, last=last, recent=recent) if executions is not None else None
    quiet = (quiet_windows(traffic, length_s=restart_s, period_s=period_s, step_s=step_s)
             if traffic is not None else None)
    restart = (restart_advice(breach, quiet, margin=margin, basis=basis)
               if (quiet is not None or breach is not None) else None)
    return SoakAnalysis(trends=tuple(trends), crossings=tuple(crossings), breach=breach, capacity=capacity,
                        batches=batches, quiet=quiet, restart=restart, limits=labels)


def _with_note(trend: Trend, note: str) -> Trend:
    return replace(trend, notes=(*trend.notes, note))


def _capacity_row(capacity: CapacityTrend) -> dict:
    c = capacity.compute
    cap = capacity.capacity_rps
    return {
        "figure": f"capacity_rps (from {c.figure})",
        "windows": c.windows,
        "level at 0 h": cap,
        "slope per h": cap * capacity.relative_per_hour,
        f"{c.confidence:.0%} CI low": -cap * c.relative_high,
        f"{c.confidence:.0%} CI high": -cap * c.relative_low,
        "drift % per h": 100 * capacity.relative_per_hour,
        "p": c.p_value,
        "verdict": c.verdict,
    }


def _limit_label(trend: Trend, limit: float | Limit) -> str:
    value = float(limit.value if isinstance(limit, Limit) else limit)
    bad = limit.bad if isinstance(limit, Limit) else None
    if bad is None:
        load = limit.load if isinstance(limit, Limit) else None
        bad = ABOVE if trend.level_at(0.0, load) < value else BELOW
    return f"{'>' if bad == ABOVE else '<'} {value:.6g}"


def _with_breach(row: dict, limit: str, crossing: Crossing | None) -> dict:
    nan = float("nan")
    if crossing is None:
        return {**row, "limit": limit, "breach h": nan, "breach low h": nan, "breach high h": nan}
    return {**row, "limit": limit, "breach h": crossing.hours, "breach low h": crossing.low_hours,
            "breach high h": crossing.high_hours}
