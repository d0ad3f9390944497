"""The report's plots, one function each, as plotly figures (Optuna's own where it has one).

Each function returns a figure, or None with the reason in `out.notes` when its input is missing.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import optuna
import pandas as pd
import plotly.graph_objects as go

from tuner import space
from tuner.instants import parse_instant
from tuner.report._load import StudyOutput, _dig, simulated_vs_measured, traffic_rate
from tuner.traffic import TIMESTAMP, busiest_window
from tuner.traffic.windows import offsets

INCUMBENT, WINNER, PARETO = "#d62728", "#2ca02c", "#ff7f0e"
NO_VERDICT_COLOR = "#9467bd"  # an unstable or unmeasured trial: neither feasible nor infeasible
LAYOUT: dict[str, Any] = {"template": "plotly_white", "height": 420, "margin": {"l": 60, "r": 20, "t": 50, "b": 50}}


def _hover(frame: pd.DataFrame, params: list[str]) -> list[str]:
    rows = []
    for _, row in frame.iterrows():
        # an unstable trial is stored as failed, but the failure is the measurement's, not the configuration's
        state = f"{row['outcome']}: no verdict" if row["no_verdict"] else row["state"].lower()
        bits = [f"trial {row['number']:.0f} ({state})"]
        bits += [f"{p}={row[p]}" for p in params if pd.notna(row[p])]
        fill = f", fill rate {row['fill_rate']:.2f}" if pd.notna(row["fill_rate"]) else ""
        unknown = row["no_verdict"] or pd.isna(row["capacity_rps"])  # no verdict, or failed before any capacity
        bits.append(f"capacity {'not measured' if unknown else format(row['capacity_rps'], '.1f') + ' req/s'}{fill}")
        rows.append("<br>".join(bits))
    return rows


def _no_verdict(frame: pd.DataFrame) -> str:
    """The legend of trials the measurement could not judge, by their outcomes: "no verdict (unstable)"."""
    outcomes = sorted(set(frame.loc[frame["no_verdict"], "outcome"].dropna()))
    return f"no verdict ({', '.join(outcomes)})" if outcomes else "no verdict"


def pareto_front(frame: pd.DataFrame, latency: str) -> pd.DataFrame:
    """Trials no other trial beats on both lower latency and more requests per dollar."""
    ok = frame.dropna(subset=[latency, "requests_per_dollar"]).sort_values(
        [latency, "requests_per_dollar"], ascending=[True, False])
    best, keep = -math.inf, []
    for index, value in ok["requests_per_dollar"].items():
        if value > best:
            keep.append(index)
            best = value
    return ok.loc[keep]


def trials_scatter(out: StudyOutput) -> go.Figure:
    """Every measured trial: requests per dollar against the SLA's latency percentile at the
    recorded load (where the SLA is judged); trials with no score sit at zero."""
    latency, sla = out.latency_column, out.sla
    frame = out.trials
    measured = frame.dropna(subset=[latency])
    fig = go.Figure()
    if not math.isnan(sla["latency_ms"]):
        fig.add_vrect(x0=0, x1=sla["latency_ms"], fillcolor="rgba(44,160,44,0.08)", line_width=0,
                      annotation_text="meets the SLA", annotation_position="top left")
        fig.add_vline(x=sla["latency_ms"], line_dash="dash", line_color="gray")
    verdicts = ((measured["feasible"] & ~measured["no_verdict"], "feasible", "#1f77b4"),
                (measured["no_verdict"], _no_verdict(measured), NO_VERDICT_COLOR),
                (~measured["feasible"] & ~measured["no_verdict"], "infeasible", "#bbbbbb"))
    for which, name, color in verdicts:
        part = measured[which]
        scored = part["requests_per_dollar"].notna()
        for mask, suffix, symbol in ((scored, "", "circle"), (~scored, ", no score", "circle-open")):
            if mask.any():
                fig.add_trace(go.Scatter(
                    x=part.loc[mask, latency], y=part.loc[mask, "requests_per_dollar"].fillna(0),
                    mode="markers", name=name + suffix, marker={"color": color, "size": 9, "symbol": symbol},
                    text=_hover(part[mask], out.params), hoverinfo="text+x+y"))
    front = pareto_front(measured, latency)
    fig.add_trace(go.Scatter(x=front[latency], y=front["requests_per_dollar"], mode="lines+markers",
                             name="Pareto front", line={"color": PARETO, "shape": "hv"},
                             marker={"size": 6, "color": PARETO}))
    q = out.latency_key  # the percentile drawn (100: max), for the markers as for the trials
    for which, name, color, symbol in (("incumbent", "incumbent", INCUMBENT, "x"),
                                       ("best", "recommended", WINNER, "star")):
        ran = out.repeats_measured(which)
        if ran is not None:  # the repeats' medians: how many repeats they are of
            name += " (re-measured" + (f": {ran[0]} of {ran[1]} repeats measured)" if ran[0] < ran[1] else ")")
        x = out.summary_latency(which).get(q)
        y = out.per_dollar(which)
        if x is not None and y is not None:
            fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=name,
                                     marker={"color": color, "size": 16, "symbol": symbol}))
    unmeasured = frame.drop(measured.index)
    title = f"Trials: {out.score_label} against the SLA {out.latency_name}"
    if len(unmeasured):
        unstable = int(unmeasured["no_verdict"].sum())
        title += (f" ({len(unmeasured)} trial{'s' if len(unmeasured) > 1 else ''} without a latency at the load not shown"
                  + (f", {unstable} of them with no verdict" if unstable else "") + ")")
    fig.update_layout(title=title, xaxis_title=f"{out.latency_name} {q} at the recorded load (ms)",
                      yaxis_title=out.score_label, **LAYOUT)
    return fig


def search_history(out: StudyOutput) -> go.Figure:
    """Each trial's score in order, with the best feasible so far."""
    if out.study is not None and len(out.study.directions) == 1:
        complete = out.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if complete:
            fig = optuna.visualization.plot_optimization_history(out.study, target_name=out.score_label)
            fig.update_layout(title="Search history (Optuna)", **LAYOUT)
            return fig
    frame = out.trials.sort_values("number")
    best = frame["requests_per_dollar"].where(frame["feasible"]).cummax()
    fig = go.Figure([
        go.Scatter(x=frame["number"], y=frame["requests_per_dollar"], mode="markers", name="trial"),
        go.Scatter(x=frame["number"], y=best, mode="lines", name="best feasible so far"),
    ])
    fig.update_layout(title="Search history", xaxis_title="trial", yaxis_title=out.score_label, **LAYOUT)
    return fig


