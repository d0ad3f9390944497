"""`tuner traffic stats|import|synth|window|scale|convert`: thin wrappers over `tuner.traffic`."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner import traffic
from tuner.errors import TrafficError

SYNTH_KINDS = ("poisson", "diurnal", "bursty", "flash-crowd")
IMPORT_KINDS = ("triton", "azure", "csv")


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "traffic",
        help="inspect, import, synthesize and cut recorded traffic profiles",
        description="Recorded traffic profiles: one row per request (timestamp, batch_size, shape "
        "columns such as seq_len, optional model), as CSV or Parquet.",
    )
    group.set_defaults(func=lambda args: _help(group))
    sub = group.add_subparsers(dest="traffic_command", metavar="COMMAND")

    p = sub.add_parser(
        "stats",
        help="summary statistics of a profile",
        description="Requests, duration, mean and peak rates, inter-arrival CV, size "
        "percentiles and the busiest window of a traffic profile, as a table.",
    )
    p.add_argument("input", help="traffic file (.csv or .parquet)")
    p.add_argument("--busiest", default="60", metavar="D", help="busiest-window length (default 60s)")
    p.add_argument(
        "--plot", metavar="FILE.png", help="also draw the rate over time and the inter-arrival histogram"
    )
    p.set_defaults(func=_stats)

    p = sub.add_parser(
        "import",
        help="turn other records into a traffic profile",
        description="Import a Triton trace file (level=TIMESTAMPS), the Azure LLM trace "
        "CSV, or any CSV/Parquet table with a column mapping.",
    )
    p.add_argument("kind", choices=IMPORT_KINDS, help="triton | azure | csv")
    p.add_argument("input", help="the file to import")
    p.add_argument("-o", "--output", required=True, help="traffic file to write (.csv or .parquet)")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="OURS=THEIRS",
        help="csv: our column from the file's column, e.g. --map timestamp=ts --map seq_len=tokens",
    )
    p.add_argument(
        "--time-unit",
        default="s",
        choices=sorted(traffic.importers.TIME_UNITS),
        help="csv: unit of numeric times (default s)",
    )
    p.add_argument(
        "--include-children",
        action="store_true",
        help="triton: keep requests sent by ensembles / BLS models too",
    )
    p.set_defaults(func=_import)

    p = sub.add_parser(
        "synth",
        help="make a synthetic traffic profile (seeded)",
        description="Synthetic arrivals (poisson, diurnal, bursty on/off, flash-crowd) with "
        "constant, Zipf or lognormal sizes; the same arguments and seed give the same file.",
    )
    p.add_argument("kind", choices=SYNTH_KINDS)
    p.add_argument(
        "--rate",
        type=float,
        required=True,
        help="requests/s: the rate (poisson), mean rate (diurnal, bursty) or base rate (flash-crowd)",
    )
    p.add_argument("--duration", required=True, metavar="D", help="length, e.g. 60, 60s, 10m, 7d")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="COLUMN=SPEC",
        help="size of a column: constant:N | zipf:a=A,max=M | lognormal:median=M,sigma=S,max=X[,min=Y] "
        "(e.g. --size seq_len=lognormal:median=200,sigma=0.7,max=512; batch_size defaults to constant:1)",
    )
    p.add_argument("--period", default="1d", metavar="D", help="diurnal: length of a day (default 1d)")
    p.add_argument("--amplitude", type=float, default=0.6, help="diurnal: relative swing, 0..1 (default 0.6)")
    p.add_argument("--on-fraction", type=float, default=0.2, help="bursty: share of time in bursts (0.2)")
    p.add_argument("--mean-on", default="0.5", metavar="D", help="bursty: mean burst length (0.5s)")
    p.add_argument("--off-ratio", type=float, default=0.05, help="bursty: quiet rate / mean rate (0.05)")
    p.add_argument("--peak-factor", type=float, default=10.0, help="flash-crowd: peak / base rate (10)")
    p.add_argument("--spike-at", default=None, metavar="D", help="flash-crowd: ramp start (a third in)")
    p.add_argument("--ramp", default="5", metavar="D", help="flash-crowd: ramp length (5s)")
    p.add_argument("--hold", default="10", metavar="D", help="flash-crowd: time at the peak (10s)")
    p.add_argument("--decay", default="10", metavar="D", help="flash-crowd: decay time constant (10s)")
    p.add_argument("-o", "--output", required=True, help="traffic file to write (.csv or .parquet)")
    p.set_defaults(func=_synth)

    p = sub.add_parser(
        "window",
        help="cut a time window out of a profile",
        description="Keep the requests of one window: from --start for --duration (seconds "
        "from the first request), or the busiest window of a given length.",
    )
    p.add_argument("input")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--start", metavar="T", help="window start, from the first request (e.g. 300, 5m)")
    how.add_argument("--busiest", metavar="D", help="the busiest window of this length")
    p.add_argument("--duration", metavar="D", help="window length (with --start; default: to the end)")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=_window)

    p = sub.add_parser(
        "scale",
        help="compress or stretch a profile in time",
        description="Replay-speed scaling written to a file: request i moves to t0 + (t_i - t0) / speed.",
    )
    p.add_argument("input")
    p.add_argument("--speed", type=float, required=True, help="> 1 compresses, < 1 stretches")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=_scale)

    p = sub.add_parser(
        "convert",
        help="validate a profile and write it as CSV or Parquet",
        description="Read, validate and normalise a traffic file, and write it in the "
        "format its output suffix names (.csv or .parquet).",
    )
    p.add_argument("input")
    p.add_argument("-o", "--output", required=True)
    p.set_defaults(func=_convert)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _write(df, args: argparse.Namespace) -> int:
    """Write the result to --output, which the command checked with check_output before its work."""
    out = Path(args.output)
    src = Path(args.input) if getattr(args, "input", None) else None
    if src is not None and out.exists() and src.exists() and out.resolve() == src.resolve():
        raise TrafficError(f"{out}: refusing to overwrite the input file; choose another output")
    traffic.write_traffic(df, out)
    print(f"wrote {out}: {len(df):,} requests")
    return 0


def _stats(args: argparse.Namespace) -> int:
    if args.plot:
        traffic.check_plot_path(args.plot)
    df = traffic.read_traffic(args.input)
    print(
        traffic.format_stats(
            traffic.describe(df, traffic.parse_duration(args.busiest, "--busiest")), args.input
        )
    )
    if args.plot:
        traffic.plot_stats(df, args.plot, title=Path(args.input).name)
        print(f"plot: {args.plot}")
    return 0


def _import(args: argparse.Namespace) -> int:
    traffic.check_output(args.output)
    if args.kind == "triton":
        df = traffic.import_triton_trace(args.input, include_children=args.include_children)
    elif args.kind == "azure":
        df = traffic.import_azure(args.input)
    else:
        mapping = {}
        for item in args.map:
            ours, eq, theirs = item.partition("=")
            if not eq or not ours.strip() or not theirs.strip():
                raise TrafficError(f"--map {item!r}: expected OURS=THEIRS, e.g. --map timestamp=ts")
            mapping[ours.strip()] = theirs.strip()
        df = traffic.import_csv(args.input, mapping, time_unit=args.time_unit)
    return _write(df, args)


def _synth(args: argparse.Namespace) -> int:
    traffic.check_output(args.output)
    sizes = {}
    for item in args.size:
        col, eq, spec = item.partition("=")
        if not eq or not col.strip():
            raise TrafficError(f"--size {item!r}: expected COLUMN=SPEC, e.g. --size seq_len=constant:128")
        sizes[col.strip()] = traffic.SizeSpec.parse(spec)
    d = traffic.parse_duration
    duration = d(args.duration, "--duration")
    common = {"duration_s": duration, "seed": args.seed, "sizes": sizes}
    if args.kind == "poisson":
        df = traffic.synth_poisson(args.rate, **common)
    elif args.kind == "diurnal":
        df = traffic.synth_diurnal(
            args.rate, period_s=d(args.period, "--period"), amplitude=args.amplitude, **common
        )
    elif args.kind == "bursty":
        df = traffic.synth_bursty(
            args.rate,
            on_fraction=args.on_fraction,
            mean_on_s=d(args.mean_on, "--mean-on"),
            off_ratio=args.off_ratio,
            **common,
        )
    else:
        spike = None if args.spike_at is None else d(args.spike_at, "--spike-at")
        df = traffic.synth_flash_crowd(
            args.rate,
            peak_factor=args.peak_factor,
            spike_at_s=spike,
            ramp_s=d(args.ramp, "--ramp"),
            hold_s=d(args.hold, "--hold"),
            decay_s=d(args.decay, "--decay"),
            **common,
        )
    args.input = None
    return _write(df, args)


def _window(args: argparse.Namespace) -> int:
    traffic.check_output(args.output)
    df = traffic.read_traffic(args.input)
    if args.busiest is not None:
        if args.duration is not None:
            raise TrafficError("--duration goes with --start; --busiest D already sets the length")
        length = traffic.parse_duration(args.busiest, "--busiest")
        start, count = traffic.busiest_window(df, length)
        print(
            f"busiest {length:g} s window starts {start:.3f} s after the first request ({count:,} requests)"
        )
    else:
        start = traffic.parse_duration(args.start, "--start")
        length = None if args.duration is None else traffic.parse_duration(args.duration, "--duration")
    return _write(traffic.window(df, start, length), args)


def _scale(args: argparse.Namespace) -> int:
    traffic.check_output(args.output)
    return _write(traffic.scale_time(traffic.read_traffic(args.input), args.speed), args)


def _convert(args: argparse.Namespace) -> int:
    traffic.check_output(args.output)
    return _write(traffic.read_traffic(args.input), args)
