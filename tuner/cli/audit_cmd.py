"""`tuner audit STUDY.yaml [--url HOST:PORT] [--baseline DIR]`: measure a deployment, change nothing;
`tuner audit STUDY.yaml --prometheus URL [--window 7d]`: audit production from Prometheus's history."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator

from tuner.cli._args import (
    add_command,
    add_flag,
    add_input,
    add_json,
    add_quiet,
    add_study,
    add_textfile,
    check_textfile_output,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner audit` to `subparsers`."""
    p = add_command(
        subparsers,
        "audit",
        run=run,
        help="measure a running deployment the way tune measures a trial, and say what it wastes",
        description="Read the model's configuration from the running server (attached read-only: "
        "nothing is loaded, unloaded or changed), replay the study's traffic at its recorded load "
        "(SLA, fill rate, Triton's queue and compute time) and search its capacity as a trial's is "
        "searched (this drives the server past its SLA: audit a replica, or use --at-load-only). "
        "With --baseline (a `tuner tune` output on the same SLA and traffic): the throughput ratio "
        "(> 0.75 healthy, < 0.60 inefficient) and the recoverable budget. Exit codes: 0 healthy, "
        "10 inefficient, 3 SLA missed at the recorded load, 2 bad input, 1 error. "
        "With --prometheus URL: nothing is replayed and no server touched; production's own history over "
        "--window (Triton's counters in Prometheus: throughput, fill rate, queue and compute time, errors, "
        "per hour and per instance) is judged the same way (exit 3: the error rate over the SLA's). "
        "A model vLLM serves (a generative study) is measured in tokens, as tune measures it: its engine "
        "arguments from the study's model.json, the TTFT/TPOT SLA, the capacity in output tokens/s against a "
        "generative `tuner tune` baseline, vLLM's own preemptions, KV-cache use and sequences at the recorded "
        "load in place of the batcher's findings (the replay audit only). --json replaces only an audit tuner "
        "wrote, --textfile only a textfile tuner wrote (else --force), never one of the study's inputs nor a "
        "file in its model's directory.",
    )
    add_study(p, "the study file (model, traffic, SLA, cost, server)")
    p.add_argument("--url", metavar="HOST:PORT",
                   help="the deployment's Triton HTTP endpoint (default: the study's server section)")
    add_input(p, "--baseline", kind="file or directory", metavar="DIR",
              help="the output directory of a `tuner tune` to compare with (or a replay audit's --json: "
              "the deployed configuration's measured capacity)")
    add_flag(p, "--at-load-only", "replay only at the recorded load: no capacity search, no throughput ratio")
    p.add_argument("--prometheus", metavar="URL",
                   help="audit production from this Prometheus query API (any Prometheus-compatible one): "
                   "Triton's counters over --window, nothing replayed")
    p.add_argument("--window", metavar="DURATION",
                   help="with --prometheus: how far back, in whole hours (e.g. 7d, 36h; default 7d)")
    p.add_argument("--until", metavar="T",
                   help="with --prometheus: the window's end, e.g. 2026-11-30T00:00 (naive times UTC) or Unix "
                   "seconds; default: the last whole hour, so a past week can be audited again as it was")
    add_json(p, "the audit")
    add_textfile(p, "the audit's figures")
    add_flag(p, "--force", "replace a --json or --textfile file that tuner did not write (the study's own inputs "
             "are never replaced)")
    add_quiet(p, help="no progress bars or step lines (the audit's table still prints)")


def run(args: argparse.Namespace) -> int:
    """Audit the study's deployment and print the findings; the audit's exit code."""
    from tuner.errors import InputError

    if args.prometheus is not None:
        return _production(args)
    for flag, value in (("--window", args.window), ("--until", args.until)):
        if value is not None:
            raise InputError(f"{flag}: only with --prometheus (the replay audit replays the study's traffic)")
    if args.at_load_only and args.baseline:
        raise InputError("--baseline compares capacities, which --at-load-only does not measure: drop one of them")
    from tuner.audit import REQUESTS, TOKENS, audit, format_audit, load_baseline
    from tuner.server.remote import check_triton
    from tuner.settings import check_generative, parse_host_port, read_study, with_overrides
    from tuner.study import is_vllm_study

    settings = read_study(args.study)
    generative = is_vllm_study(settings)  # a model vLLM serves: measured in tokens (tuner.audit_engine)
    if generative:
        check_generative(settings, generative=True)  # its SLA limits TTFT and/or TPOT
    if args.url is not None:
        parse_host_port(args.url, where="--url")  # named as the flag, not as the study's key
        settings = with_overrides(settings, {"server.launcher": "remote", "server.url": args.url})
    _check_outputs(args, settings)  # before the measuring, not after
    unit = TOKENS if generative else REQUESTS
    baseline = load_baseline(args.baseline, settings, unit=unit) if args.baseline else None
    if settings.server.launcher == "remote":  # Triton's HTTP endpoint, not its metrics or gRPC port
        check_triton(settings.server.url, where="--url" if args.url is not None else "server.url")
    result = audit(settings, baseline, at_load_only=args.at_load_only, progress=not args.quiet)
    print(format_audit(result))
    _write_json(args.json, result.as_dict())
    if args.textfile:
        from tuner import space
        from tuner.production import labels_for, replay_audit_families, study_families, write_textfile

        labels = labels_for(settings)
        if result.unit == TOKENS:  # in output tokens, named so: never read as requests
            from tuner.audit_engine import textfile_families

            families = textfile_families(result, labels)
        else:  # the study's constants too, as --prometheus writes them: the dashboard and rules divide by them
            deployed = result.params.get(space.MAX_BATCH_SIZE)  # the deployed config's, as the server runs it
            families = study_families(settings, labels, max_batch_size=deployed, baseline=baseline) \
                + replay_audit_families(result, labels)
        write_textfile(args.textfile, families)
    return result.exit_code