def param_importance(out: StudyOutput) -> go.Figure | None:
    """Optuna's importance evaluator; needs a few complete trials whose parameters vary."""
    if out.study is None:
        return None
    complete = out.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 4:
        out.notes.append(f"parameter importance needs at least 4 complete trials, the study has {len(complete)}")
        return None
    try:
        target = None if len(out.study.directions) == 1 else (lambda t: t.values[0])
        fig = optuna.visualization.plot_param_importances(out.study, target=target,
                                                          target_name=out.score_label)
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        out.notes.append(f"parameter importance could not be computed: {exc}")
        return None
    fig.update_layout(title="Parameter importance (Optuna, fANOVA)", **LAYOUT)
    return fig


def param_map(out: StudyOutput) -> go.Figure | None:
    """Where the search went in the two batching parameters (Triton's batch size and queue delay; a
    vLLM-served model's sequences and batched tokens, both on log axes), coloured by the score."""
    tokens = out.unit == "tokens"
    x, y = (space.MAX_SEQS, space.MAX_TOKENS) if tokens else (space.MAX_BATCH_SIZE, space.QUEUE_DELAY)
    if x not in out.trials or y not in out.trials:
        out.notes.append(f"trials.csv lacks {x} or {y}: no parameter map")
        return None
    frame = out.trials.dropna(subset=[x, y])
    judged = frame[~frame["no_verdict"]]
    fig = go.Figure(go.Scatter(
        x=judged[x], y=judged[y], mode="markers", text=_hover(judged, out.params), hoverinfo="text",
        name="feasible (colour: score) or infeasible (grey)", showlegend=False,
        marker={"size": 10, "color": judged["requests_per_dollar"].where(judged["feasible"]),
                "colorscale": "Viridis", "showscale": True, "colorbar": {"title": out.score_short},
                "line": {"width": 1, "color": np.where(judged["feasible"], "#333", "#ccc")}}))
    unjudged = frame[frame["no_verdict"]]
    if len(unjudged):  # not infeasible: the measurement could not judge it
        fig.add_trace(go.Scatter(
            x=unjudged[x], y=unjudged[y], mode="markers", text=_hover(unjudged, out.params), hoverinfo="text",
            name=_no_verdict(unjudged), marker={"size": 11, "symbol": "diamond-open", "color": NO_VERDICT_COLOR,
                                                  "line": {"width": 2}}))
        fig.update_layout(legend={"orientation": "h", "y": -0.2})
    fig.update_xaxes(type="log", tickvals=sorted(frame[x].unique()))
    if tokens:
        fig.update_yaxes(type="log")
    title = "Parameters tried (grey: infeasible" + (f"; open diamond: {_no_verdict(unjudged)})" if len(unjudged) else ")")
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, **LAYOUT)
    return fig


