"""`tuner exporter STUDY.yaml --prometheus URL [--port 9465]`: the tuner's figures on /metrics."""

from __future__ import annotations

import argparse
import time

from tuner.cli._args import add_command, add_input, add_study

DEFAULT_PORT = 9465  # tuner.production.DEFAULT_PORT, spelled here too: `tuner --help` imports no pandas
DEFAULT_WINDOW = "15m"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner exporter` to `subparsers`."""
    p = add_command(
        subparsers,
        "exporter",
        run=run,
        help="serve the tuner's figures (requests per dollar, fill rate, throughput ratio) as Prometheus metrics",
        description="Serve /metrics on 127.0.0.1 for Prometheus to scrape: the study's price, max_batch_size "
        "and SLA, the production audit of the last --window read from --prometheus (requests per dollar, "
        "fill rate, throughput ratio and recoverable dollars per month against --baseline), and with "
        "--nightly the last night's verdict and when it ran. deploy/prometheus/ and deploy/grafana/ read "
        "them. Runs until interrupted (Ctrl-C, SIGTERM).",
    )
    add_study(p, "the study file (model, SLA, cost)")
    p.add_argument(
        "--prometheus",
        metavar="URL",
        required=True,
        help="the Prometheus query API that scrapes the model's tritonservers",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"serve /metrics on 127.0.0.1:PORT (default {DEFAULT_PORT})",
    )
    p.add_argument(
        "--window",
        metavar="DURATION",
        default=DEFAULT_WINDOW,
        help=f"the production figures over the last DURATION (default {DEFAULT_WINDOW})",
    )
    add_input(
        p,
        "--baseline",
        kind="file or directory",
        metavar="DIR",
        help="the output directory of a `tuner tune` (or a replay audit's --json): the baseline's requests "
        "per dollar, the ratio",
    )
    add_input(
        p,
        "--nightly",
        kind="directory",
        metavar="DIR",
        help="the nightly job's output directory: its last night's verdict (read at every scrape)",
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; 0 when stopped."""
    from tuner.audit import load_baseline
    from tuner.errors import InputError, Terminated
    from tuner.production import AuditCollector, Prometheus, parse_duration, serve
    from tuner.settings import read_study

    if not 0 < args.port < 65536:
        raise InputError(f"--port {args.port}: not a TCP port (1 to 65535)")
    window_s = parse_duration(args.window)
    settings = read_study(args.study)
    baseline = load_baseline(args.baseline, settings) if args.baseline else None
    prometheus = Prometheus(args.prometheus)
    collector = AuditCollector(
        settings, prometheus, window_s=window_s, baseline=baseline, nightly=args.nightly
    )
    server = serve(collector, port=args.port)  # a port in use: said before Prometheus is asked anything
    try:
        prometheus.check()  # unreachable, not a Prometheus: said now, not at the first scrape
        print(
            f"serving http://127.0.0.1:{args.port}/metrics (model {settings.model}, the last {args.window} "
            f"from {prometheus.url}); Ctrl-C stops",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Terminated):
        print("tuner exporter: stopped", flush=True)
        return 0
    finally:
        server.shutdown()
