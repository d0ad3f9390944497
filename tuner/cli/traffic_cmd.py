"""`tuner traffic stats|import|synth|window|fit|scale|convert`: thin wrappers over `tuner.traffic`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

from tuner.cli._args import Run, add_command, add_flag, add_group, add_input, add_output_file, finite_float
from tuner.errors import TrafficError

SYNTH_KINDS = ("poisson", "diurnal", "bursty", "flash-crowd")
IMPORT_KINDS = ("triton", "azure", "csv")


class SynthParam(NamedTuple):
    """An option of `traffic synth` that one kind of traffic takes, passed on to its synth_* function."""

    flag: str
    kind: str
    default: str | float | None
    help: str
    duration: bool = False  # given as D (e.g. 5m), passed in seconds, as <name>_s

    def declare(self, parser: argparse.ArgumentParser) -> None:
        """Add the option to `parser`."""
        # no argparse default: an option given to another kind is told from one left out (`given`)
        if self.duration:
            parser.add_argument(self.flag, metavar="D", help=self.help)
        else:
            parser.add_argument(self.flag, type=finite_float, help=self.help)

    def given(self, args: argparse.Namespace) -> bool:
        """Whether the command line holds the option."""
        return getattr(args, self.flag.removeprefix("--").replace("-", "_")) is not None

    def value(self, args: argparse.Namespace) -> tuple[str, float | None]:
        """The synth_* keyword and its value from the parsed arguments (its default where not given)."""
        from tuner import traffic

        name = self.flag.removeprefix("--").replace("-", "_")
        given = self.default if getattr(args, name) is None else getattr(args, name)
        if not self.duration:
            return name, given
        return f"{name}_s", None if given is None else traffic.parse_duration(given, self.flag)


SYNTH_PARAMS = (
    SynthParam("--period", "diurnal", "1d", "diurnal: length of a day (default 1d)", duration=True),
    SynthParam("--amplitude", "diurnal", 0.6, "diurnal: relative swing, 0..1 (default 0.6)"),
    SynthParam("--on-fraction", "bursty", 0.2, "bursty: share of time in bursts (0.2)"),
    SynthParam("--mean-on", "bursty", "0.5", "bursty: mean burst length (0.5s)", duration=True),
    SynthParam("--off-ratio", "bursty", 0.05, "bursty: quiet rate / mean rate (0.05)"),
    SynthParam("--peak-factor", "flash-crowd", 10.0, "flash-crowd: peak / base rate (10)"),
    SynthParam("--spike-at", "flash-crowd", None, "flash-crowd: ramp start, within --duration (a third in)",
               duration=True),
    SynthParam("--ramp", "flash-crowd", "5", "flash-crowd: ramp length (5s)", duration=True),
    SynthParam("--hold", "flash-crowd", "10", "flash-crowd: time at the peak (10s)", duration=True),
    SynthParam("--decay", "flash-crowd", "10", "flash-crowd: decay time constant (10s)", duration=True),
)

TRAFFIC_FILE = "traffic file to write (.csv or .parquet)"
FORCE_HELP = "replace {what} file that already exists (never the input)"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner traffic` and its subcommands to `subparsers`."""
    sub = add_group(
        subparsers, "traffic", help="recorded traffic profiles: stats, import, synth, window, fit, scale, convert",
        description="Recorded traffic profiles: one row per request (timestamp, batch_size, shape "
        "columns such as seq_len, optional model), as CSV or Parquet.",
    )
    for declare in (_stats_command, _import_command, _synth_command, _window_command, _fit_command,
                    _scale_command, _convert_command):
        declare(sub)


def _file_command(
    sub: argparse._SubParsersAction, name: str, *, run: Run, help: str, description: str,
    input_help: str | None = None, recording: bool = False,
) -> argparse.ArgumentParser:
    """Subcommand `name`, which reads one traffic file, INPUT (`args.input`); with `recording`, a
    file, a directory of files or a glob pattern, read out of core (tuner.traffic.recording), which
    checks the paths itself."""
    p = add_command(sub, name, run=run, help=help, description=description)
    add_input(p, "input", what="a traffic file", help=input_help, each=recording)
    return p


RECORDING_HELP = ("traffic file (.csv or .parquet), a directory of them or a quoted glob (e.g. 'logs/*.parquet'), "
                  "read as one recording a row group at a time")


def _open(args: argparse.Namespace):
    """The recording INPUT names, its notes (overlapping files and how they were combined) printed."""
    from tuner.traffic.recording import open_recording

    rec = open_recording(args.input, progress=True)
    for note in rec.notes:
        print(f"note: {note}")
    return rec