def _cdf_points(percentiles: dict[str, float]) -> tuple[list, list] | None:
    points = sorted((float(v), 1.0 if q == "max" else float(q[1:]) / 100)
                    for q, v in percentiles.items() if v is not None and pd.notna(v) and (q == "max" or q[1:].isdigit()))
    return ([p[0] for p in points], [p[1] for p in points]) if points else None


def _row_percentiles(row: pd.Series) -> dict[str, float]:
    """A trial's percentiles at capacity, else at the recorded load."""
    qs = ("p50", "p90", "p95", "p99", "max")
    at_capacity = {q: row.get(f"capacity_latency_{q}_ms") for q in qs}
    if any(pd.notna(v) for v in at_capacity.values()):
        return {q: v for q, v in at_capacity.items() if pd.notna(v)}
    return {q: row.get(f"latency_{q}_ms") for q in qs if pd.notna(row.get(f"latency_{q}_ms"))}


def latency_cdfs(out: StudyOutput) -> go.Figure | None:
    """Latency CDFs at capacity of the incumbent and the top 3 trials, each configuration once (the
    incumbent's trial is the incumbent); a curve pools its repeats' requests (the legend says so)."""
    fig = go.Figure()
    sources = [("incumbent", out.summary_latency("incumbent", at="capacity"))]
    sources += [(f"trial {int(r['number'])}", _row_percentiles(r))
                for _, r in out.top_trials(3, incumbent=False).iterrows()]
    estimated, pooled = [], False
    for label, percentiles in sources:
        color = INCUMBENT if label == "incumbent" else None
        if label in out.latency_records:
            values = np.sort(out.latency_records[label].to_numpy(dtype=float))
            # about 2,000 points: a smooth curve in a small HTML file, the tail (max) kept
            keep = np.unique(np.append(np.linspace(0, len(values) - 1, min(len(values), 2000)).astype(int),
                                       len(values) - 1))
            x, y = values[keep], (keep + 1) / len(values)
            repeats = out.latency_repeats.get(label, 1)
            pooled |= repeats > 1
            ran = out.repeats_measured("incumbent" if label == "incumbent" else int(label.removeprefix("trial ")))
            if ran is not None and ran[1] > repeats:  # a repeat with no verdict has no records: say it is missing
                name = f"{label} ({repeats} of {ran[1]} repeats pooled)"
            else:
                name = f"{label} ({repeats} repeats pooled)" if repeats > 1 else label
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line={"color": color}))
            continue
        points = _cdf_points(percentiles)
        if points:
            estimated.append(label)
            fig.add_trace(go.Scatter(x=points[0], y=points[1], mode="lines+markers", name=f"{label} (percentiles)",
                                     line={"color": color, "dash": "dot"}))
    if not fig.data:
        out.notes.append("no latency records or percentiles: no latency CDFs")
        return None
    if estimated:
        out.notes.append("latency CDFs of " + ", ".join(estimated) + " are drawn through the measured "
                         "percentiles (no per-request records in records/)")
    # a generative model's latency here is end to end: the SLA's line only where the SLA limits that
    tokens = out.unit == "tokens"
    limit = _dig(out.summary, "sla.e2e_ms") if tokens else out.sla["latency_ms"]
    if limit is not None and not math.isnan(limit):
        fig.add_vline(x=limit, line_dash="dash", line_color="gray", annotation_text="SLA")
    title = "End-to-end latency CDF at capacity (due time to last token)" if tokens else "Latency CDF at capacity"
    if pooled:  # a pooled curve's 0.99 is not the median of the repeats' p99s the tables quote
        title += (f"<br><sup>the measured repeats' requests pooled; the table's {'end to end ' if tokens else ''}p99 is the "
                  "median of the repeats' p99</sup>")
    fig.update_layout(title=title, xaxis_title="end to end (ms)" if tokens else "latency (ms)",
                      yaxis_title="fraction of requests", **LAYOUT)
    return fig


