"""`tuner soak STUDY.yaml`: a long replay of the recorded traffic against one configuration, to find
capacity drift and say when to restart."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from pathlib import Path

from tuner.cli._args import (
    Number,
    add_assignments,
    add_command,
    add_flag,
    add_input,
    add_numbers,
    add_output_dir,
    add_quiet,
    add_study,
)
from tuner.errors import SettingsError, UnmeasuredError

EXIT_NO_DRIFT = 0
EXIT_DRIFT = 10


# How much recorded traffic the soak replays, how fast, in windows of how many minutes.
PACE = (
    Number("--hours", "H", "hours of recorded traffic to replay (default 12; at most 31 days of wall time: "
           "H/S <= 744)", default=12.0),
    Number("--speed", "S",
           "replay speed: H hours take H/S hours of wall time (default: the study's traffic.speed)"),
    Number("--window", "M", "minutes of wall time per window (default 3)", default=3.0),
)
# When to restart the server, and how the restart advice is found.
RESTART = (
    Number("--restart-at", "H",
           "restart the server after H hours of traffic; the windows after it show the recovery"),
    # no default here: a recording too short for the default is not the flag's fault (soak._inputs)
    Number("--restart-minutes", "M", "length of a restart: the quiet window searched in each day (default 5; "
           "none when the recording is shorter)"),
    Number("--day-hours", "H", "hours of the recording that make a day (default 24, or the whole recording "
           "when shorter: it is repeated)"),
    Number("--margin", "F", "restart this fraction before the projected breach (default 0.2)", default=0.2),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner soak` to `subparsers`."""
    p = add_command(
        subparsers,
        "soak",
        run=run,
        help="replay hours of the recorded traffic against one configuration: drift, breach, restart advice",
        description="Replay a long stretch of the study's recorded traffic (compressed by --speed, the "
        "recording repeated if shorter) against one configuration: the study's recommendation "
        "(OUTPUT/recommended/config.pbtxt) if there is one, else the model's config.pbtxt, with the --set "
        "fields changed. The capacity is measured first on the fresh server; then each window is replayed "
        "and its figures (throughput, latency, fill rate, Triton's compute time per execution and per "
        "request, largest batch, errors and out-of-memory errors, the server's memory) appended to "
        "OUTPUT/soak/windows.csv as it ends. At the end (or at Ctrl-C) a trend test per figure with the "
        "offered load as covariate, the projected SLA breach, the largest batch still succeeding, the "
        "recording's quietest stretch per day and the restart advice go to OUTPUT/soak/findings.json and "
        "the terminal. A model vLLM serves soaks its engine arguments instead (--config a model.json, else "
        "OUTPUT/recommended/model.json, else its own; --set its engine knobs): each window streamed and "
        "measured in tokens (TTFT, TPOT, output tokens/s, the token SLA) with vLLM's own statistics "
        "(preemptions, KV-cache use, sequences waiting), no batch or compute-time figures. Hours are hours "
        "of recorded traffic. Exit codes: 0 no drift detected, 10 drift "
        "detected, 1 no verdict (too few usable windows to analyse) or an error, 2 bad input, 130 "
        "interrupted (the finished windows are kept).",
    )
    add_study(p, "the study file (model, server, traffic, SLA)")
    add_assignments(p, "change a field of the soaked config, e.g. --set max_batch_size=16 (repeatable)")
    add_input(p, "--config", metavar="PATH", what="a config.pbtxt",
              help="soak this config.pbtxt (a vLLM-served model: this model.json) instead of the recommendation")
    add_numbers(p, PACE)
    add_output_dir(p, note="the soak goes to DIR/soak/")
    add_numbers(p, RESTART)
    add_flag(p, "--no-capacity", "skip the capacity measurement at the start (no capacity projection)")
    add_flag(p, "--replace", "overwrite an earlier soak in OUTPUT/soak/")
    add_quiet(p, help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Soak one configuration and print the findings; exit 10 when drift was detected, 1 when too few
    windows could be analysed, else 0."""
    # Imported here: `tuner --help` need not load the server and traffic stacks.
    from tuner import space
    from tuner.settings import check_generative, read_study
    from tuner.soak import (
        NOT_MEASURED,
        check_generative_traffic,
        make_plan,
        restart_windows,
        run_soak,
        soak_config,
        soak_dir,
        soak_engine,
        window_drain_s,
    )
    from tuner.study import check_not_in_model, study_traffic

    settings = read_study(args.study)
    output = Path(args.output).resolve() if args.output else Path(settings.output)
    settings = dataclasses.replace(settings, output=str(output))
    # as tune's output: the server loads the model's directory (and a copy of the soak would go with it)
    check_not_in_model(soak_dir(output), settings, label=f"output directory {output}")
    if not (0 <= args.margin < 1):
        raise SettingsError(f"--margin: must be a fraction in [0, 1), got {args.margin}")
    if args.restart_at is not None and settings.server.launcher == "remote":
        raise SettingsError("--restart-at: a remote server cannot be restarted by tuner (use the local or "
                            "docker launcher)")
    traffic = study_traffic(settings)
    speed = settings.traffic.speed if args.speed is None else args.speed
    plan = make_plan(traffic, hours=args.hours, speed=speed, window_minutes=args.window,
                     restart_at_hours=args.restart_at)
    quiet, quiet_text = restart_windows(traffic, minutes=args.restart_minutes, day_hours=args.day_hours,
                                        recording=_replayed(settings.traffic))
    generative = soak_engine(settings, output, args.assignments, config_path=args.config)
    engine, drain_s = None, 0.0
    if generative is None:
        config, source = soak_config(settings, output, args.assignments, config_path=args.config)
        knobs = ", ".join(f"{k}={v}" for k, v in space.deployed(config).items() if v not in ([], None, 0))
    else:  # vLLM batches: its engine arguments are what is soaked
        config, engine, source = generative
        check_generative(settings, generative=True)
        check_generative_traffic(settings, config, traffic, args=engine)
        knobs = ", ".join(f"{k}={engine[k]}" for k in space.ENGINE_NAMES if engine.get(k) is not None)
        drain_s = window_drain_s(settings, traffic)
    if settings.server.launcher == "remote":  # what its launcher refuses, before the soak's directory is made
        from tuner.server.remote import check_remote

        check_remote(settings.server.url, [settings.model])
    print(f"soak: {settings.model} with {knobs}\n  config: {source}\n"
          f"  {plan.hours:g} h of recorded traffic at speed {plan.speed:g}: {plan.windows} windows of "
          f"{plan.window_wall_s / 60:g} min ({plan.window_s / 3600:.3g} h of traffic each), "
          f"{_estimate(plan, drain_s)}"
          + (f"; restart after {plan.restart_at_hours:g} h" if plan.restart_at_hours is not None else "")
          + (f"\n  note: the soak offers {plan.speed / settings.traffic.speed:.3g}x the study's recorded load "
             f"(traffic.speed {settings.traffic.speed:g})" if plan.speed != settings.traffic.speed else "")
          + f"\n  restart window: {quiet_text}"
          + (f"\n  note: {NOT_MEASURED}" if engine is not None else ""), flush=True)
    result = run_soak(settings, config, plan, traffic=traffic, output=output, quiet=quiet, config_source=source,
                      engine=engine, measure_capacity=not args.no_capacity, replace=args.replace, margin=args.margin,
                      progress=not args.quiet)
    print()
    print(result.findings.text())
    print(f"\nsoak: {result.folder} (windows.csv{'' if engine is not None else ', executions.csv'}, findings.json); "
          f"`tuner report {shlex.quote(str(output))}` draws it")
    if result.findings.analysis is None:  # too few usable windows: no verdict, not "no drift"
        return UnmeasuredError.exit_code
    return EXIT_DRIFT if result.findings.verdict == "drift" else EXIT_NO_DRIFT


def _estimate(plan, drain_s: float | None) -> str:
    """The soak's wall time: its windows' replay, and a generative window's wait for its last requests
    (`drain_s`: at most, a request's life at the SLA's limits; None: unbounded; the window's length again
    or more on a CPU)."""
    replay = f"{_duration(plan.wall_s)} of replay"
    if drain_s == 0:
        return f"about {replay}"
    if drain_s is None:
        return (f"{replay} and, after each window, the time its last requests take to finish generating "
                "(the SLA bounds no request's life)")
    return (f"up to about {_duration(plan.wall_s + plan.windows * drain_s)}: {replay} and, after each "
            f"window, up to {drain_s:.0f} s for its last requests to finish generating (a mean request's life "
            "at the SLA's limits)")


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _replayed(t) -> str:
    """What the soak replays, as a line names it: the recording, or the study's window of it (a soak
    of `traffic.busiest_s: 60` repeats that minute, not the file's hour)."""
    if t.busiest_s is not None:
        return f"the study's traffic window (the busiest {t.busiest_s:g} s of {t.path})"
    if t.start_s is not None or t.duration_s is not None or t.since is not None or t.until is not None:
        return f"the study's traffic window of {t.path}"
    return f"the recording {t.path}"
