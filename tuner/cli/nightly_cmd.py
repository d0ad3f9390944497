"""`tuner nightly NIGHTLY.yaml [--check]`, `tuner nightly --history NIGHTLY.yaml|OUTPUT_DIR`: the nightly
retuning job."""

from __future__ import annotations

import argparse
from pathlib import Path

from tuner.cli._args import add_command, add_flag, add_input, add_textfile, check_textfile_output


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner nightly` to `subparsers`."""
    p = add_command(
        subparsers,
        "nightly",
        run=run,
        help="retune on the newest traffic and propose a change only when an A/B confirmation shows it",
        description="Take the newest traffic, compare it with the previous run's (drift table), run a "
        "search warm-started from the previous night, confirm the best candidate against production "
        "(A/B/A/B... on tonight's traffic) and write the decision, the proposed config.pbtxt (a model vLLM "
        "serves: its engine knobs, streamed replays scored in output tokens per dollar, the proposed model.json) "
        "and its diff, a Markdown summary and a history line into a dated run directory. Exit codes: 0 keep, 10 change "
        "proposed, 3 SLA unmeetable, 2 bad input, 1 error (another run holds the lock, server failure).",
    )
    add_input(p, "nightly", kind="file or directory", metavar="NIGHTLY.yaml",
              help="the nightly settings (or, with --history, its output directory; --textfile needs the "
              "settings)")
    add_flag(p, "--history", "show the history of past nights as a table (checks and runs nothing: not with --check)")
    add_flag(p, "--check", "a dry run: check the nightly settings, its study with the overrides (as tune --check "
             "does: its price, tonight's traffic as the replays take it), production's config, tonight's "
             "traffic and the output directory; start nothing")
    add_textfile(p, "the night's verdict (with --history: the last night's) and when it ran")
    add_flag(p, "--force", "replace a --textfile file that tuner did not write (the study's and the night's "
             "inputs are never replaced)")


def run(args: argparse.Namespace) -> int:
    """Run one night (or show the history, or check the settings) and print it; the night's exit code."""
    from tuner.errors import InputError, SettingsError
    from tuner.nightly import check_history_output, format_history, load_nightly, read_history

    if args.history and args.check:  # refused, not ignored: a --check that checked nothing would say ok
        raise SettingsError("--check: checks a night before it runs; --history shows past nights and checks "
                            "nothing: give one of them")
    if args.textfile and Path(args.nightly).is_dir():
        raise InputError(f"--textfile: give NIGHTLY.yaml, not its output directory {args.nightly} "
                         "(the metrics' labels come from its study)")
    if args.history:
        target = Path(args.nightly)
        settings = None if target.is_dir() else load_nightly(target)
        if settings is None:
            check_history_output(target)
        study = _check_textfile(args, settings)
        nights = read_history(target if settings is None else Path(settings.output))
        print(format_history(nights))
        if args.textfile and nights:
            _write_textfile(args.textfile, study, nights[-1])
        return 0
    settings = load_nightly(args.nightly)
    study = _check_textfile(args, settings)  # before the night: its figures would have nowhere to go
    if args.check:
        from tuner.nightly.job import check_night

        rows = check_night(settings)
        width = max(len(what) for what, _ in rows)
        print("\n".join(f"{what:<{width}}  {value}" for what, value in rows))
        print(f"\n{args.nightly}: ok (nothing was started)")
        return 0
    from tuner.nightly.engine import real_engine
    from tuner.nightly.job import run_night

    result = run_night(settings, real_engine)
    print((result.run_dir / "summary.md").read_text())
    print(f"run directory: {result.run_dir}")
    if args.textfile:
        _write_textfile(args.textfile, study, result.entry)
    return result.exit_code


def _check_textfile(args: argparse.Namespace, settings):
    """The nightly's study (None without --textfile), once --textfile may be written: audit's rules
    (never over the study's or the night's inputs nor into the model's directory; another file only
    if tuner wrote it, or with --force)."""
    from tuner.errors import TrafficError
    from tuner.nightly.intake import joins_tonight, traffic_files
    from tuner.nightly.settings import read_study_for

    if not args.textfile:
        return None
    study = read_study_for(settings)
    inputs = [(settings.source, "the nightly settings"), (settings.production, "production's config")]
    try:
        inputs += [(str(f), "tonight's traffic") for f in traffic_files(settings.traffic.path,
                                                                         settings.traffic.pattern)]
    except TrafficError:
        pass  # the night says why in its own line (--history reads none)
    check_textfile_output(args.textfile, study, force=args.force, inputs=inputs)
    if joins_tonight(args.textfile, settings.traffic.path, settings.traffic.pattern):
        from tuner.errors import OutputError

        raise OutputError(f"--textfile {args.textfile}: among tonight's traffic files ({settings.traffic.path}, "
                          f"{settings.traffic.pattern!r}): the next night would read it as traffic; refusing to "
                          "write it there")
    return study


def _write_textfile(path: str, study, entry: dict) -> None:
    """The night's verdict as Prometheus metrics, labelled with its study's model and GPU; a generative
    model's night scores output tokens, written as their own series (never as requests per dollar)."""
    from tuner.production import labels_for, nightly_families, write_textfile

    write_textfile(path, nightly_families(entry, labels_for(study)))
