"""Assemble the report: one self-contained HTML file (plotly.js inlined once, no network)."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from tuner import export, search, space
from tuner.files import write_atomic
from tuner.formats import figure
from tuner.measurement import percentile_key
from tuner.report import _figures as figures
from tuner.report._load import StudyOutput, _dig, load_output, simulated_vs_measured
from tuner.soak import has_soak, last_soak

REPORT = "report.html"

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; border-bottom: 1px solid #ddd; }
.recommendation { font-size: 1.2em; font-weight: 600; padding: .6em .8em; background: #eef7ee;
  border-left: 5px solid #2ca02c; }
.facts { color: #444; } table { border-collapse: collapse; font-size: .9em; }
td, th { padding: .25em .7em; border-bottom: 1px solid #eee; text-align: right; }
pre.diff { background: #f7f7f7; padding: .8em; overflow-x: auto; font-size: .85em; }
.add { color: #116611; background: #e6ffe6; } .del { color: #991111; background: #ffe6e6; }
.notes { color: #666; font-size: .9em; }
"""


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def _price(value: float | None) -> str:
    """One server's price per hour as the exported config's header writes it (`$3.4/h`)."""
    return "n/a" if value is None else f"${figure(value)}/h"


def _num(value: object, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "n/a"
    return f"{float(value):,.{digits}f}"


def recommendation_line(out: StudyOutput) -> str:
    """One line: what to set, its score and the gain over the incumbent."""
    if not isinstance(out.summary.get("best"), dict):
        sla = out.sla
        return (f"No configuration met the SLA ({out.latency_name} {percentile_key(sla['percentile'])} ≤ {_num(sla['latency_ms'], 0)} ms): "
                f"nothing to recommend; the incumbent scores "
                f"{_num(out.per_dollar('incumbent'), 0)} {out.score_label}.")
    params = _dig(out.summary, "best.params") or {}
    setting = ", ".join(f"{k}={v}" for k, v in params.items()) or "(no parameters recorded)"
    best, incumbent = (out.per_dollar(w) for w in ("best", "incumbent"))
    improvement = out.summary.get("improvement")
    # a summary of before the improvement was kept: computed here, unless its incumbent missed the SLA (a
    # re-measured one's median would be half a measurement, tuner.search.met_sla)
    if (improvement is None and best and incumbent and "improvement" not in out.summary
            and _dig(out.summary, "incumbent.feasible") is not False):
        improvement = float(best) / float(incumbent) - 1
    if improvement is not None:
        gain = f"{float(improvement):+.1%} over the incumbent ({_num(incumbent, 0)})"
    elif isinstance(out.summary.get("incumbent"), dict):
        gain = "the incumbent did not meet the SLA"
    else:
        gain = "no incumbent to compare with"
    ran = out.repeats_measured("best")
    lost = f" (the median of {ran[0]} of {ran[1]} repeats measured)" if ran is not None and ran[0] < ran[1] else ""
    if _dig(out.summary, "best.trial") is not None and _dig(out.summary, "best.trial") == _dig(out.summary, "incumbent.trial"):
        # the study's message says "keep it": a "+0.0 % over the incumbent" would read as a change to make
        return f"Keep the incumbent: {setting} — the best configuration measured, {_num(best, 0)} {out.score_label}{lost}."
    if out.summary.get("keep_incumbent"):  # the best's gain within the measurements' uncertainty (tuner.export)
        low_high = out.summary.get("improvement_range")
        within = f" (between {low_high[0]:+.1%} and {low_high[1]:+.1%})" if low_high else ""
        return (f"Keep the incumbent: the best measured, {setting} — {_num(best, 0)} {out.score_label}{lost}, "
                f"{float(improvement):+.1%} over the incumbent{within} — cannot be told apart from it within the "
                f"measurements' uncertainty.")
    return f"Recommended: {setting} — {_num(best, 0)} {out.score_label}{lost}, {gain}."


def _facts(out: StudyOutput) -> str:
    sla = out.sla
    counts = out.summary.get("trials") or {}
    # an unstable or unmeasured trial is neither feasible nor failed: counted as no verdict, as README says
    no_verdict = {k: counts[k] for k in ("unstable", "unmeasured") if counts.get(k)}
    trials = ", ".join([f"{counts[k]} {k}" for k in ("complete", "feasible") if k in counts]
                       + [f"{n} {k} (no verdict)" for k, n in no_verdict.items()]
                       + [f"{counts[k]} {k}" for k in ("failed", "pruned") if k in counts]
                       + ([f"{counts['interrupted']} interrupted (measured again)"] if counts.get("interrupted") else []))
    if trials and counts.get("total") is not None:
        trials = f"{counts['total']} ({trials})"
    given = out.summary.get("sla") or {}
    limits = (export.sla_limits(given).replace("<=", "≤") if isinstance(given, dict) and out.latency_name != "latency"
              else f"{out.latency_name} {percentile_key(sla['percentile'])} ≤ {_num(sla['latency_ms'], 0)} ms")  # TTFT and TPOT
    return (f"SLA: {limits}, error rate ≤ "
            f"{sla['max_error_rate']:.2%} · price {_price(out.price_per_hour)} · "
            f"scoring: {out.summary.get('scoring', 'capacity')} · trials: {trials or len(out.trials)}{_servers(out)}")


def _check_html(out: StudyOutput) -> str:
    """The command that measures the recommendation's deciding step again (`tuner.export.check_command`)."""
    command = export.check_command(out.summary, str(out.path))
    return f"<p class='facts'>Check it again: <code>{html.escape(command)}</code></p>\n" if command else ""


def _servers(out: StudyOutput) -> str:
    before, after = out.servers_and_cost("incumbent"), out.servers_and_cost("best")
    if before is None or after is None:
        return ""
    rates = out.load_rates()
    return (f" · the load{f' ({rates})' if rates else ''}: {before[0]} → {after[0]} servers, "
            f"{_money(before[1])} → {_money(after[1])} per month")


def comparison_table(out: StudyOutput) -> pd.DataFrame:
    """Incumbent and recommendation side by side, with the servers the load needs and their monthly bill
    (a capacity as its mean rate and its busiest second, as `_capacity_note` says)."""
    rows = {}
    for which, name in (("incumbent", "incumbent"), ("best", "recommended")):
        servers = out.servers_and_cost(which)
        rows[name] = {
            **{k: v for k, v in (_dig(out.summary, f"{which}.params") or {}).items()},
            "capacity: mean (req/s)": _num(_dig(out.summary, f"{which}.capacity_rps")),
            "capacity: busiest second (req/s)": _num(_dig(out.summary, f"{which}.capacity_bracket.peak_rps"), 0),
            f"{out.score_short} (capacity)": _num(_dig(out.summary, f"{which}.scores.capacity"), 0),
            f"{out.score_short} (utilization)": _num(_dig(out.summary, f"{which}.scores.utilization"), 0),
            # a generative model's latency_ms is its requests' end to end
            **{f"{'end to end ' if out.unit == 'tokens' else ''}{q} (ms)": _num(_dig(out.summary, f"{which}.latency_ms.{q}"))
               for q in ("p50", "p95", "p99")},
            **({f"TTFT {q} (ms)": _num(_dig(out.summary, f"{which}.ttft_ms.{q}")) for q in ("p50", "p99")}
               | {f"TPOT {q} (ms)": _num(_dig(out.summary, f"{which}.tpot_ms.{q}")) for q in ("p50", "p99")}
               # how the engine batched there: its sequences and KV cache at their peak, its preemptions
               | {"running sequences (peak)": _num(_dig(out.summary, f"{which}.engine.running_peak"), 0),
                  "KV cache (peak)": _num(_dig(out.summary, f"{which}.engine.kv_cache_peak"), 2),
                  "preemptions": _num(_dig(out.summary, f"{which}.engine.preemptions"), 0)}
               if out.unit == "tokens" else {"fill rate": _num(_dig(out.summary, f"{which}.fill_rate"), 2)}),
            **({"repeats measured": _repeats(out, which)} if any(out.repeats_measured(w) for w in ("incumbent", "best"))
               else {}),
            "servers for the load": servers[0] if servers else "n/a",
            "monthly cost": _money(servers[1]) if servers else "n/a",
        }
    return pd.DataFrame(rows)


def _repeats(out: StudyOutput, which: str) -> str:
    """"1 of 2": of how many re-measurement repeats the figures beside it are the medians (a repeat with
    no verdict counts in none)."""
    ran = out.repeats_measured(which)
    return "n/a (not re-measured)" if ran is None else f"{ran[0]} of {ran[1]}"


def _capacity_note(out: StudyOutput) -> str:
    """What the comparison table's rates are, in the words of `tuner tune`'s closing note, so that its
    servers can be checked against them."""
    rates = out.load_rates()
    return ("<p class='notes'>capacity: the fastest replay of the recording that met the SLA, as its mean rate "
            "(the busiest second of that replay beside it); the load: the recording at speed "
            f"{out.speed:g}{f' ({rates})' if rates else ''}. Servers for the load: its mean rate over the "
            "capacity's, rounded up (the capacity's replay met the SLA through its busiest second too).</p>")


def _error(simulated: float, measured: float) -> str:
    if not (pd.notna(simulated) and pd.notna(measured)) or measured <= 0:
        return "n/a"
    return f"{simulated / measured - 1:+.1%}"


def _share(error: float) -> str:
    return "n/a" if pd.isna(error) else f"{error:+.1%}"


def simulation_table(out: StudyOutput) -> pd.DataFrame:
    """Simulated vs measured for every measured configuration the simulation has: capacity (the error as
    the model strategy judges it: `simulated_vs_measured`), the SLA's percentile at the recorded load,
    fill rate, each with its error (simulated / measured - 1)."""
    m = simulated_vs_measured(out)
    if m.empty:
        return m
    q = out.latency_key  # the percentile simulated_vs_measured compares (100: max)
    rows = []
    for _, r in m.iterrows():
        rows.append({
            "trial": int(r["number"]), **{p: r[p] for p in out.params if p in r},
            "feasible (measured / simulated)": f"{'yes' if r['measured_feasible'] else 'no'} / "
                                               f"{'yes' if r['simulated_feasible'] else 'no'}",
            # the measured capacity is a bracket: the last speed that met the SLA to the first that did not
            "capacity measured (req/s)": _num(r["measured_capacity_rps"] or None) + (
                f"–{_num(r['measured_capacity_upper_rps'])}" if r["measured_capacity_rps"]
                and pd.notna(r["measured_capacity_upper_rps"]) else ""),
            "capacity simulated (req/s)": _num(r["simulated_capacity_rps"] or None),
            "capacity error": _share(r["capacity_error"]),
            f"{q} at load measured (ms)": _num(r["measured_latency_ms"]),
            f"{q} at load simulated (ms)": _num(r["simulated_latency_ms"]),
            f"{q} error": _error(r["simulated_latency_ms"], r["measured_latency_ms"]),
            "fill rate measured": _num(r["measured_fill_rate"], 2),
            "fill rate simulated": _num(r["simulated_fill_rate"], 2),
            "fill rate error": _error(r["simulated_fill_rate"], r["measured_fill_rate"]),
        })
    return pd.DataFrame(rows).set_index("trial")


def simulation_line(out: StudyOutput) -> str:
    """One line: how far the simulation was from the measurements (median absolute capacity error,
    rank correlation of requests per dollar, agreement on the SLA)."""
    m = simulated_vs_measured(out)
    if m.empty:
        return "No measured trial is in the simulation: nothing to compare."
    info = out.study.user_attrs.get("model_search") if out.study is not None else None
    if info:  # the model strategy judged its own simulation (brackets, its fine ranking): quote that, one verdict
        agree = int((m["measured_feasible"] == m["simulated_feasible"]).sum())
        return (f"Simulated vs measured, as the model strategy judged it: {search.describe_model_search(info)}; "
                f"the SLA verdict agrees on {agree} of {len(m)}.")
    both = m[m["measured_feasible"] & m["simulated_feasible"] & (m["measured_capacity_rps"] > 0)]
    parts = [f"{len(m)} measured configurations in the simulation"]
    if len(both):
        error = both["capacity_error"].abs().median()
        parts.append(f"capacity within {error:.1%} (median absolute error over the {len(both)} feasible in both)")
    if len(m) >= 3 and m["measured_requests_per_dollar"].nunique() > 1 and m["simulated_requests_per_dollar"].nunique() > 1:
        rho = m["measured_requests_per_dollar"].rank().corr(m["simulated_requests_per_dollar"].rank())
        parts.append(f"requests per dollar ranked alike: Spearman {rho:.2f}")
    agree = int((m["measured_feasible"] == m["simulated_feasible"]).sum())
    parts.append(f"the SLA verdict agrees on {agree} of {len(m)}")
    return "Simulated vs measured: " + "; ".join(parts) + "."


def simulation_section(out: StudyOutput, plotlyjs: bool | str) -> str:
    """The simulated landscape and the simulated-vs-measured table; empty without simulation.csv."""
    fig = figures.simulated_landscape(out)
    if fig is None:
        return ""
    table = simulation_table(out)
    return ("<h2>Simulated landscape</h2>"
            + fig.to_html(full_html=False, include_plotlyjs=plotlyjs, config={"displaylogo": False})
            + f"<h2>Simulated vs measured</h2><p class='facts'>{html.escape(simulation_line(out))}</p>"
            + (table.to_html(classes="simulation") if not table.empty else ""))


def top_table(out: StudyOutput, k: int = 10) -> pd.DataFrame:
    """The `k` best feasible trials as a table: parameters, capacity, score, the SLA's latency, and the
    fill rate of Triton's batches (a vLLM-served model: its TPOT beside its TTFT, as vLLM batches)."""
    extra = ["fill_rate"] if out.unit == "requests" else \
        [c for c in ("ttft_p99_ms", "tpot_p99_ms") if c in out.trials and c != out.latency_column]
    columns = ["number", *out.params, "capacity_rps", "requests_per_dollar", out.latency_column, *extra]
    top = out.top_trials(k)[columns].round(2).set_index("number")
    # the trials' percentiles are the replay at the recorded load, not at capacity: say so in the header
    at_load = {c: f"{c.removesuffix('_ms').replace('_', ' ')} ms at the recorded load"
               for c in (out.latency_column, *extra) if c.endswith("_ms")}
    return top.rename(columns={"requests_per_dollar": out.score_short, **at_load} if out.unit == "tokens" else at_load)


def _top_html(out: StudyOutput) -> str:
    """`top_table` as HTML, its figures as the headline prints them (a score in whole units, with commas)."""
    top = top_table(out)
    score = out.score_short if out.unit == "tokens" else "requests_per_dollar"
    formats = {c: "{:,.0f}".format if c == score else "{:,.2f}".format
               for c in top.columns if pd.api.types.is_float_dtype(top[c])}
    return top.to_html(formatters=formats)


def diff_html(out: StudyOutput) -> str:
    """The incumbent-to-recommended config.pbtxt diff (a vLLM-served model's model.json) as HTML (a note
    when one is missing)."""
    name = out.config_file
    if out.incumbent_config is None or not out.recommended_config:
        return f"<p class='notes'>No diff: a {name} is missing (see the notes at the end).</p>"
    diff = space.engine_diff if out.unit == "tokens" else space.config_diff
    lines = diff(out.incumbent_config, out.recommended_config, old_name=f"incumbent/{name}",
                 new_name=f"recommended/{name}", context=2)
    body = []
    for line in lines:
        kind = "add" if line.startswith("+") and not line.startswith("+++") else \
            "del" if line.startswith("-") and not line.startswith("---") else ""
        body.append(f"<span class='{kind}'>{html.escape(line)}</span>" if kind else html.escape(line))
    return f"<pre class='diff'>{chr(10).join(body) or 'no differences'}</pre>"


SECTIONS: list[tuple[str, Callable[[StudyOutput], go.Figure | None]]] = [
    ("Every trial, the feasible region and the Pareto front", figures.trials_scatter),
    ("Search history", figures.search_history),
    ("Parameter importance", figures.param_importance),
    ("Parameters tried", figures.param_map),
    ("Latency at capacity", figures.latency_cdfs),
    ("Batch sizes and fill rate", figures.batch_histograms),
    ("Traffic profile", figures.traffic_profile),
    ("Servers and monthly cost for the load", figures.cost_bars),
]


def render(out: StudyOutput) -> str:
    """The study's report as one HTML page: the recommendation, the figures, top trials, the diff, notes."""
    parts = []
    plotlyjs: bool | str = True  # the first figure carries plotly.js, the others reuse it
    for title, build in SECTIONS:
        fig = build(out)
        if fig is None and build is figures.batch_histograms and out.unit == "tokens":
            continue  # Triton does not batch a vLLM-served model: the notes say where its engine's batching is
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if fig is None:
            parts.append("<p class='notes'>Not available (see the notes at the end).</p>")
        else:
            parts.append(fig.to_html(full_html=False, include_plotlyjs=plotlyjs, config={"displaylogo": False}))
            plotlyjs = False
            if build is figures.cost_bars:
                parts.append(comparison_table(out).to_html(classes="comparison") + _capacity_note(out))
        if build is figures.param_map:  # the simulation, where there is one, beside where the search went
            section = simulation_section(out, plotlyjs)
            parts.append(section)
            plotlyjs = plotlyjs and not section
    name = out.study.study_name if out.study is not None else out.path.name
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in dict.fromkeys(out.notes))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tuner report: {html.escape(name)}</title>
<style>{CSS}</style></head><body>
<h1>tuner report: {html.escape(name)}</h1>
<p class="recommendation" id="recommendation">{html.escape(recommendation_line(out))}</p>
<p class="facts">{html.escape(_facts(out))}</p>
{_check_html(out)}{''.join(parts)}
{_soak_section(out)}<h2>Top trials, as the search measured them</h2>
<p class="notes">Each trial's own measurement in the search; the recommendation's figures above are its
re-measurement's, where the study re-measured its best.</p>{_top_html(out)}
<h2>{out.config_file}: incumbent → recommended</h2>{diff_html(out)}
<h2>Notes</h2><ul class="notes">{notes or '<li>none</li>'}</ul>
<p class="notes">Written by tuner {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from {html.escape(str(out.path))}.</p>
</body></html>
"""


def _soak_section(out: StudyOutput) -> str:
    """The last soak's findings in a line or two, linking to its page, when the directory holds one."""
    if not has_soak(out.path):
        return ""
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in last_soak(out.path))
    return (f"<h2>Long run (tuner soak)</h2><ul class='facts'>{lines}</ul>"
            f"<p class='facts'><a href='soak/report.html'>the soak's page: every window over time</a></p>")


def write_report(output_dir: str | Path) -> Path:
    """Write `report.html` into a `tuner tune` output directory and return its path."""
    out = load_output(output_dir)
    return write_atomic(Path(output_dir) / REPORT, render(out))  # a full disk leaves no half report
