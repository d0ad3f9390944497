"""`tuner audit STUDY.yaml [--url HOST:PORT] [--baseline DIR]`: measure a deployment, change nothing."""

from __future__ import annotations

import argparse
import json

from tuner.cli._args import add_command, add_flag, add_input, add_json, add_study


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
        "10 inefficient, 3 SLA missed at the recorded load, 2 bad input, 1 error.",
    )
    add_study(p, "the study file (model, traffic, SLA, cost, server)")
    p.add_argument("--url", metavar="HOST:PORT",
                   help="the deployment's Triton HTTP endpoint (default: the study's server section)")
    add_input(p, "--baseline", kind="directory", metavar="DIR", help="the output directory of a `tuner tune` to compare with")
    add_flag(p, "--at-load-only", "replay only at the recorded load: no capacity search, no throughput ratio")
    add_json(p, "the audit")


def run(args: argparse.Namespace) -> int:
    """Audit the study's deployment and print the findings; the audit's exit code."""
    from tuner.audit import audit, format_audit, load_baseline
    from tuner.files import check_writable, json_safe, write_atomic
    from tuner.server.remote import check_triton
    from tuner.settings import parse_host_port, read_study, with_overrides

    settings = read_study(args.study)
    if args.url is not None:
        parse_host_port(args.url, where="--url")  # named as the flag, not as the study's key
        settings = with_overrides(settings, {"server.launcher": "remote", "server.url": args.url})
    if args.json:
        check_writable(args.json, label=f"--json {args.json}")  # before the measuring, not after
    baseline = load_baseline(args.baseline, settings) if args.baseline else None
    if settings.server.launcher == "remote":  # Triton's HTTP endpoint, not its metrics or gRPC port
        check_triton(settings.server.url, where="--url" if args.url is not None else "server.url")
    result = audit(settings, baseline, at_load_only=args.at_load_only)
    print(format_audit(result))
    if args.json:
        write_atomic(args.json, json.dumps(json_safe(result.as_dict()), indent=2, default=str) + "\n",
                     label=f"--json {args.json}")
    return result.exit_code