def _stats_command(sub: argparse._SubParsersAction) -> None:
    p = _file_command(
        sub, "stats", run=_stats, help="summary statistics of a profile",
        description="Requests, duration, mean and peak rates, inter-arrival CV, size "
        "percentiles and the busiest window of a traffic profile, as a table; computed a row group at "
        "a time, so a week of hourly Parquet files needs no more memory than an hour.",
        input_help=RECORDING_HELP, recording=True,
    )
    p.add_argument("--busiest", default="60", metavar="D", help="busiest-window length (default 60s)")
    add_output_file(p, flags=("--plot",), metavar="FILE.png",
                    help="also draw the rate over time and the inter-arrival histogram")
    add_flag(p, "--force", FORCE_HELP.format(what="a --plot"))


def _import_command(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "import", run=_import, help="turn other records into a traffic profile",
        description="Import a Triton trace file (level=TIMESTAMPS; with level=TENSORS too, each request's "
        "batch_size and <INPUT>:<k> shape columns come from its traced input tensors, else batch_size 1 is "
        "assumed and said), the Azure LLM trace CSV, or any CSV/Parquet table with a column mapping. "
        "--map and --time-unit are csv's options, --include-children and --model triton's: given to another kind, "
        "they are refused.",
    )
    p.add_argument("kind", choices=IMPORT_KINDS, help="triton | azure | csv")
    add_input(p, "input", each=True, help="the file to import")
    _add_output(p, help=TRAFFIC_FILE)
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="OURS=THEIRS",
        help="csv: our column (timestamp, batch_size, model, seq_len, prompt_tokens, output_tokens, prefix_id, "
        "or INPUT:K for dim K of a model input) from the file's, e.g. --map timestamp=ts --map seq_len=tokens; "
        "the file's columns already named so are kept as they are",
    )
    p.add_argument(
        "--time-unit",
        default=None,  # None: not given (refused for another kind), read as s
        help="csv: unit of numeric times: s, ms, us or ns (default s)",
    )
    add_flag(p, "--include-children", "triton: keep requests sent by ensembles / BLS models too")
    p.add_argument("--model", default=None, metavar="NAME",
                   help="triton: keep only this model's requests (a trace of several models keeps only the shape "
                        "columns every request has; one model's keep its own)")


def _synth_command(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub, "synth", run=_synth, help="make a synthetic traffic profile (seeded)",
        description="Synthetic arrivals (poisson, diurnal, bursty on/off, flash-crowd) with "
        "constant, Zipf or lognormal sizes; the same arguments and seed give the same file.",
    )
    p.add_argument("kind", choices=SYNTH_KINDS)
    p.add_argument(
        "--rate",
        type=finite_float,
        required=True,
        help="requests/s: the rate (poisson), mean rate (diurnal, bursty) or base rate (flash-crowd)",
    )
    p.add_argument("--duration", required=True, metavar="D", help="length, e.g. 60, 60s, 10m, 7d")
    p.add_argument("--seed", type=int, default=0, help="0..4294967295 (default 0)")
    p.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="COLUMN=SPEC",
        help="size of a column: constant:N | zipf:a=A,max=M | lognormal:median=M,sigma=S,max=X[,min=Y] "
        "(e.g. --size seq_len=lognormal:median=200,sigma=0.7,max=512; batch_size defaults to constant:1)",
    )
    for param in SYNTH_PARAMS:
        param.declare(p)
    _add_output(p, help=TRAFFIC_FILE)


def _window_command(sub: argparse._SubParsersAction) -> None:
    p = _file_command(
        sub, "window", run=_window, help="cut a time window out of a profile",
        description="Keep the requests of one window: from --start for --duration (seconds "
        "from the first request), from --since until --until (dates and times, naive ones UTC, or "
        "seconds on the recording's clock), or the busiest window of a given length (found by a scan "
        "of the timestamp column). Only the window's row groups are read.",
        input_help=RECORDING_HELP, recording=True,
    )
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--start", metavar="T", help="window start, from the first request (e.g. 300, 5m)")
    how.add_argument("--busiest", metavar="D", help="the busiest window of this length")
    how.add_argument("--since", metavar="T", help="window start, a date and time (e.g. 2026-11-25T06:00, UTC)")
    p.add_argument("--duration", metavar="D", help="window length (with --start; default: to the end)")
    p.add_argument("--until", metavar="T", help="window end, excluded (with --since; default: to the end)")
    _add_output(p)


def _fit_command(sub: argparse._SubParsersAction) -> None:
    p = _file_command(
        sub, "fit", run=_fit, help="keep the generative requests that fit a model's context",
        description="Keep the requests whose prompt_tokens + output_tokens fit a context of --context "
        "tokens: a trace recorded on a model of a longer context, replayed on one of a shorter (a study "
        "refuses traffic holding a request its engine cannot take). Says how many were left out.",
    )
    p.add_argument("--context", type=int, required=True, metavar="N", help="the model's context, in tokens")
    _add_output(p)