def _histogram(out: StudyOutput, which: str) -> tuple[dict[int, int], str] | None:
    """A configuration's dispatched batch sizes and which measurement they are ("" for the summary's
    own): the summary's, else its trial's in the search at capacity, else at the recorded load (a
    re-measurement keeps no histogram: its repeats' figures are medians)."""
    number = _dig(out.summary, f"{which}.trial")
    for hist, where in ((_dig(out.summary, f"{which}.batch_histogram"), ""),
                        (out.trial_attr(number, "capacity_batch_histogram"), f"trial {number} in the search, at capacity"),
                        (out.trial_attr(number, "batch_histogram"), f"trial {number} in the search, at the recorded load")):
        if isinstance(hist, str):  # the tuner keeps it as JSON text (flat user attributes)
            try:
                hist = json.loads(hist)
            except json.JSONDecodeError:
                continue
        if isinstance(hist, dict) and hist:
            return {int(k): int(v) for k, v in hist.items()}, where
    return None


def batch_histograms(out: StudyOutput) -> go.Figure | None:
    """Dispatched batch sizes of the incumbent and the winner, each legend with the fill rate of the bars
    it names (mean batch / max_batch_size) and which measurement they are; None for a vLLM-served model,
    which Triton does not batch (its engine's batching is in the comparison table)."""
    if out.unit == "tokens":
        out.notes.append("Triton does not batch a vLLM-served model (max_batch_size 0): its engine's own batching "
                         "(running sequences and KV cache at their peak, preemptions) is in the table under the cost")
        return None
    fig = go.Figure()
    missing, searched = [], False
    for which, name, color in (("incumbent", "incumbent", INCUMBENT), ("best", "recommended", WINNER)):
        fill = _dig(out.summary, f"{which}.fill_rate")
        mbs = _dig(out.summary, f"{which}.params.{space.MAX_BATCH_SIZE}")
        found = _histogram(out, which)
        if found:
            hist, where = found
            sizes = sorted(hist)
            total = sum(hist.values()) or 1
            shares = [hist[s] / total for s in sizes]
            # the fill rate of these bars, not the summary's: that may be another measurement's (the re-measurement's)
            label = f"{name}: max_batch_size {mbs}" + (
                f", fill rate {sum(s * f for s, f in zip(sizes, shares, strict=True)) / float(mbs):.2f}" if mbs else "")
            searched |= bool(where)
            fig.add_trace(go.Bar(x=sizes, y=shares, name=label + (f" ({where})" if where else ""),
                                 marker_color=color, opacity=0.75))
        else:
            missing.append(name)
            if fill is not None and mbs:
                fig.add_trace(go.Bar(x=[fill * float(mbs)], y=[1.0],
                                     name=f"{name}: max_batch_size {mbs}, fill rate {fill:.2f}: mean batch only",
                                     marker_color=color, opacity=0.5, width=0.4))
    if missing:
        out.notes.append("no batch_histogram for " + " and ".join(missing) + ": its bar shows the mean batch")
    title = f"Batch sizes dispatched{' in the search' if searched else ''} (fill rate: of the bars drawn)"
    if searched and any(_dig(out.summary, f"{w}.repeats") for w in ("incumbent", "best")):
        title += "<br><sup>the table's fill rate is the re-measurement's median; its repeats keep no histogram</sup>"
    fig.update_layout(title=title, barmode="overlay", xaxis_title="batch size",
                      yaxis_title="share of executions", **LAYOUT)
    return fig


