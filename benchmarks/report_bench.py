"""How long `tuner report` takes on a 200-trial study (prints the time; not a test).

The study is made with Optuna directly and fake-but-plausible measurements (a padded-sequence
batcher whose capacity peaks at an interior max_batch_size), because a real 200-trial `tuner tune`
takes hours. Run: .venv/bin/python benchmarks/report_bench.py [--trials 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd

from tuner.traffic import synth_diurnal, write_traffic

SLA_MS, PRICE, MEAN_RPS = 100.0, 2.5, 2100.0
CONFIG = """name: "sim"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: {delay} }}
"""


def _measure(mbs: int, delay_us: int, rng: np.random.Generator) -> dict:
    """A plausible measurement at capacity for one configuration."""
    pad = 1 + 0.35 * math.log2(mbs)             # a bigger batch pays for its longest sequence
    steep = 1 + max(0, mbs - 24) * 0.04         # memory-bound past 24
    exec_ms = 4 + 0.9 * mbs * pad * steep / 4
    capacity = mbs / exec_ms * 1000 * rng.uniform(0.95, 1.05)
    p50 = exec_ms * 1.5 + delay_us / 1000 * 0.6
    p99 = exec_ms * 3.2 + delay_us / 1000 * 1.1 + rng.uniform(0, 5)
    fill = min(1.0, 0.35 + 0.5 * delay_us / 20000 + 4 / mbs) if mbs > 1 else 1.0
    sizes = np.arange(1, mbs + 1)
    weights = np.exp(-((sizes - fill * mbs) ** 2) / (2 * max(1.0, mbs / 4) ** 2))
    hist = {int(s): int(w) for s, w in zip(sizes, np.round(1000 * weights / weights.sum()), strict=True) if w >= 1}
    feasible = p99 <= SLA_MS
    by_capacity = capacity * 3600 / PRICE
    return {
        "capacity_rps": round(capacity, 2), "feasible": bool(feasible),
        "requests_per_dollar": round(by_capacity, 1),
        "scores": {"capacity": round(by_capacity, 1), "utilization": round(by_capacity / max(fill, 0.1), 1)},
        "latency_ms": {"p50": round(p50, 2), "p90": round(p50 + 0.6 * (p99 - p50), 2),
                       "p95": round(p50 + 0.8 * (p99 - p50), 2), "p99": round(p99, 2), "max": round(p99 * 1.3, 2)},
        "fill_rate": round(fill, 3), "batch_histogram": hist,
    }


def build_output(out: Path, trials: int, seed: int = 0, journal: bool = False) -> Path:
    """A `tuner tune`-shaped output directory from a real Optuna study with faked measurements,
    stored in sqlite or (as `tuner tune` does by default) a journal file."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if journal:
        url = str(out / "study.journal")
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(url))
    else:
        url = storage = f"sqlite:///{out / 'study.db'}"
    study = optuna.create_study(study_name="bench", storage=storage, direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed), load_if_exists=True)
    space = {"max_batch_size": optuna.distributions.IntDistribution(1, 64, log=True),
             "max_queue_delay_microseconds": optuna.distributions.IntDistribution(0, 20000, step=500)}
    study.enqueue_trial({"max_batch_size": 8, "max_queue_delay_microseconds": 0}, user_attrs={"incumbent": True})
    rows = []
    for _ in range(trials):
        trial = study.ask(space)
        params = trial.params
        if rng.uniform() < 0.03:  # a trial whose server refused the config
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            rows.append({"number": trial.number, "state": "FAIL", **params})
            continue
        m = _measure(params["max_batch_size"], params["max_queue_delay_microseconds"], rng)
        for key, value in m.items():
            trial.set_user_attr(key, value)
        study.tell(trial, m["requests_per_dollar"] if m["feasible"] else 0.0)
        rows.append({"number": trial.number, "state": "COMPLETE", **params,
                     "capacity_rps": m["capacity_rps"], "requests_per_dollar": m["requests_per_dollar"],
                     "score_capacity": m["scores"]["capacity"], "score_utilization": m["scores"]["utilization"],
                     **{f"latency_{q}_ms": v for q, v in m["latency_ms"].items()},
                     "fill_rate": m["fill_rate"], "feasible": m["feasible"]})
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "trials.csv", index=False)

    feasible = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)) if t.user_attrs["feasible"]]
    best = max(feasible, key=lambda t: t.user_attrs["requests_per_dollar"])
    incumbent = study.trials[0]

    def entry(t: optuna.trial.FrozenTrial) -> dict:
        keep = ("capacity_rps", "requests_per_dollar", "scores", "latency_ms", "fill_rate", "batch_histogram")
        return {"trial": t.number, "params": t.params, **{k: t.user_attrs[k] for k in keep}}

    summary = {
        "study_name": "bench", "storage": url, "scoring": "capacity",
        "best": entry(best), "incumbent": entry(incumbent),
        "improvement": best.user_attrs["requests_per_dollar"] / incumbent.user_attrs["requests_per_dollar"] - 1,
        "sla": {"latency_ms": SLA_MS, "percentile": 99.0, "max_error_rate": 0.001}, "price_per_hour": PRICE,
        "trials": {"complete": int((frame.state == "COMPLETE").sum()), "feasible": len(feasible),
                   "failed": int((frame.state == "FAIL").sum()), "pruned": 0},
        "traffic": {"path": str(out / "traffic.csv")},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "incumbent").mkdir(exist_ok=True)
    (out / "incumbent" / "config.pbtxt").write_text(CONFIG.format(mbs=8, delay=0))
    (out / "recommended").mkdir(exist_ok=True)
    (out / "recommended" / "config.pbtxt").write_text(
        "# produced by the benchmark's fake study\n" + CONFIG.format(**{
            "mbs": best.params["max_batch_size"], "delay": best.params["max_queue_delay_microseconds"]}))

    # a day compressed into two minutes whose peak needs a few servers
    write_traffic(synth_diurnal(MEAN_RPS, 120, seed=seed, period_s=120, amplitude=0.6), out / "traffic.csv")

    (out / "records").mkdir(exist_ok=True)
    for name, t in [("incumbent", incumbent)] + [(f"trial_{x.number}", x) for x in
                                                 sorted(feasible, key=lambda x: -x.user_attrs["requests_per_dollar"])[:3]]:
        p50, p99 = t.user_attrs["latency_ms"]["p50"], t.user_attrs["latency_ms"]["p99"]
        sigma = math.log(p99 / p50) / 2.326
        latencies = rng.lognormal(math.log(p50), sigma, 5000)
        pd.DataFrame({"latency_ms": latencies}).to_parquet(out / "records" / f"{name}.parquet")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="build the study here and keep it")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        out = build_output(args.keep or Path(tmp) / "study", args.trials)
        started = time.perf_counter()
        from tuner.report import write_report

        path = write_report(out)
        elapsed = time.perf_counter() - started
        print(f"report of a {args.trials}-trial study: {elapsed:.2f} s (imports included), "
              f"{path.stat().st_size / 1e6:.1f} MB -> {path}")


if __name__ == "__main__":
    main()