def _production(args: argparse.Namespace) -> int:
    """`--prometheus`: the production audit from Prometheus's history; nothing replayed, no server touched."""
    import dataclasses

    from tuner.audit import format_audit, soak_findings
    from tuner.errors import InputError
    from tuner.production import Prometheus, parse_duration
    from tuner.settings import read_study
    from tuner.study import is_vllm_study

    if args.url is not None or args.at_load_only:
        raise InputError("--prometheus reads production's history: --url and --at-load-only belong to the "
                         "replay audit (nothing is replayed)")
    window_s = parse_duration(args.window or "7d")
    end = _until(args.until)
    settings = read_study(args.study)
    _check_outputs(args, settings)
    prometheus = Prometheus(args.prometheus)
    audit = _production_engine if is_vllm_study(settings) else _production_triton
    result, textfile = audit(args, settings, prometheus, window_s=window_s, end=end)
    # the last soak's lines, as the replay audit has them (tuner.audit.soak_findings): both audits say it
    result = dataclasses.replace(result, findings=[*result.findings, *soak_findings(settings.output)])
    print(format_audit(result))
    _write_json(args.json, result.as_dict())
    if args.textfile:
        textfile(result)
    return result.exit_code


def _production_triton(args: argparse.Namespace, settings, prometheus, *, window_s: float,
                       end: float | None) -> tuple[object, Callable[[object], None]]:
    """`--prometheus` for a model Triton batches: its counters; the audit and what writes its --textfile."""
    from tuner.audit import load_baseline
    from tuner.production import (
        HOUR_S,
        audit_families,
        counter_queries,
        labels_for,
        production_audit,
        study_families,
        write_textfile,
    )

    baseline = load_baseline(args.baseline, settings) if args.baseline else None
    with _query_progress(counter_queries(window_s, step_s=HOUR_S), quiet=args.quiet) as on_query:
        result = production_audit(settings, prometheus, window_s=window_s, end=end, baseline=baseline,
                                  on_query=on_query)

    def textfile(audited) -> None:
        labels = labels_for(settings)
        write_textfile(args.textfile, study_families(settings, labels, max_batch_size=result.max_batch_size,
                                                     baseline=baseline) + audit_families(audited, labels))

    return result, textfile


def _production_engine(args: argparse.Namespace, settings, prometheus, *, window_s: float,
                       end: float | None) -> tuple[object, Callable[[object], None]]:
    """`--prometheus` for a model vLLM serves: vLLM's own series judged against the study's token SLA;
    the audit and what writes its --textfile."""
    from tuner.production import (
        HOUR_S,
        engine_audit_families,
        engine_queries,
        labels_for,
        load_engine_baseline,
        production_engine_audit,
        write_textfile,
    )

    baseline = load_engine_baseline(args.baseline, settings) if args.baseline else None
    with _query_progress(engine_queries(window_s, step_s=HOUR_S), quiet=args.quiet) as on_query:
        result = production_engine_audit(settings, prometheus, window_s=window_s, end=end, baseline=baseline,
                                         on_query=on_query)
    return result, lambda audited: write_textfile(args.textfile, engine_audit_families(audited, labels_for(settings)))


def _until(value: str | None) -> float | None:
    """--until as Unix seconds (None: the audit's default end); a time still to come is refused, its
    steps would read as gaps."""
    import time

    from tuner.errors import InputError
    from tuner.instants import parse_instant

    if value is None:
        return None
    end = parse_instant(value, "--until")  # one line (exit 2) when it is not a time
    if end > time.time():
        raise InputError(f"--until {value}: still to come; the window must have passed (default: the last "
                         "whole hour)")
    return end


@contextlib.contextmanager
def _query_progress(total: int, *, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """A bar over the `total` queries on stderr, drawn only once they take more than a second; none
    with `quiet`."""
    from tqdm import tqdm

    with tqdm(total=total, desc="querying Prometheus", unit="query", delay=1.0, file=sys.stderr,
              leave=False, disable=quiet) as bar:
        yield lambda label: (bar.set_postfix_str(label, refresh=False), bar.update(1))


def _check_outputs(args: argparse.Namespace, settings) -> None:
    """Refuse a --json or --textfile that cannot be written, or that would replace a file tuner did not
    write (unless --force) or one of the study's inputs, as simulate's --json is refused."""
    from tuner.cli.simulate_cmd import check_output
    from tuner.files import check_writable, json_with_keys

    if args.json:
        label = f"--json {args.json}"
        check_writable(args.json, label=label)
        # every audit's JSON (replay, --prometheus, generative) holds these (tuner.audit, tuner.production)
        check_output(args.json, settings, label=label, force=args.force,
                     ours=lambda path: json_with_keys(path, {"model", "findings", "exit_code"}))
    if args.textfile:
        if args.json:
            from tuner.errors import InputError
            from tuner.paths import same_file

            if same_file(args.json, args.textfile):  # the textfile, written last, would replace the JSON
                raise InputError(f"--json {args.json} and --textfile {args.textfile}: the same file; name two")
        check_textfile_output(args.textfile, settings, force=args.force)


def _write_json(path: str | None, data: dict) -> None:
    from tuner.files import json_safe, write_atomic

    if path:
        write_atomic(path, json.dumps(json_safe(data), indent=2, default=str) + "\n", label=f"--json {path}")