def traffic_profile(out: StudyOutput) -> go.Figure | None:
    """The recorded traffic's rate over time, with one server's capacity before and after."""
    if out.traffic is None or out.traffic.empty:
        return None
    speed = out.speed
    rate = traffic_rate(out.traffic)
    width = float(rate["bin_s"].iloc[0]) / speed
    fig = go.Figure(go.Scatter(x=rate["t_s"] / speed, y=rate["rps"] * speed, mode="lines",
                               name=f"requests/s ({width:g} s bins)", line={"shape": "hv"}))
    stretch = _replayed_stretch(out)
    if stretch is not None:
        fig.add_vrect(x0=stretch[0] / speed, x1=stretch[1] / speed, fillcolor="rgba(255,127,14,0.12)", line_width=0,
                      annotation_text="the stretch the study replayed", annotation_position="top left")
    # a capacity is a mean rate (its replay's busiest second met the SLA too): a bin above it may still be served
    for which, name, color in (("incumbent", "incumbent's capacity (mean)", INCUMBENT),
                               ("best", "recommended's capacity (mean)", WINNER)):
        capacity = _dig(out.summary, f"{which}.capacity_rps")
        if capacity:
            fig.add_hline(y=float(capacity), line_dash="dash", line_color=color, annotation_text=name,
                          annotation_position="top right" if which == "best" else "bottom right")
    fig.update_layout(title=f"Traffic profile: offered rate over time (replayed at speed {speed:g})",
                      xaxis_title="time (s)",
                      yaxis_title="requests per second", **LAYOUT)
    return fig


def _replayed_stretch(out: StudyOutput) -> tuple[float, float] | None:
    """The window of the profile the study used (traffic.busiest_s or start_s/duration_s), in
    recorded seconds from the first request; None when it used the whole profile."""
    busiest, start, duration = (_dig(out.summary, f"traffic.{k}") for k in ("busiest_s", "start_s", "duration_s"))
    if busiest:
        begin = busiest_window(out.traffic, float(busiest))[0]
        return begin, begin + float(busiest)
    since, until = (_dig(out.summary, f"traffic.{k}") for k in ("since", "until"))
    if (since is not None or until is not None) and len(out.traffic):
        t0 = float(out.traffic[TIMESTAMP].iloc[0])
        begin = 0.0 if since is None else parse_instant(since) - t0
        return begin, float(offsets(out.traffic)[-1]) if until is None else parse_instant(until) - t0
    if start is not None or duration is not None:
        begin = float(start or 0.0)
        return begin, begin + float(duration) if duration else float(offsets(out.traffic)[-1])
    return None