def _scale_command(sub: argparse._SubParsersAction) -> None:
    p = _file_command(
        sub, "scale", run=_scale, help="compress or stretch a profile in time",
        description="Replay-speed scaling written to a file: request i moves to t0 + (t_i - t0) / speed.",
    )
    p.add_argument("--speed", type=finite_float, required=True, help="> 1 compresses, < 1 stretches")
    _add_output(p)


def _convert_command(sub: argparse._SubParsersAction) -> None:
    p = _file_command(
        sub, "convert", run=_convert, help="validate a profile and write it as CSV or Parquet",
        description="Read, validate and normalise a traffic file, and write it in the "
        "format its output suffix names (.csv or .parquet).",
    )
    _add_output(p)


def _add_output(p: argparse.ArgumentParser, *, help: str | None = None) -> None:
    """`-o OUT`, the traffic file the command writes, and `--force` to replace one already there."""
    add_output_file(p, required=True, help=help)
    add_flag(p, "--force", FORCE_HELP.format(what="an -o"))


def _check_output(args: argparse.Namespace, *, recording: bool = False) -> None:
    """-o, checked before the work: a traffic file's suffix, a place a file can be made, not the input
    (with `recording`, none of the files of a directory or glob INPUT; not even with --force), and no
    file there unless --force: it may be the user's own recording."""
    from tuner import traffic
    from tuner.files import check_replaceable
    from tuner.paths import same_file
    from tuner.traffic.recording import recording_files

    out = traffic.check_output(args.output)
    given = getattr(args, "input", None)
    sources = [] if given is None else recording_files(given) if recording else [Path(given)]
    if any(same_file(out, s) for s in sources):
        raise TrafficError(f"{out}: refusing to overwrite the input file; choose another output")
    check_replaceable(out, force=args.force, error=TrafficError)


def _write(df, args: argparse.Namespace) -> int:
    """Write the result to --output, which the command checked with _check_output before its work."""
    from tuner import traffic

    out = Path(args.output)
    traffic.write_traffic(df, out)
    print(f"wrote {out}: {len(df):,} requests")
    return 0


