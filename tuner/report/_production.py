"""The production audit's page: `tuner report AUDIT.json` (what `tuner audit --prometheus --json`
wrote) as one self-contained HTML file beside it, its hourly series as plots with the audit's
thresholds, and its findings table."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tuner.errors import InputError
from tuner.files import read_text, write_atomic
from tuner.report._html import CSS

__all__ = ["is_production_audit", "production_figure", "render_production", "write_production_report"]

# The audit's thresholds (tuner.audit: LOW_FILL, INEFFICIENT, HEALTHY), a layer above the report's:
# tests/test_report_production.py holds them equal.
LOW_FILL, INEFFICIENT, HEALTHY = 0.5, 0.60, 0.75
KEYS = ("model", "window", "figures", "steps", "findings")


def is_production_audit(path: str | Path) -> bool:
    """Whether `path` is a file (a production audit's JSON), not an output directory."""
    return Path(path).is_file()


def _load(path: Path) -> dict:
    try:
        data = json.loads(read_text(path, error=InputError, what="a production audit's JSON"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    missing = [k for k in KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise InputError(f"{path}: not a production audit's JSON (`tuner audit --prometheus --json`): "
                         f"no {', '.join(missing)}")
    return data


def production_figure(audit: dict) -> go.Figure | None:
    """The hourly series, one panel each: throughput per replica (with the baseline's capacity), fill rate
    (the 0.5 line), throughput ratio (0.60 and 0.75), queue and compute time per request, error rate."""
    steps = pd.DataFrame(audit["steps"])
    if steps.empty:
        return None
    t = pd.to_datetime(steps["start"], utc=True)
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=("Requests/s per replica", "Batch fill rate", "Throughput ratio",
                                        "Queue and compute time per request (ms)", "Error rate"))

    def line(row: int, column: str, name: str) -> None:
        if column in steps and steps[column].notna().any():
            fig.add_trace(go.Scatter(x=t, y=steps[column], name=name, mode="lines+markers",
                                     marker={"size": 3}), row=row, col=1)

    line(1, "per_replica_rps", "per replica")
    baseline = audit.get("baseline") or {}
    if baseline.get("capacity_rps"):
        fig.add_hline(y=baseline["capacity_rps"], line_dash="dash", annotation_text="baseline capacity",
                      row=1, col=1)
    line(2, "fill_rate", "fill rate")
    fig.add_hline(y=LOW_FILL, line_dash="dot", line_color="red", annotation_text=f"{LOW_FILL:g}", row=2, col=1)
    line(3, "ratio", "throughput ratio")
    if "ratio" in steps and steps["ratio"].notna().any():
        fig.add_hline(y=INEFFICIENT, line_dash="dot", line_color="red", annotation_text=f"{INEFFICIENT:.2f}",
                      row=3, col=1)
        fig.add_hline(y=HEALTHY, line_dash="dot", line_color="green", annotation_text=f"{HEALTHY:.2f}",
                      row=3, col=1)
    line(4, "queue_ms", "queue")
    line(4, "compute_ms", "compute")
    line(5, "error_rate", "error rate")
    fig.update_layout(height=1100, margin={"t": 40, "l": 60, "r": 20, "b": 40}, legend={"orientation": "h"})
    return fig


def render_production(audit: dict, *, source: str = "") -> str:
    """The production audit's page as one HTML document."""
    f, w = audit["figures"], audit["window"]
    facts = (f"model {audit['model']} · {w['start']} to {w['end']} in steps of {w['step_s']:g} s · "
             f"{len(audit['steps'])} step{'' if len(audit['steps']) == 1 else 's'} with samples · {f.get('replicas', 0):.3g} replica(s) · "
             f"from {audit.get('prometheus', '')}")
    fig = production_figure(audit)
    plot = ("<p class='notes'>No step of the window has samples: nothing to plot.</p>" if fig is None else
            fig.to_html(full_html=False, include_plotlyjs=True, config={"displaylogo": False}))
    findings = pd.DataFrame(audit["findings"]).to_html(index=False, na_rep="")
    title = f"tuner audit --prometheus: {audit['model']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="facts">{html.escape(facts)}.</p>
<h2>Every step</h2>
{plot}
<h2>Findings</h2>
{findings}
<p class="notes">Written by tuner {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from {html.escape(source)}.</p>
</body></html>
"""


def write_production_report(path: str | Path) -> Path:
    """Write the page of the production audit's JSON at `path` beside it (audit.json -> audit.html)."""
    path = Path(path)
    return write_atomic(path.with_suffix(".html"), render_production(_load(path), source=str(path)))