def cost_bars(out: StudyOutput) -> go.Figure | None:
    """Servers the load needs (its busiest second included), and their monthly bill, before and after."""
    rows = [(name, out.servers_and_cost(which)) for which, name in (("incumbent", "incumbent"), ("best", "recommended"))]
    if any(cost is None for _, cost in rows):
        return None
    fig = go.Figure(go.Bar(
        x=[name for name, _ in rows], y=[cost[1] for _, cost in rows], marker_color=[INCUMBENT, WINNER],
        text=[f"{cost[0]} server{'s' if cost[0] > 1 else ''}: ${cost[1]:,.0f}/month" for _, cost in rows],
        textposition="auto"))
    rates = out.load_rates()
    fig.update_layout(title=f"Servers the load needs and their monthly cost{f' (the load: {rates})' if rates else ''}",
                      yaxis_title="dollars per month", **LAYOUT)
    return fig


def simulated_landscape(out: StudyOutput) -> go.Figure | None:
    """The simulation's requests per dollar (the study's scoring) over max_batch_size x queue delay,
    best per cell where the simulation varied more knobs, with the measured trials on it."""
    sim = out.simulation
    if sim is None:
        return None
    scoring = out.summary.get("scoring") or "capacity"
    x, y, z = space.MAX_BATCH_SIZE, space.QUEUE_DELAY, f"score_{scoring}"
    cells = sim[[x, y, z]].copy()
    cells[z] = pd.to_numeric(cells[z], errors="coerce").where(lambda v: v > 0)  # infeasible: no colour
    varied = len(cells) > len(cells.drop_duplicates([x, y]))
    grid = cells.groupby([y, x])[z].max().unstack(x).sort_index()
    fig = go.Figure(go.Heatmap(
        x=grid.columns.to_numpy(), y=grid.index.to_numpy() / 1000, z=grid.to_numpy(), colorscale="Viridis",
        colorbar={"title": "req/$ (simulated)"}, hoverongaps=False,
        hovertemplate="max_batch_size %{x}<br>delay %{y} ms<br>%{z:,.0f} requests per dollar<extra>simulated</extra>"))
    matched = simulated_vs_measured(out)
    trials = out.trials.dropna(subset=[x, y])
    trials = trials[trials["state"].isin(("COMPLETE", "PRUNED"))]
    if len(trials):
        sim_of = {int(r["number"]): r for _, r in matched.iterrows()}
        text = []
        for _, r in trials.iterrows():
            line = f"trial {int(r['number'])}: measured " + (
                f"{r['requests_per_dollar']:,.0f} req/$" if r["feasible"] and pd.notna(r["requests_per_dollar"])
                else "infeasible")
            m = sim_of.get(int(r["number"]))
            if m is not None:
                line += f", simulated {m['simulated_requests_per_dollar']:,.0f}"
            text.append(line)
        fig.add_trace(go.Scatter(
            x=trials[x], y=trials[y] / 1000, mode="markers", name="measured trials (x: missed the SLA)", text=text, hoverinfo="text",
            marker={"size": 10, "symbol": np.where(trials["feasible"], "circle", "x").tolist(),
                    "color": "white", "line": {"width": 1.5, "color": "black"}}))
    best = _dig(out.summary, "best.params") or {}
    if x in best and y in best:
        fig.add_trace(go.Scatter(x=[best[x]], y=[best[y] / 1000], mode="markers", name="recommended",
                                 marker={"size": 16, "symbol": "star", "color": WINNER, "line": {"width": 1}}))
    sizes = sorted({int(v) for v in grid.columns} | {int(v) for v in trials[x]})
    ticks = sizes if len(sizes) <= 16 else [v for v in sizes if v & (v - 1) == 0 or v == sizes[-1]]
    fig.update_xaxes(type="log", tickvals=ticks)
    title = f"Simulated requests per dollar ({scoring} scoring) over the space"
    if varied:
        title += ": each cell the best of its other knobs"
    fig.update_layout(title=title + " (blank: misses the SLA)", xaxis_title=x,
                      yaxis_title="max_queue_delay (ms)", legend={"orientation": "h", "y": -0.2}, **LAYOUT)
    return fig
