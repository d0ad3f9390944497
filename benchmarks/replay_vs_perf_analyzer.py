"""Does `tuner replay` agree with Triton's own perf_analyzer under the same Poisson load?

Starts a local tritonserver with the `encoder_sim` template, then alternates, `--repeats` times:
- perf_analyzer `--request-rate-range R --request-distribution poisson --async` (fixed seq_len), and
- `tuner.replay` of a Poisson profile at R req/s with the same seq_len,
and prints p50 / p99 latency and throughput of each run, the medians, and the ratio tuner/perf_analyzer
against the acceptance bounds (latency within 10%, throughput within 5%). Alternating runs within one
server's life keeps the machine's noise the same for both tools.

perf_analyzer setup (done here, cached under ~/.cache/tuner/perf_analyzer): `pip install perf-analyzer`
on a glibc older than 2.38 gets an empty placeholder, so the 2.60.0 manylinux_2_38 wheel is downloaded
and unpacked, and Debian trixie's libc6 / libstdc++6 / libgcc-s1 are fetched with a private apt
configuration (nothing on the system changes) and unpacked into a private sysroot; the binary is started
through that sysroot's dynamic loader.

    .venv/bin/python benchmarks/replay_vs_perf_analyzer.py [--rate 200] [--seq-len 128]
        [--duration 30] [--repeats 3] [--protocol http]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pandas as pd

from tuner.measurement import measure, stat_deltas
from tuner.replay import replay
from tuner.server import LocalLauncher
from tuner.settings import ReplaySettings
from tuner.traffic import SizeSpec, synth_poisson

TEMPLATES = Path(__file__).resolve().parent.parent / "model_repository_templates"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuner" / "perf_analyzer"
VERSION = "2.60.0"
TRIXIE = "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main"
LIBS = ("libc6", "libstdc++6", "libgcc-s1")
BOUNDS = {"p50_ms": 0.10, "p99_ms": 0.10, "throughput_rps": 0.05}


def install_perf_analyzer(cache: Path = CACHE) -> list[str]:
    """The command prefix that runs perf_analyzer here (downloads and unpacks on first use)."""
    binary = cache / "unpacked" / "perf_analyzer" / "bin" / "perf_analyzer"
    sysroot = cache / "sysroot"
    libdir = sysroot / "usr" / "lib" / "x86_64-linux-gnu"
    if not binary.exists():
        wheels = cache / "wheel"
        _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
              "--platform", "manylinux_2_38_x86_64", "--python-version", "3.11",
              f"perf-analyzer=={VERSION}", "-d", str(wheels)])
        (wheel,) = wheels.glob(f"perf_analyzer-{VERSION}-*.whl")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(cache / "unpacked")
        binary.chmod(0o755)
    if not (libdir / "ld-linux-x86-64.so.2").exists():
        apt = cache / "apt"
        for d in ("lists/partial", "cache/archives/partial", "debs"):
            (apt / d).mkdir(parents=True, exist_ok=True)
        (apt / "sources.list").write_text(TRIXIE + "\n")
        options = [f"-oDir::Etc::SourceList={apt / 'sources.list'}", "-oDir::Etc::SourceParts=/dev/null",
                   f"-oDir::State::Lists={apt / 'lists'}", f"-oDir::Cache={apt / 'cache'}",
                   "-oDebug::NoLocking=1", "-oAPT::Sandbox::User=root"]
        _run(["apt-get", *options, "update"])
        _run(["apt-get", *options, "download", *LIBS], cwd=apt / "debs")
        for deb in (apt / "debs").glob("*.deb"):
            _run(["dpkg", "-x", str(deb), str(sysroot)])
    return [str(libdir / "ld-linux-x86-64.so.2"), "--library-path", f"{libdir}:/lib/x86_64-linux-gnu",
            str(binary)]


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"setup step failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")


def _server_side(d: dict) -> dict:
    """Triton's view of the same run (perf_analyzer's spans its warm-up and every window)."""
    execs = d["execution_count"]
    return {"queue_ms": d["queue_ns"] / d["queue_count"] / 1e6 if d["queue_count"] else float("nan"),
            "compute_ms": d["busy_ns"] / execs / 1e6 if execs else float("nan"),
            "mean_batch": d["inference_count"] / execs if execs else float("nan")}


def perf_analyzer_run(prefix: list[str], server: LocalLauncher, url: str, protocol: str, model: str, rate: float, seq_len: int,
                      window_ms: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pa.csv"
        cmd = [*prefix, "-m", model, "-u", url, "-i", protocol, "--request-rate-range", f"{rate:g}",
               "--request-distribution", "poisson", "--async", "--shape", f"INPUT_IDS:{seq_len}",
               "--measurement-interval", str(window_ms), "--stability-percentage", "50",
               "--max-trials", "6", "-f", str(out)]
        before = server.statistics(model)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        server_side = _server_side(stat_deltas(before, server.statistics(model)))
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"perf_analyzer failed ({done.returncode}): {done.stdout[-1500:]}{done.stderr[-1500:]}")
        with open(out) as f:
            row = next(csv.DictReader(f))
    return {"tool": "perf_analyzer", "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000, "throughput_rps": float(row["Inferences/Second"]),
            "lag_p99_ms": float("nan"), "p50_from_send_ms": float("nan"), "p99_from_send_ms": float("nan"),
            **server_side}


WARMUP_S = 3.0  # the replay's first seconds, not measured


def tuner_run(server: LocalLauncher, protocol: str, model: str, rate: float, seq_len: int, duration_s: float,
              seed: int) -> dict:
    traffic = synth_poisson(rate, duration_s, seed=seed, sizes={"seq_len": SizeSpec(kind="constant", value=seq_len)})
    settings = ReplaySettings(protocol=protocol, workers=1, warmup_s=WARMUP_S)
    result = replay(server.endpoints, model, traffic, speed=1.0, settings=settings, stats=lambda: server.statistics(model))
    m = measure(result.records, result.stats_before, result.stats_after, speed=1.0, warmup_s=WARMUP_S,
                lag_budget_ms=2.0, max_batch_size=server.model_config(model).max_batch_size)
    # perf_analyzer times each request from its actual send; the replay from its due time. The two
    # agree while the send lag is small; "from send" shows how much of a gap the lag explains.
    sent = result.measured()
    from_send = (sent["end_s"] - sent["send_s"])[sent["ok"]] * 1000
    return {"tool": "tuner replay", "p50_ms": m.latency_ms["p50"], "p99_ms": m.latency_ms["p99"],
            "throughput_rps": m.throughput_rps, "lag_p99_ms": m.send_lag_ms["p99"],
            "p50_from_send_ms": from_send.quantile(0.5), "p99_from_send_ms": from_send.quantile(0.99),
            "queue_ms": m.queue_ms_mean, "compute_ms": m.compute_ms_mean, "mean_batch": m.mean_batch_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--duration", type=float, default=30.0, help="tuner replay: seconds per run")
    parser.add_argument("--window-ms", type=int, default=8000, help="perf_analyzer measurement interval")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--model", default="encoder_sim", help="the template the local server serves")
    args = parser.parse_args(argv)
    if args.duration <= WARMUP_S:
        parser.error(f"--duration {args.duration:g}: must be longer than the replay's {WARMUP_S:g}-s warm-up, which is not measured")

    prefix = install_perf_analyzer()
    rows = []
    with LocalLauncher(TEMPLATES, models=[args.model]) as server:
        url = server.endpoints.grpc if args.protocol == "grpc" else server.endpoints.http
        for k in range(args.repeats):
            for run in ("pa", "tuner"):
                if run == "pa":
                    row = perf_analyzer_run(prefix, server, url, args.protocol, args.model, args.rate, args.seq_len,
                                            args.window_ms)
                else:
                    row = tuner_run(server, args.protocol, args.model, args.rate, args.seq_len, args.duration,
                                    seed=k)
                rows.append({"repeat": k, **row})
                print(pd.DataFrame(rows[-1:]).round(3).to_string(index=False, header=len(rows) == 1), flush=True)
    table = pd.DataFrame(rows)
    print(f"\n{args.model}, Poisson {args.rate:g} req/s, seq_len {args.seq_len}, {args.protocol}")
    print(table.round(3).to_string(index=False))
    medians = table.groupby("tool")[list(BOUNDS)].median()
    print("\nmedians\n" + medians.round(3).to_string())
    ok = True
    for key, bound in BOUNDS.items():
        pa = medians.loc["perf_analyzer", key]
        ours = medians.loc["tuner replay", key]
        diff = ours / pa - 1
        within = abs(diff) <= bound
        ok &= within
        print(f"{key:>15}: tuner/perf_analyzer - 1 = {diff:+.1%} (bound ±{bound:.0%}) "
              f"{'within' if within else 'OUTSIDE'}")
    sent = table[table["tool"] == "tuner replay"][["p50_from_send_ms", "p99_from_send_ms"]].median()
    print(f"tuner replay timed from the send instead of the due time: p50 "
          f"{sent['p50_from_send_ms'] / medians.loc['perf_analyzer', 'p50_ms'] - 1:+.1%}, p99 "
          f"{sent['p99_from_send_ms'] / medians.loc['perf_analyzer', 'p99_ms'] - 1:+.1%} vs perf_analyzer")
    spread = table.groupby("tool")[["p50_ms", "p99_ms"]].agg(lambda s: statistics.pstdev(s) / s.mean())
    print("\nrun-to-run spread (stdev / mean)\n" + spread.round(3).to_string())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
