"""`tuner simulate STUDY.yaml --profile P`: rank the study's whole space in simulation, no server."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from tuner.cli._args import (
    Number,
    add_command,
    add_flag,
    add_input,
    add_json,
    add_numbers,
    add_quiet,
    add_study,
)
from tuner.files import json_safe, json_with_keys, write_atomic

# The ranking's columns printed, and their headings: the knobs' columns (headed by `tuner.space.LABELS`)
# go after the tag; a knob the space does not vary is left out.
SHOWN = {
    "rank": "rank",
    "tag": "",
    "capacity_rps": "capacity req/s",
    "latency_sla_ms": "{pct} ms at load",
    "fill_rate": "fill rate",
    "busy_s": "busy s",
    "score_capacity": "req/$ (capacity)",
    "score_utilization": "req/$ (utilization)",
    "vs_incumbent": "vs incumbent",
}


# The study's settings a simulation can override; run() checks each is finite and > 0 when given,
# and those in FRACTIONS at most 1 too.
FIGURES = (
    Number("--speed", "S",
           "the recorded load: the traffic S times faster (default: the study's traffic.speed)"),
    Number("--traffic-scale", "X",
           "what-if: compress the traffic's timestamps X times (2: twice the requests per second)"),
    Number("--sla-ms", "L", "what-if: another latency SLA (ms)"),
    Number("--price", "P", "what-if: one server's price per hour ($), in place of the study's (the price "
           "table's per GPU x cost.gpus_per_server, or cost.price_per_hour)"),
    Number("--tolerance", "T", "capacity bisection tolerance (default: the study's search.capacity."
           "tolerance, a fraction in (0, 1]); simulation is cheap, a finer one (0.02) separates close "
           "configurations"),
)
FRACTIONS = ("--tolerance",)  # the bisection's relative width (as the study's): 5 would be a 500 % bracket


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner simulate` to `subparsers`."""
    p = add_command(
        subparsers,
        "simulate",
        run=run,
        help="rank every configuration of the study's space by simulating Triton's dynamic batcher",
        description="Simulate Triton's dynamic batcher on the study's traffic with a profile of the "
        "model's execution time (rows x padded length; see tuner/simulate/_profile.py for the file format) and "
        "rank the whole search space as the real search would score it: the step at the recorded load "
        "(SLA, utilization score), then the capacity bisection on simulated steps (capacity score). "
        "No server is started. What-ifs: --traffic-scale 2 (the same traffic twice as fast), --sla-ms, "
        "--price, --speed. The model's config and the traffic are checked first as `tuner tune --check` checks "
        "them, and the space narrowed to the traffic's largest request as tune narrows it. --json "
        "replaces only a ranking tuner wrote (else --force), never one of the study's inputs. "
        "Exit codes: 0 done, 3 no configuration met the SLA, 2 bad input.",
    )
    add_study(p, "the study file (traffic, SLA, cost, search space)")
    add_input(p, "--profile", required=True, metavar="P", help="the model's profile CSV")
    add_numbers(p, FIGURES)
    add_flag(p, "--grid", "only the grid sampler's points (search.grid_per_octave), not every batch size the "
             "search can sample")
    p.add_argument("--top", type=int, default=10, metavar="N", help="rows to print (default 10)")
    add_json(p, "the whole ranking", force=True)
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    """Rank the study's space in simulation and print the top rows; exit 0, or 3 when none met the SLA."""
    from tqdm import tqdm

    from tuner import search
    from tuner.cost import price_for
    from tuner.errors import SettingsError
    from tuner.files import check_writable
    from tuner.measurement import percentile_key
    from tuner.settings import read_study, with_overrides
    from tuner.simulate import read_profile
    from tuner.study import stale_profile, study_traffic
    from tuner.traffic import scale_time
    from tuner.tune import check_traffic

    for figure in FIGURES:
        value = getattr(args, figure.dest)
        if value is None:
            continue
        if not (math.isfinite(value) and value > 0):
            raise SettingsError(f"{figure.flag}: must be > 0, got {value:g}")
        if figure.flag in FRACTIONS and value > 1:
            raise SettingsError(f"{figure.flag}: must be a fraction in (0, 1] (e.g. 0.05), got {value:g}")
    if args.top < 1:
        raise SettingsError(f"--top: must be >= 1, got {args.top}")
    if args.json:
        check_writable(args.json, label=f"--json {args.json}")  # before the ranking is printed, not after
    from tuner import space
    from tuner.study import check_batcher_study

    settings = read_study(args.study)
    check_batcher_study(settings, "simulate")
    # the space's ranges within their knobs' bounds, as tune checks them (a range of 1e11 batch sizes
    # would be listed, or profiled, before anything is refused)
    space.study_space(settings.search, vllm=False, source=settings.source or args.study)
    base = check_base(settings)
    if args.json:
        check_output(args.json, settings, label=f"--json {args.json}", force=args.force,
                     ours=_is_ranking, inputs=[(args.profile, "the profile")])
    overrides = {}
    if args.speed is not None:
        overrides["traffic.speed"] = args.speed
    if args.sla_ms is not None:
        overrides["sla.latency_ms"] = args.sla_ms
    if args.price is not None:  # one server's price, whatever the study's GPUs per server multiplied
        overrides.update({"cost.price_per_hour": args.price, "cost.gpus_per_server": 1})
    if overrides:
        settings = with_overrides(settings, overrides)
    profile = read_profile(args.profile, model=settings.model)  # another model's times would rank nothing
    if stale := stale_profile(profile.model_digest, settings, base, where=f"--profile {args.profile}"):
        print(f"note: {stale}", file=sys.stderr)
    traffic = study_traffic(settings)
    settings, notes = check_traffic(settings, base, traffic)  # what tune refuses, and its space narrowed
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.traffic_scale is not None:
        traffic = scale_time(traffic, args.traffic_scale)
    price = price_for(settings.cost, source=settings.source).price_per_hour

    model = search.model_space(settings, base=base, traffic=traffic, profile=profile, every_batch_size=not args.grid,
                               price_per_hour=price)
    sim, values = model.simulator, model.values()
    pct = percentile_key(settings.sla.percentile)  # 100: max
    print(f"profile: {args.profile}: {profile.describe()}")
    beyond = model.extrapolated()
    if beyond:
        print(f"note: {beyond}", file=sys.stderr)
    print(f"traffic: {settings.traffic.path} ({len(traffic)} requests"
          + (f", timestamps compressed {args.traffic_scale:g}x" if args.traffic_scale else "")
          + f"), load at speed {settings.traffic.speed:g} = {sim.rate * settings.traffic.speed:.1f} req/s mean, "
          f"{sim.peak_rps:.0f} req/s peak")
    print(f"SLA: {pct} <= {settings.sla.latency_ms:g} ms, errors <= {settings.sla.max_error_rate:.2%}; "
          f"price ${price:g}/h; scoring: {settings.scoring}; space: {len(model.configs)} configurations "
          f"({', '.join(f'{k} {_span(v)}' for k, v in values.items())})")
    with tqdm(total=len(model.configs) + (not model.incumbent_in_space()), desc="simulate", unit="config",
              file=sys.stderr, leave=False, dynamic_ncols=True, disable=args.quiet) as bar:
        ranking = model.rank(tolerance=args.tolerance, on_config=lambda done, total: bar.update(1))
        table = model.against_incumbent(ranking, tolerance=args.tolerance)
        bar.update(len(table) - len(ranking))
    table["latency_sla_ms"] = table[f"latency_{pct}_ms"]
    shown = table[(table["rank"] <= args.top) | (table["tag"] != "")]
    print(_format(shown, pct, values))
    capped = sim.capped_by_traffic(table)
    if capped:  # ties at the traffic's limit are not a ranking: said before the best is named
        print(f"note: {capped}", file=sys.stderr)

    best = table.iloc[0]
    feasible = search.met_sla_in_simulation(table)
    if feasible:
        gain = f", {best['vs_incumbent']:+.1%} over the incumbent" if math.isfinite(best["vs_incumbent"]) else \
            f" (the incumbent misses the SLA{_reason(table)})"
        print(f"best: {_params(best, settings)}: capacity {best['capacity_rps']:.1f} req/s, "
              f"{best['value']:,.0f} requests per dollar ({settings.scoring}){gain}")
    if args.json:
        data = {"study": settings.source, "profile": str(args.profile), "scoring": settings.scoring,
                "sla": {"latency_ms": settings.sla.latency_ms, "percentile": settings.sla.percentile,
                        "max_error_rate": settings.sla.max_error_rate},
                "price_per_hour": price, "load_speed": settings.traffic.speed,
                "traffic_scale": args.traffic_scale or 1.0, "rate_rps_at_speed_1": sim.rate,
                "incumbent": model.incumbent, "ranking": table.drop(columns=["latency_sla_ms"]).to_dict("records")}
        write_atomic(args.json, json.dumps(json_safe(data), indent=2, default=str) + "\n", label=f"--json {args.json}")
    if not feasible:
        print(f"tuner: no configuration met the SLA in simulation (closest: {_params(best, settings)}: "
              f"{best['sla_reason']})", file=sys.stderr)
        return 3
    return 0


