"""`tuner exporter STUDY.yaml --prometheus URL | --triton HOST:PORT ... [--port 9465]`: the tuner's figures
on /metrics."""

from __future__ import annotations

import argparse
import time

from tuner.cli._args import add_command, add_input, add_study

DEFAULT_PORT = 9465  # tuner.production.DEFAULT_PORT, spelled here too: `tuner --help` imports no pandas
DEFAULT_WINDOW = "15m"
DEFAULT_INTERVAL = "15s"  # Prometheus's usual scrape interval


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `tuner exporter` to `subparsers`."""
    p = add_command(
        subparsers,
        "exporter",
        run=run,
        help="serve the tuner's figures (requests per dollar, fill rate, throughput ratio) as Prometheus metrics",
        description="Serve /metrics on 127.0.0.1 for Prometheus to scrape: the study's price, max_batch_size "
        "and SLA, the production audit of the last --window read from --prometheus, or with --triton "
        "from the Tritons' own metrics ports, scraped by the exporter itself (requests per dollar, "
        "fill rate, throughput ratio and recoverable dollars per month against --baseline), and with "
        "--nightly the last night's verdict and when it ran. The repository's deploy/prometheus/ and deploy/grafana/ read "
        "them. Runs until interrupted (Ctrl-C, SIGTERM).",
    )
    add_study(p, "the study file (model, SLA, cost)")
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="the Prometheus query API that scrapes the model's tritonservers",
    )
    p.add_argument(
        "--triton",
        metavar="HOST:PORT",
        nargs="+",
        help="instead of --prometheus: the tritonservers' metrics ports (like 127.0.0.1:8002), scraped here",
    )
    p.add_argument(
        "--scrape-interval",
        metavar="DURATION",
        default=DEFAULT_INTERVAL,
        help=f"with --triton: scrape every DURATION (default {DEFAULT_INTERVAL})",
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
    from tuner.production import AuditCollector, Prometheus, TritonSource, parse_duration, serve
    from tuner.settings import read_study

    if (args.prometheus is None) == (args.triton is None):
        raise InputError("tuner exporter: give exactly one of --prometheus URL and --triton HOST:PORT ...")
    if not 0 < args.port < 65536:
        raise InputError(f"--port {args.port}: not a TCP port (1 to 65535)")
    window_s = parse_duration(args.window)
    interval_s = parse_duration(args.scrape_interval, where="--scrape-interval")
    if args.triton and window_s < 2 * interval_s:  # an increase needs two samples in the window
        raise InputError(f"--window {args.window}: shorter than two scrapes (--scrape-interval "
                         f"{args.scrape_interval}): it would never hold two samples to measure between")
    from tuner.study import check_batcher_study

    settings = read_study(args.study)
    check_batcher_study(settings, "exporter")
    baseline = load_baseline(args.baseline, settings) if args.baseline else None
    if args.triton:
        source = TritonSource(args.triton, model=settings.model, window_s=window_s, interval_s=interval_s)
    else:
        source = Prometheus(args.prometheus)
    # from memory (--triton): each scrape of /metrics judges the window as last scraped, at no cost
    fresh = {"refresh_s": 0.0} if args.triton else {}
    collector = AuditCollector(
        settings, source, window_s=window_s, baseline=baseline, nightly=args.nightly, **fresh
    )
    server = serve(collector, port=args.port)  # a port in use: said before any source is asked anything
    try:
        # unreachable, not a Prometheus, not Triton's metrics, no such model: said now, not at a scrape
        source.check()
        if isinstance(source, TritonSource):
            source.start()
        print(
            f"serving http://127.0.0.1:{args.port}/metrics (model {settings.model}, the last {args.window} "
            f"from {source.url}); Ctrl-C stops",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, Terminated):
        print("tuner exporter: stopped", flush=True)
        return 0
    finally:
        server.shutdown()
        if isinstance(source, TritonSource):
            source.stop()
