"""`tuner profile STUDY.yaml [-o profile.csv]`: measure the model's execution time by rows and padded
length on the study's server, for `tuner simulate`."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from tuner.cli._args import Number, add_command, add_flag, add_numbers, add_output_file, add_quiet, add_study

PROFILE = "profile.csv"

# The profile's limits and counts; run() checks each is >= 1 when given.
MAX_ROWS = Number("--max-batch-size", "N",
                  "the largest rows to measure (default: the space's largest, search.max_batch_size.high)")
COUNTS = (
    MAX_ROWS,
    Number("--max-length", "N", "the model truncates inputs to N tokens (default: its config's "
           "max_sequence_length parameter if it has one, else no truncation)"),
    Number("--repeats", "N", "measured requests per point, after one that is not measured (default 7)"),
    Number("--concurrent-executions", "N", "executions the device runs at once (default: measured with the "
           "space's largest instance_count when it is above 1, else 1; 1: instances share one device and take "
           "turns on it, as a GPU shared by instances does; N for N devices or a device that truly runs N at "
           "once)"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner profile` to `subparsers`."""
    p = add_command(
        subparsers,
        "profile",
        run=run,
        help="measure the model's execution time by rows x padded length (the profile tuner simulate uses)",
        description="Start the study's server, load the model with the space's largest max_batch_size, no "
        "queue delay and one instance, warm it up as a trial is, then send one request of each (rows, padded "
        "length) alone, a few times, and read each execution's time from Triton's statistics: device time "
        "(compute_infer, median and p10-p90), host time (compute_input + compute_output), the per-request "
        "overhead outside the model, and where the model runs out of memory; when the space tries several "
        "instances, how many executions run at once. Prints the table and writes "
        "the profile CSV (format: tuner/simulate/_profile.py). The model's config and the traffic are checked first "
        "as `tuner tune --check` checks them, with the settings the simulation refuses. The profile replaces only a profile tuner "
        "wrote (else --force), never one of the study's inputs. Exit codes: 0 done, 2 bad input.",
    )
    add_study(p, "the study file (model, server, traffic, search space)")
    add_output_file(p, metavar="PROFILE.csv",
                    help=f"where to write the profile, in a directory that exists (default: the study's output "
                    f"directory/{PROFILE}, made if needed)")
    add_numbers(p, COUNTS, type=int)
    add_flag(p, "--force", "replace a file at the profile's place that tuner did not write (the study's own "
             "inputs are never replaced)")
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    """Measure the model's profile on the study's server, print it and write the profile CSV; exit 0."""
    import json

    from tqdm import tqdm

    from tuner.cli.simulate_cmd import check_base, check_output
    from tuner.errors import SettingsError
    from tuner.files import check_output_dir, check_writable, write_atomic
    from tuner.modelconfig import to_json
    from tuner.profiler import REPEATS, describe_split, largest_rows, measure_profile, request_table, table
    from tuner.replay import ignored_columns
    from tuner.server import make_launcher
    from tuner.settings import read_study
    from tuner.simulate import length_column, profile_text
    from tuner.study import study_traffic
    from tuner.tune import check_traffic

    for count in COUNTS:
        value = getattr(args, count.dest)
        if value is not None and value < 1:
            raise SettingsError(f"{count.flag}: must be >= 1, got {value}")
    from tuner import space
    from tuner.study import check_batcher_study

    settings = read_study(args.study)
    check_batcher_study(settings, "profile")
    # the space's ranges within their knobs' bounds, as tune checks them (a range of 1e11 batch sizes
    # would be listed, or profiled, before anything is refused)
    space.study_space(settings.search, vllm=False, source=settings.source or args.study)
    base = check_base(settings)  # a config Triton or the simulation refuses: before a minute of measuring
    output = Path(args.output) if args.output else Path(settings.output) / PROFILE
    check_output(output, settings, label=f"profile {output}", force=args.force, ours=_is_profile)
    if not args.output:  # the study's own output directory is made, as tune makes it
        check_output_dir(output.parent, "output directory")
    # a file a person names goes where a directory is already, as every --json's does
    check_writable(output, label=f"profile {output}")  # before a minute of work, not after
    traffic = study_traffic(settings)
    settings, notes = check_traffic(settings, base, traffic)  # a profile of traffic tune refuses serves nothing
    for note in notes:  # what tune would say of this traffic (a narrowed space, a column no input takes)
        print(f"note: {note}", file=sys.stderr)
    column = length_column(traffic)
    if column is not None and column in ignored_columns(json.loads(to_json(base)), traffic.columns):
        column = None  # the requests take no length from it (the note above): one length, not six
    max_rows = getattr(args, MAX_ROWS.dest)
    mbs = largest_rows(settings, max_rows or None)
    print(f"profile: {settings.model} on the {settings.server.launcher} server, rows up to {mbs}"
          + (f", lengths from the traffic's {column!r}" if column else ", no length column"), file=sys.stderr)
    m = settings.measurement
    bars: dict = {}
    bar_style = {"file": sys.stderr, "leave": False, "dynamic_ncols": True}

    def window(_ms: float) -> None:  # the warm-up's windows, at most warmup_max_s of them
        if "warm-up" not in bars:
            bars["warm-up"] = tqdm(total=math.ceil(m.warmup_max_s / m.window_s), desc="warm-up", unit="window",
                                   **bar_style)
        bars["warm-up"].update(1)

    def progress(done: int, total: int, what: str) -> None:
        if "warm-up" in bars:
            bars.pop("warm-up").close()
        if "profile" not in bars:
            bars["profile"] = tqdm(total=total, desc="profile", unit="point", **bar_style)
        bar = bars["profile"]
        bar.total = total  # counted up front at its most, it only falls (tuner.profiler.most_points)
        bar.update(done - bar.n)
        bar.set_postfix_str(what)

    try:
        with make_launcher(settings) as launcher:
            result = measure_profile(launcher, settings, traffic, base=base, length_column=column,
                                     max_rows=max_rows, max_length=args.max_length,
                                     repeats=args.repeats or REPEATS,
                                     concurrent_executions=args.concurrent_executions,
                                     on_progress=None if args.quiet else progress,
                                     on_window=None if args.quiet else window)
    finally:
        for bar in bars.values():
            bar.close()
    # a length's bisection stops at its first failing rows: the rows above it are never sent (they would fail
    # too), and the rows it tried are blank at the other lengths; said, else a blank reads as fitting
    print(f"device time per execution (Triton's compute_infer), ms: median (p10-p90) of "
          f"{args.repeats or REPEATS} requests; OOM: out of memory"
          + ("; blank: not measured at that length (more rows than an OOM there, which run out of memory too, "
             "or rows tried only where another length's memory limit was searched)"
             if result.profile.oom_rows else ""))
    padded = ", ".join(map(str, result.padded_lengths)) or "none"
    print(f"lengths measured: {', '.join(map(str, result.lengths))} (the requests' quantiles and the incumbent's "
          f"simulated padded lengths: {padded}, but for those within 15 % of another)")
    print(table(result))
    requests = request_table(result)
    if requests:
        print("batches of N separate one-row requests vs one request of N rows (execution, ms):")
        print(requests)
    for line in describe_split(result):
        print(line)
    for note in result.notes:
        print(f"note: {note}")
    write_atomic(output, profile_text(result.profile), label=f"profile {output}")
    print(f"wrote {output}: {result.profile.describe()} ({result.seconds:.0f} s)")
    return 0


def _is_profile(path: Path) -> bool:
    """Whether `path` holds a profile tuner wrote (its first line is the format's)."""
    from tuner.simulate import FORMAT_LINE

    with open(path, "rb") as fh:
        return fh.read(len(FORMAT_LINE)) == FORMAT_LINE.encode()
