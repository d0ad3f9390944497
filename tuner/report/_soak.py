"""The soak's page: `OUTPUT/soak/report.html`, the figures of every window over the soak's hours with
the fitted trends, the capacity projection to the breach, and the findings as tables. Self-contained
(plotly.js inlined), like the study's report. Rendered from the soak directory alone, so an
interrupted soak (its finished windows) renders as well as a finished one."""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.errors import TunerError
from tuner.files import write_atomic
from tuner.formats import first_line
from tuner.report._html import write_report
from tuner.soak import (
    TIME_AXIS,
    SoakFindings,
    analyze,
    has_soak,
    is_tokens,
    latency_column,
    quiet_line,
    read_executions,
    read_meta,
    read_windows,
    soak_dir,
    tpot_column,
    ttft_column,
)
from tuner.traffic import read_traffic

REPORT = "report.html"
SLA_COLOR, TREND_COLOR, RESTART_COLOR = "#d62728", "#ff7f0e", "#7f7f7f"
CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.verdict { font-size: 1.15em; font-weight: 600; padding: .6em .8em; border-left: 5px solid #888; }
.drift { background: #fff3e6; border-color: #ff7f0e; } .none { background: #eef7ee; border-color: #2ca02c; }
.facts, .notes { color: #555; font-size: .9em; } table { border-collapse: collapse; font-size: .85em; }
td, th { padding: .25em .6em; border-bottom: 1px solid #eee; text-align: right; }
"""


@dataclass
class SoakView:
    """A soak directory, read once: what was soaked, its windows and the findings recomputed from them."""

    folder: Path
    meta: dict
    windows: pd.DataFrame
    executions: pd.DataFrame
    findings: SoakFindings
    notes: list[str] = field(default_factory=list)

    @property
    def latency(self) -> str:
        """The windows.csv column of the latency at the soak's SLA percentile."""
        return latency_column(float((self.meta.get("sla") or {}).get("percentile", 99)))


def load_soak(output_dir: str | Path) -> SoakView:
    """The soak of an output directory (OUTPUT/soak/), with its findings recomputed from the windows
    (the recording read again for the quiet windows, when it is still there)."""
    folder = soak_dir(output_dir)
    meta = read_meta(folder)
    windows, executions = read_windows(folder), read_executions(folder)
    notes = []
    traffic = None
    path = meta.get("traffic")
    if path:
        try:
            traffic = read_traffic(path)
        except (TunerError, OSError) as exc:
            notes.append(f"the recording {path} could not be read again ({first_line(exc)}): "
                         "no quiet windows")
    findings = analyze(windows, executions, meta, traffic=traffic, margin=float(meta.get("margin", 0.2)))
    if meta.get("interrupted"):
        notes.append(f"the soak was interrupted: {len(windows)} of {(meta.get('plan') or {}).get('windows', '?')} "
                     "windows finished")
    if meta.get("failed"):
        notes.append(f"the soak stopped early: {meta['failed']}")
    notes.extend(findings.notes)
    return SoakView(folder, meta, windows, executions, findings, notes)


def timeseries(view: SoakView) -> go.Figure | None:
    """Every window's figures over the soak's hours, with the fitted trends and the restarts."""
    w = view.windows
    if w.empty:
        view.notes.append("no window finished: nothing to plot")
        return None
    x = w["t_hours"]
    sla = view.meta.get("sla") or {}
    panels, limits = _panels(view)
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.03,
                        subplot_titles=[title for title, _ in panels])
    trends = {t.figure: t for t in view.findings.analysis.trends} if view.findings.analysis else {}
    for row, (_, series) in enumerate(panels, 1):
        for column, name in series:
            if column not in w or not np.isfinite(pd.to_numeric(w[column], errors="coerce")).any():
                continue
            fig.add_trace(go.Scatter(x=x, y=w[column], mode="lines+markers", name=name, legendgroup=str(row),
                                     marker={"size": 5}), row=row, col=1)
            trend = trends.get(column)
            if trend is not None:
                fitted = trend.level_at(w["age_hours"].to_numpy(dtype=float))
                if trend.load_slope is not None and trend.load_ref is not None:
                    fitted = fitted + trend.load_slope * (w["offered_rps"].to_numpy(dtype=float) - trend.load_ref)
                fig.add_trace(go.Scatter(
                    x=x, y=fitted, mode="lines", legendgroup=str(row),
                    name=f"{name}: fit ({trend.verdict}, {100 * trend.relative_per_hour:+.2g} %/h)"
                    if math.isfinite(trend.relative_per_hour) else f"{name}: fit ({trend.verdict})",
                    line={"color": TREND_COLOR, "dash": "dash" if not trend.drifting else "solid"}), row=row, col=1)
    if sla.get("max_error_rate") is not None:
        limits["error_rate"] = float(sla["max_error_rate"])
    for row, (_, series) in enumerate(panels, 1):  # each SLA limit on the panel of its figure
        for column, _name in series:
            if column in limits:
                said = {} if column == "error_rate" else {"annotation_text": "SLA", "annotation_position": "top left"}
                fig.add_hline(y=limits[column], line_dash="dot", line_color=SLA_COLOR, row=row, col=1, **said)
    for hours in w.loc[w["restarted"], "start_hours"] if "restarted" in w else []:
        fig.add_vline(x=float(hours), line_dash="dash", line_color=RESTART_COLOR,
                      annotation_text="restart", annotation_position="top right")
    fig.update_xaxes(title_text=f"{TIME_AXIS} since the soak's start", row=len(panels), col=1)
    fig.update_layout(template="plotly_white", height=230 * len(panels), margin={"l": 60, "r": 20, "t": 50, "b": 50},
                      title="Every window of the soak (orange: the fitted trend at each window's load)")
    return fig


def _panels(view: SoakView) -> tuple[list[tuple[str, list[tuple[str, str]]]], dict[str, float]]:
    """The page's panels (title, [(windows.csv column, name)]) for what was soaked, and the SLA's latency
    limits by column. A generative soak's windows hold tokens, TTFT/TPOT and vLLM's own gauges (KV cache,
    running and waiting sequences, preemptions), not Triton's batches (the engine batches)."""
    w, sla = view.windows, view.meta.get("sla") or {}
    pct = float(sla.get("percentile", 99))
    memory = ("server memory (MB)", [("memory_mb", _memory_label(w))])
    errors = ("errors (fraction of requests)", [("error_rate", "errors"), ("oom_error_rate", "out of memory")])
    if is_tokens(view.meta):
        ttft, tpot = ttft_column(pct), tpot_column(pct)
        limits = {c: float(sla[k]) for c, k in ((ttft, "ttft_ms"), (tpot, "tpot_ms")) if sla.get(k) is not None}
        # offered as the load is counted (prompt + output tokens due), served the same way, and its output
        return [("offered and served (tokens/s)", [("offered_tokens_per_s", "offered, prompt + output"),
                                                   ("total_tokens_per_s", "served, prompt + output"),
                                                   ("output_tokens_per_s", "served, output")]),
                ("time to first token (ms, from the due time)", [("ttft_p50_ms", "p50"), (ttft, ttft[5:-3])]),
                ("time per output token (ms)", [("tpot_p50_ms", "p50"), (tpot, tpot[5:-3])]),
                errors,
                ("vLLM KV cache (1 = full)", [("kv_cache_usage_peak", "peak"), ("kv_cache_usage_mean", "mean")]),
                ("vLLM sequences", [("running_mean", "running, mean"), ("running_peak", "running, peak"),
                                    ("waiting_mean", "waiting, mean"), ("waiting_peak", "waiting, peak")]),
                ("preemptions per finished request", [("preemptions_per_request", "preemptions")]),
                memory], limits
    limits = {view.latency: float(sla["latency_ms"])} if sla.get("latency_ms") is not None else {}
    return [("offered and served (req/s)", [("offered_rps", "offered"), ("throughput_rps", "served")]),
            ("latency (ms, from the due time)", [("latency_p50_ms", "p50"), (view.latency, view.latency[8:-3])]),
            ("Triton compute (ms)", [("compute_ms_per_request", "per request"),
                                     ("compute_ms_fixed_mix", "per request, first window's batch mix"),
                                     ("compute_ms_per_execution", "per execution")]),
            errors,
            ("batch (rows)", [("largest_batch", "largest executed"), ("largest_ok_batch", "largest succeeding"),
                              ("mean_batch_size", "mean")]),
            memory], limits


def capacity_projection(view: SoakView) -> go.Figure | None:
    """The capacity over the server's age as the compute-time trend projects it, the load to serve,
    and the projected breach with its interval."""
    a = view.findings.analysis
    cap = (view.meta.get("capacity") or {})
    if a is None or a.capacity is None or not cap.get("rate_rps"):
        view.notes.append("no capacity projection (no capacity measured at the start, or no analysis)")
        return None
    rate = float(cap["rate_rps"])
    crossing = next((c for c in a.crossings if c.figure == "capacity_rps"), None)
    soaked = float(view.windows["age_hours"].max()) if not view.windows.empty else 1.0
    end = max(soaked, 1.3 * crossing.hours if crossing is not None and math.isfinite(crossing.hours) else 0.0)
    hours = np.linspace(0.0, end, 200)
    fig = go.Figure([
        go.Scatter(x=hours, y=a.capacity.at(hours), mode="lines", name="capacity (projected from compute time)",
                   line={"color": TREND_COLOR}),
        go.Scatter(x=[0.0], y=[a.capacity.capacity_rps], mode="markers", name="capacity measured at the start",
                   marker={"size": 12, "symbol": "diamond"}),
    ])
    fig.add_hline(y=rate, line_dash="dot", line_color=SLA_COLOR, annotation_text="the recorded load",
                  annotation_position="bottom left")
    fig.add_vrect(x0=0, x1=soaked, fillcolor="rgba(31,119,180,0.06)", line_width=0,
                  annotation_text="soaked", annotation_position="top left")
    if crossing is not None:
        high = crossing.high_hours if math.isfinite(crossing.high_hours) else end
        fig.add_vrect(x0=crossing.low_hours, x1=min(high, end), fillcolor="rgba(214,39,40,0.08)", line_width=0)
        fig.add_vline(x=crossing.hours, line_color=SLA_COLOR,
                      annotation_text=f"breach {crossing.hours:.3g} h", annotation_position="top right")
    fig.update_layout(template="plotly_white", height=420, margin={"l": 60, "r": 20, "t": 50, "b": 50},
                      title="Capacity over the server's age, against the recorded load",
                      xaxis_title=f"{TIME_AXIS} since the server's start", yaxis_title="requests/s")
    return fig


def verdict_line(view: SoakView) -> str:
    """One line: the verdict, the breach and the advice."""
    f = view.findings
    parts = [f"Verdict: {f.verdict}"]
    a = f.analysis
    drifting = [t for t in a.trends if t.drifting] if a else []
    if drifting:
        parts.append("drifting: " + ", ".join(f"{t.figure} {100 * t.relative_per_hour:+.2g} %/h"
                                              if math.isfinite(t.relative_per_hour) else t.figure for t in drifting))
    if f.observed is not None:
        parts.append(f"SLA broke after {f.observed.hours:.3g} h ({f.observed.figure})")
    elif a is not None and a.breach is not None:
        parts.append(f"SLA projected to break after {a.breach.hours:.3g} h ({a.breach.figure})")
    if f.restart is not None and f.restart.reason:
        parts.append(f.restart.reason)
    if f.error:
        parts.append(f"no analysis: {f.error}")
    return " — ".join(parts) + "."


def render_soak(view: SoakView) -> str:
    """The soak's page as one HTML document."""
    meta, plan = view.meta, view.meta.get("plan") or {}
    config = ", ".join(f"{k}={v}" for k, v in (meta.get("config") or {}).items() if v not in ([], None, 0))
    facts = (f"model {meta.get('model')} ({config}) from {meta.get('config_source')} · {plan.get('hours')} "
             f"{TIME_AXIS} at speed {plan.get('speed')} in {plan.get('windows')} windows of "
             f"{plan.get('window_minutes')} min · started {meta.get('started_utc')} · "
             f"{len(view.windows)} window(s) finished")
    cap = meta.get("capacity") or {}
    if cap.get("capacity_rps"):
        facts += (f" · capacity at the start {cap['capacity_rps']:.1f} req/s against the recorded load's "
                  f"{cap['rate_rps']:.1f} req/s")
    parts, plotlyjs = [], True
    for title, build in (("Every window", timeseries), ("Capacity projection", capacity_projection)):
        fig = build(view)
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if fig is None:
            parts.append("<p class='notes'>Not available (see the notes at the end).</p>")
            continue
        parts.append(fig.to_html(full_html=False, include_plotlyjs=plotlyjs, config={"displaylogo": False}))
        plotlyjs = False
    for name, table in view.findings.tables().items():
        parts.append(f"<h2>{html.escape(name[:1].upper() + name[1:])}</h2>"
                     + table.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.4g}"))
    if view.findings.analysis is not None and view.findings.analysis.quiet is not None:
        parts.append(f"<p class='facts'>Restart window: {html.escape(quiet_line(view.findings.analysis.quiet))}</p>")
    css_class = "drift" if view.findings.verdict == "drift" else "none"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in dict.fromkeys(view.notes))
    name = meta.get("name") or view.folder.parent.name
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tuner soak: {html.escape(str(name))}</title>
<style>{CSS}</style></head><body>
<h1>tuner soak: {html.escape(str(name))}</h1>
<p class="verdict {css_class}" id="verdict">{html.escape(verdict_line(view))}</p>
<p class="facts">{html.escape(facts)}. Hours are {TIME_AXIS}: the replay compresses them by its speed.</p>
{''.join(parts)}
<h2>Notes</h2><ul class="notes">{notes or '<li>none</li>'}</ul>
<p class="notes">Written by tuner {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from {html.escape(str(view.folder))}.</p>
</body></html>
"""


def write_soak_report(output_dir: str | Path) -> Path:
    """Write `OUTPUT/soak/report.html` and return its path."""
    view = load_soak(output_dir)
    return write_atomic(view.folder / REPORT, render_soak(view))


def _memory_label(windows: pd.DataFrame) -> str:
    sources = set(windows.get("memory_source", pd.Series(dtype=str)).dropna().astype(str)) - {"", "nan"}
    return {"gpu": "GPU memory used", "rss": "resident (server processes)"}.get(next(iter(sources), ""), "memory")


def write_reports(output_dir: str | Path) -> list[Path]:
    """Every report an output directory supports: the study's (summary.json) and the soak's
    (soak/); InputError when it holds neither."""
    out = Path(output_dir)
    written = []
    if (out / "summary.json").exists() or not has_soak(out):
        written.append(write_report(out))  # says what is missing when there is neither
    if has_soak(out):
        written.append(write_soak_report(out))
    return written
