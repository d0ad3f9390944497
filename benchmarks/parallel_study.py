"""Many hosts, one study: the wall time of one 9-configuration grid study run by 1, 2 and 3 `tuner
tune` processes sharing a PostgreSQL database, and what the database adds to each trial.

    python benchmarks/parallel_study.py [--processes 1 2 3] [--overhead-trials 40] [--storage URL]

1. A private PostgreSQL cluster (tests/pg_cluster.py: initdb + pg_ctl on 127.0.0.1, a free port, in
   a temporary directory, stopped at the end), or the database `--storage` names (each run gets a
   fresh database in it, so the URL must be allowed to CREATE DATABASE).
2. For each process count N: a fresh database, then N `tuner tune` processes, each with its own local
   Triton serving the emulated-GPU template, on one grid study (max_batch_size 4, 8, 16 x queue delay
   0, 1, 2 ms, and the template's incumbent: 10 trials), the bursty profile's busiest 8 s at a
   quarter of its speed, 1 s steps. Printed: the wall time to the last trial measured (the search,
   which the processes share) and to the last process's exit (with the re-measurement, which one
   host runs alone), trials per minute, the speed-up over one process, and every configuration
   measured once (a check). On a 2-core machine the Tritons, the load generators and the emulated
   GPUs' host work all share the cores: the speed-up is bounded by the CPU, not by the study.
3. The storage's own cost per trial: the same trial loop with an instant evaluation (a recorded
   trial's attributes, no server), `--overhead-trials` trials on SQLite (the default storage) and on
   PostgreSQL, with the heartbeat thread running as in a real study.

Figures are noisy on a shared machine: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pandas as pd
import yaml
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the private cluster the tests use

from tuner import search  # noqa: E402
from tuner.settings import IntRange, read_study  # noqa: E402
from tuner.trial import (  # noqa: E402
    Bracket,
    Figures,
    Hints,  # noqa: E402
    TrialRecord,
)

GRID_SIZE = 9


def study_file(directory: Path) -> Path:
    """The 9-configuration grid study (the tests' fast study), written into `directory`."""
    study = {
        "name": "parallel",
        "model_repository": str(ROOT / "model_repository_templates"),
        "model": "encoder_sim",
        "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv"), "busiest_s": 8, "speed": 0.25},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 100},
        "sla": {"latency_ms": 100, "percentile": 99, "max_error_rate": 0.001},
        "cost": {"gpu": "a100-40gb", "cloud": "gcp"},
        "search": {
            "sampler": "grid",
            "max_batch_size": {"low": 4, "high": 16, "log": True},
            "max_queue_delay_microseconds": {"low": 0, "high": 2000, "step": 1000},
            "capacity": {"step_duration_s": 1.0, "tolerance": 0.3, "start_speed": 0.5, "max_steps": 4},
            "top_k": 1,
            "remeasure_repeats": 1,
            "heartbeat_s": 2,
            "grace_period_s": 10,
        },
        "output": str(directory / "out"),
    }
    path = directory / "parallel.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def run_study(path: Path, url: str, processes: int, directory: Path) -> dict:
    """N `tuner tune` processes on one study; their wall times and what the study holds after."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "tuner", "tune", str(path), "--storage", url, "--quiet",
                               "--output", str(directory / f"host-{i}")],
                              stdout=open(directory / f"host-{i}.log", "w"), stderr=subprocess.STDOUT,  # noqa: SIM115
                              cwd=ROOT, env=env, start_new_session=True)
             for i in range(processes)]
    codes = [p.wait() for p in procs]
    total = time.time() - start
    if any(codes):
        logs = "\n".join((directory / f"host-{i}.log").read_text()[-1500:] for i in range(processes))
        raise SystemExit(f"a tuner tune process failed (exit codes {codes}):\n{logs}")
    study = optuna.load_study(study_name="parallel", storage=search.open_storage(url))
    trials = study.get_trials()
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    configs = [tuple(sorted(t.params.items())) for t in finished if not t.user_attrs.get("incumbent")]
    last = max(t.datetime_complete.timestamp() for t in finished)
    durations = [t.duration.total_seconds() for t in finished]
    return {"processes": processes, "search_s": last - start, "total_s": total, "trials": len(finished),
            "mean_trial_s": sum(durations) / len(durations),
            "once": len(configs) == len(set(configs)) == GRID_SIZE,
            "pids": len({t.user_attrs.get("pid") for t in finished})}


def overhead(url: str, trials: int, directory: Path) -> float:
    """Seconds of storage work per trial: the trial loop with an instant evaluation that records a
    real trial's attributes."""
    settings = read_study(study_file(directory))
    space = dataclasses.replace(settings.search, sampler="random", trials=trials,
                                max_batch_size=IntRange(1, 4096, log=True))
    settings = dataclasses.replace(settings, name="overhead", search=space)
    at_load = Figures(requests=1200, latency_ms={"p50": 12.0, "p90": 30.0, "p95": 35.0, "p99": 48.0, "max": 60.0},
                      fill_rate=0.4, mean_batch_size=6.2, queue_ms=3.0, compute_ms=14.0, send_lag_p99_ms=0.4,
                      batch_histogram={1: 10, 4: 30, 8: 50})

    def instant(params: dict, hints: Hints) -> TrialRecord:
        capacity = Bracket(rps=150.0, speed=3.0, upper_rps=170.0, steps=4, converged=True, at_capacity=at_load)
        return TrialRecord(params=dict(params), at_load=at_load, sla_met=True, violation=-0.5, capacity=capacity,
                           scores={"capacity": 1.5e5, "utilization": 2.0e5})

    study = search.open_study(settings, url, sampler=search.make_sampler(settings.search),
                              incumbent={"max_batch_size": 64, "max_queue_delay_microseconds": 0},
                              metadata={"scoring": settings.scoring, "storage": url})
    start = time.perf_counter()
    search.run_trials(study, settings, instant, n_trials=trials)
    return (time.perf_counter() - start) / trials


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 3], metavar="N")
    parser.add_argument("--overhead-trials", type=int, default=40, metavar="N")
    parser.add_argument("--storage", metavar="URL", help="a PostgreSQL server URL (default: a private cluster)")
    args = parser.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print(f"load average before: {load()} ({os.cpu_count()} cores)", flush=True)
    with tempfile.TemporaryDirectory(prefix="tuner-parallel-bench-") as tmp, _cluster(args.storage) as database:
        tmp = Path(tmp)
        rows = []
        for n in args.processes:
            directory = tmp / f"n{n}"
            directory.mkdir()
            url = database(f"parallel_{n}")
            print(f"{n} process(es) ...", file=sys.stderr, flush=True)
            rows.append(run_study(study_file(directory), url, n, directory))
        table = pd.DataFrame(rows)
        one = table.loc[table["processes"] == table["processes"].min(), "search_s"].iloc[0]
        table["trials/min"] = (table["trials"] / table["search_s"] * 60).round(1)
        table["speed-up"] = (one / table["search_s"]).round(2)
        print("\nthe same 9-configuration grid study (10 trials with the incumbent), PostgreSQL storage")
        print(table[["processes", "pids", "search_s", "total_s", "trials", "mean_trial_s", "trials/min", "speed-up",
                     "once"]].round(1).to_string(index=False))
        print(f"\nstorage work per trial, instant evaluation, {args.overhead_trials} trials, heartbeats on:")
        costs = {"sqlite (default)": overhead(f"sqlite:///{tmp / 'overhead.db'}", args.overhead_trials, tmp),
                 "postgresql": overhead(database("overhead"), args.overhead_trials, tmp)}
        print(pd.DataFrame([{"storage": k, "ms per trial": round(v * 1000, 1)} for k, v in costs.items()])
              .to_string(index=False))
        print(json.dumps({"studies": rows, "overhead_ms": {k: v * 1000 for k, v in costs.items()}}))
    print(f"load average after: {load()}")
    return 0


class _cluster:
    """A callable making fresh databases: in a private cluster, or in the server `url` names."""

    def __init__(self, url: str | None):
        self.url = url
        self.context = None

    def __enter__(self):
        if self.url is None:
            from pg_cluster import missing, private_cluster

            reason = missing()
            if reason:
                raise SystemExit(f"parallel_study: no PostgreSQL: {reason}")
            self.context = private_cluster()
            cluster = self.context.__enter__()
            return cluster.create_database
        return self._create

    def _create(self, name: str) -> str:
        import sqlalchemy

        engine = sqlalchemy.create_engine(self.url, isolation_level="AUTOCOMMIT")
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(f'DROP DATABASE IF EXISTS "{name}"'))
            connection.execute(sqlalchemy.text(f'CREATE DATABASE "{name}"'))
        engine.dispose()
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def __exit__(self, *exc):
        if self.context is not None:
            return self.context.__exit__(*exc)
        return False


if __name__ == "__main__":
    sys.exit(main())