def _stats(args: argparse.Namespace) -> int:
    from tuner import traffic
    from tuner.traffic.scan import describe_recording

    if args.plot:
        from tuner.files import check_replaceable

        traffic.check_plot_path(args.plot)
        check_replaceable(args.plot, force=args.force, error=TrafficError)
    busiest = traffic.parse_duration(args.busiest, "--busiest")
    rec = _open(args)
    print(traffic.format_stats(describe_recording(rec, busiest), args.input))
    if args.plot:
        import numpy as np
        import pandas as pd

        # the plot needs the times alone: 8 bytes a request
        times = pd.DataFrame({traffic.TIMESTAMP: np.concatenate(list(rec.times()))})
        traffic.plot_stats(times, args.plot, title=Path(args.input).name)
        print(f"plot: {args.plot}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from tuner import traffic

    _refuse_other_kinds(args)  # the arguments first, then the files
    mapping = _mapping(args.map)
    _check_output(args)
    if args.kind == "triton":
        notes: list[str] = []
        df = traffic.import_triton_trace(args.input, include_children=args.include_children, model=args.model,
                                         notes=notes)
        if df.empty:
            from tuner.errors import did_you_mean

            held = df.attrs.get("models", [])
            hint = did_you_mean(args.model, held)
            raise TrafficError(f"{args.input}: no traced requests of model {args.model!r} ("
                               + (f"{hint} " if hint else "") + f"the trace holds: {', '.join(held) or 'none'})")
        for note in notes:  # what the trace did not hold (batch sizes, shapes), said before the file is written
            print(f"note: {note}")
    elif args.kind == "azure":
        if _streams(args):
            from tuner.traffic.importers import AZURE_MAPPING

            return _import_streamed(args, AZURE_MAPPING)
        df = traffic.import_azure(args.input)
    else:
        from tuner.traffic.importers import left_out

        if dropped := left_out(args.input, mapping):  # a column of sizes no --map names would be lost unsaid
            print(f"note: columns left out (neither mapped nor named as ours): {', '.join(dropped)}; "
                  "--map OURS=THEIRS keeps one")
        if _streams(args):
            return _import_streamed(args, mapping)
        df = traffic.import_csv(args.input, mapping, time_unit=args.time_unit or "s")
    return _write(df, args)


# The options of one kind of import: given to another kind, one would be silently ignored.
KIND_OPTIONS = {"--map": "csv", "--time-unit": "csv", "--include-children": "triton", "--model": "triton"}


def _refuse_other_kinds(args: argparse.Namespace) -> None:
    for flag, kind in KIND_OPTIONS.items():
        given = getattr(args, flag.removeprefix("--").replace("-", "_"))
        if kind != args.kind and given not in (None, False, []):
            raise TrafficError(f"{flag} applies to 'traffic import {kind}' only, not to 'traffic import {args.kind}'")


def _mapping(items: list[str]) -> dict[str, str]:
    """`--map OURS=THEIRS ...` as {ours: theirs}."""
    mapping = {}
    for item in items:
        ours, eq, theirs = item.partition("=")
        if not eq or not ours.strip() or not theirs.strip():
            raise TrafficError(f"--map {item!r}: expected OURS=THEIRS, e.g. --map timestamp=ts")
        mapping[ours.strip()] = theirs.strip()
    return mapping


def _streams(args: argparse.Namespace) -> bool:
    """A CSV imported to Parquet is streamed, a million rows at a time (the input never held whole)."""
    return Path(args.input).suffix.lower() == ".csv" and Path(args.output).suffix.lower() in (".parquet", ".pq")


def _import_streamed(args: argparse.Namespace, mapping: dict[str, str]) -> int:
    from tuner.traffic.importers import import_csv_to_parquet

    out, src = Path(args.output), Path(args.input)
    rows = import_csv_to_parquet(src, out, mapping=mapping, time_unit=args.time_unit or "s")
    print(f"wrote {out}: {rows:,} requests")
    return 0


def _synth(args: argparse.Namespace) -> int:
    from tuner import traffic
    from tuner.traffic.synth import check_seed

    check_seed(args.seed, "--seed")
    for param in SYNTH_PARAMS:
        if param.kind != args.kind and param.given(args):
            raise TrafficError(f"{param.flag} applies to 'traffic synth {param.kind}' only, "
                               f"not to 'traffic synth {args.kind}'")
    _check_output(args)
    sizes = {}
    for item in args.size:
        col, eq, spec = item.partition("=")
        if not eq or not col.strip():
            raise TrafficError(f"--size {item!r}: expected COLUMN=SPEC, e.g. --size seq_len=constant:128")
        if col.strip() in sizes:
            raise TrafficError(f"--size {item!r}: {col.strip()} is given twice: give each column one --size")
        sizes[col.strip()] = traffic.SizeSpec.parse(spec)
    duration = traffic.parse_duration(args.duration, "--duration")
    common = {"duration_s": duration, "seed": args.seed, "sizes": sizes}
    shape = dict(param.value(args) for param in SYNTH_PARAMS if param.kind == args.kind)
    synth = getattr(traffic, f"synth_{args.kind.replace('-', '_')}")  # e.g. flash-crowd: synth_flash_crowd
    df = synth(args.rate, **shape, **common)
    return _write(df, args)


def _window(args: argparse.Namespace) -> int:
    from tuner import traffic
    from tuner.instants import parse_instant
    from tuner.traffic.scan import busiest_in, read_range, read_window

    _check_output(args, recording=True)
    if args.until is not None and args.since is None:
        raise TrafficError("--until goes with --since")
    if args.since is not None:
        if args.duration is not None:
            raise TrafficError("--duration goes with --start; with --since, give --until")
        since = parse_instant(args.since, "--since")
        until = None if args.until is None else parse_instant(args.until, "--until")
        return _write(read_range(_open(args), since, until), args)
    if args.busiest is not None:
        if args.duration is not None:
            raise TrafficError("--duration goes with --start; --busiest D already sets the length")
        length = traffic.parse_duration(args.busiest, "--busiest")
        rec = _open(args)
        start, count = busiest_in(rec, length)
        print(
            f"busiest {length:g} s window starts {start:.3f} s after the first request ({count:,} requests)"
        )
    else:
        start = traffic.parse_duration(args.start, "--start")
        length = None if args.duration is None else traffic.parse_duration(args.duration, "--duration")
        rec = _open(args)
    return _write(read_window(rec, start, length), args)


def _fit(args: argparse.Namespace) -> int:
    from tuner import traffic

    _check_output(args)
    table = traffic.read_traffic(args.input)
    kept = traffic.fit_context(table, args.context)
    print(f"{len(table) - len(kept):,} of {len(table):,} requests need more than {args.context:,} tokens: left out")
    return _write(kept, args)


def _scale(args: argparse.Namespace) -> int:
    from tuner import traffic

    _check_output(args)
    return _write(traffic.scale_time(traffic.read_traffic(args.input), args.speed), args)


def _convert(args: argparse.Namespace) -> int:
    from tuner import traffic

    _check_output(args)
    return _write(traffic.read_traffic(args.input), args)