def check_base(settings):
    """The study's base config (the incumbent), once it passes what `tuner tune --check` checks of it
    (tuner.tune.prepare): Triton's rules, the model directory Triton loads it from, a dynamic batcher to
    tune, no setting the simulation does not model. Simulate and profile call it before anything else:
    a configuration Triton refuses is never ranked, nor a minute spent profiling it."""
    from tuner import search, space
    from tuner.study import checked_base

    path = Path(settings.model_repository) / settings.model / "config.pbtxt"
    base = checked_base(settings)
    space.check_tunable(base, str(path), search=settings.search)
    search.check_simulatable(settings, base)
    return base


def check_output(path, settings, *, label: str, force: bool, ours: Callable[[Path], bool],
                 inputs: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse (OutputError, one line starting with `label`) to write `path` over one of the study's
    inputs (the study file, its traffic, a file of its model's directory, or `inputs`: (path, what)),
    or where the study's traffic (a directory, a glob) would take it for one more traffic file,
    whatever `force` says; and over any other existing file unless `ours(path)` (tuner wrote it) or
    `force` (tuner.files.check_replaceable). Nothing is read beyond what `ours` reads, nothing written."""
    from tuner.files import check_replaceable
    from tuner.study import check_not_in_model, check_not_input

    path = Path(path)
    check_not_input(path, label=label, study_file=settings.source, traffic=settings.traffic.path, inputs=inputs)
    check_not_in_model(path, settings, label=label)
    if not os.path.lexists(path):
        return
    check_replaceable(path, force=force, label=label, ours=ours)


def _is_ranking(path: Path) -> bool:
    """Whether `path` holds a ranking `tuner simulate --json` wrote (a JSON object with its keys)."""
    return json_with_keys(path, {"study", "profile", "ranking"})


def _reason(table) -> str:
    """`: <why>` for the incumbent's row of the ranking, or '' when it has none."""
    rows = table[table["tag"].str.contains("incumbent")]
    reason = rows["sla_reason"].iloc[0] if len(rows) and "sla_reason" in rows else ""
    return f": {reason}" if isinstance(reason, str) and reason else ""


def _format(table, pct: str, values: dict) -> str:
    from tuner import space

    knobs = [k for k in space.NAMES if k in table.columns and (k in values or table[k].nunique() > 1)]
    cols = ["rank", "tag", *knobs, *(c for c in SHOWN if c in table.columns and c not in ("rank", "tag"))]
    headings = {**{c: h.format(pct=pct) for c, h in SHOWN.items()}, **{k: space.LABELS[k] for k in knobs}}
    out = table[cols].rename(columns=headings).copy()
    formats = {
        "capacity req/s": "{:.1f}", f"{pct} ms at load": "{:.1f}", "fill rate": "{:.2f}", "busy s": "{:.2f}",
        "req/$ (capacity)": "{:,.0f}", "req/$ (utilization)": "{:,.0f}", "vs incumbent": "{:+.1%}",
    }
    for col, fmt in formats.items():
        if col in out.columns:
            out[col] = [("-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v))
                        for v in out[col]]
    out["rank"] = ["-" if r == 0 else str(r) for r in out["rank"]]
    return out.to_string(index=False)


def _params(row, settings) -> str:
    from tuner import space

    return space.describe(space.from_row(row, space.tuned(settings.search)))


def _span(values: list) -> str:
    if all(isinstance(v, int) for v in values) and len(values) > 2:
        return f"{values[0]}..{values[-1]} ({len(values)} values)"
    return ",".join(map(str, values))
