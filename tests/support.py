"""Helpers that several test files share (pytest puts tests/ on sys.path: `from support import ...`):
a fake evaluation of the search (a pure function of the configuration, like httpx's MockTransport),
the worker process that runs it (this file run as a script), and the study file of the end-to-end
`tuner tune` runs on the emulated GPU."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import sys
import time
from pathlib import Path

import yaml

from tuner import modelconfig
from tuner.errors import ServerSetupError
from tuner.measurement import Measurement
from tuner.settings import IntRange, study_from_dict
from tuner.trial import UNMEASURED, Bracket, Figures, Hints, TrialRecord

ROOT = Path(__file__).resolve().parent.parent
BASE_RPS = 50.0  # measurement(): the offered rate at speed 1
PROFILE = ROOT / "traffic_profiles" / "bursty_60s.csv"


# --- the search's fake evaluation --------------------------------------------------------------------


def fake_settings(tmp_path, sampler="tpe", trials=12, latency_ms=30.0, scoring="capacity", **search_kw):
    """The study of the fake evaluation: model `m`, max_batch_size 1..64 and delays 0..4000 us."""
    s = study_from_dict(
        {
            "name": "fake",
            "model_repository": str(tmp_path),
            "model": "m",
            "traffic": {"path": "t.csv"},
            "output": str(tmp_path / "out"),
            "scoring": scoring,
            "sla": {"latency_ms": latency_ms},
            "search": {"sampler": sampler, "trials": trials, "seed": 1},
        },
        base_dir=tmp_path,
    )
    space = dataclasses.replace(
        s.search,
        max_batch_size=IntRange(1, 64, log=True),
        max_queue_delay_microseconds=IntRange(0, 4000, step=1000),
        **search_kw,
    )
    return dataclasses.replace(s, search=space)


def capacity_of(p: dict) -> float:
    """An interior optimum in max_batch_size (32), the delay adding a little."""
    b = p["max_batch_size"]
    return 100.0 * b / (1.0 + (b / 32.0) ** 2) + p["max_queue_delay_microseconds"] / 1000.0


def latency_of(p: dict) -> float:
    """The p99 at the recorded load: the delay and half a millisecond per batch row added."""
    return 5.0 + p["max_queue_delay_microseconds"] / 1000.0 + 0.5 * p["max_batch_size"]


class FakeEvaluation:
    """A trial's record as a pure function of the configuration (`capacity_of`, `latency_of`), with
    the calls it got; optionally interrupted, noisy, refused by the server or unmeasured."""

    def __init__(
        self,
        latency_ms: float = 30.0,
        interrupt_at: int | None = None,
        noise: dict | None = None,
        fail_config: int | None = None,
        unmeasured: set[int] = frozenset(),
        failing: dict[int, int] | None = None,
    ):
        self.latency_ms = latency_ms
        self.interrupt_at = interrupt_at
        self.noise = noise or {}
        self.fail_config = fail_config
        self.unmeasured = unmeasured  # max_batch_size values the "load generator" cannot replay on time
        self.failing = failing or {}  # max_batch_size -> how many of its first measurements break the SLA
        self.calls: list[tuple[dict, Hints]] = []

    def __call__(self, params: dict, hints: Hints) -> TrialRecord:
        self.calls.append((params, hints))
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail_config is not None and params["max_batch_size"] == self.fail_config:
            raise ServerSetupError("config refused by Triton: preferred size must be <= max batch size")
        seen = sum(p["max_batch_size"] == params["max_batch_size"] for p, _ in self.calls) - 1
        # a stalled host: the SLA's p99 broken tenfold
        latency = latency_of(params) * (10.0 if seen < self.failing.get(params["max_batch_size"], 0) else 1.0)
        at_load = Figures(requests=100, latency_ms={"p99": latency}, fill_rate=0.5, send_lag_p99_ms=0.2)
        if params["max_batch_size"] in self.unmeasured:
            return TrialRecord(params=dict(params), outcome=UNMEASURED, at_load=dataclasses.replace(
                at_load, valid=False, send_lag_p99_ms=9.0, attempts=3),
                note="send lag p99 9.00 ms > budget 5 ms: the load generator was the bottleneck")
        factors = self.noise.get(params["max_batch_size"], [1.0])
        cap = capacity_of(params) * factors[seen % len(factors)]
        violation = latency / self.latency_ms - 1.0
        pruned = hints.beat_rps is not None and cap <= hints.beat_rps
        return TrialRecord(
            params=dict(params), at_load=at_load, sla_met=violation <= 0, violation=violation,
            capacity=Bracket(rps=cap, speed=cap / 10.0, upper_rps=cap * 1.1, steps=3, converged=True),
            scores={"capacity": cap * 3600 / 0.1, "utilization": 1e6 / latency_of(params)},
            pruned=pruned,
        )


def fake_worker(settings, url: str, folder: Path) -> list[str]:
    """The command of a worker process that runs `settings`' study on `url` with `SlowFakeEvaluation`
    (up to 100 trials; the settings pickled into `folder`)."""
    path = folder / "settings.pickle"
    path.write_bytes(pickle.dumps(settings))
    return [sys.executable, __file__, str(path), url]


class SlowFakeEvaluation(FakeEvaluation):
    """Takes a little time per trial, so that two workers overlap."""

    def __call__(self, params: dict, hints: Hints) -> TrialRecord:
        time.sleep(0.5)
        return super().__call__(params, hints)



# --- `tuner tune` on the emulated GPU -------------------------------------------------------------------


def repository(tmp: Path, max_batch_size: int | None = None) -> Path:
    """A copy of the template (optionally with a smaller incumbent max_batch_size): tests never
    touch the shipped files."""
    repo = tmp / "models"
    shutil.copytree(ROOT / "model_repository_templates" / "encoder_sim", repo / "encoder_sim")
    if max_batch_size is not None:
        path = repo / "encoder_sim" / "config.pbtxt"
        config = modelconfig.load(path)
        config.max_batch_size = max_batch_size
        path.write_text(modelconfig.to_text(config, comments_from=path.read_text()))
    return repo


# for a test whose claim is neither the capacity nor the load generator's sizing (resuming, sharing a
# study, a new knob): the capacity search in two steps (0.5x passes, 1x fails: a bracket of 2x, within
# this tolerance) instead of 4-5, each step one more replay (a load-generator process, ~3.5 s, several
# times that on a loaded CI); one load-generator process, as the calibration picks for this traffic on
# 2 cores, so that no process calibrates (~3-5 s each: every `tuner tune` and every worker it starts)
QUICK_TRIALS = {"search.capacity.tolerance": 1.0, "search.capacity.max_steps": 2, "replay.workers": 1}


def write_tune_study(tmp: Path, name: str, repo: Path | None = None, **over) -> Path:
    """A study of `tuner tune` on encoder_sim, small and quick (one grid point, short steps); `over`
    sets dotted keys (`**{"search.top_k": 2}`)."""
    study = {
        "name": name,
        "model_repository": str(repo or ROOT / "model_repository_templates"),
        "model": "encoder_sim",
        # the busiest 8 s of the recording, so `tuner replay` and the search judge the same stretch
        "traffic": {"path": str(PROFILE), "busiest_s": 8, "speed": 0.25},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 100},
        "sla": {"latency_ms": 100, "percentile": 99, "max_error_rate": 0.001},
        "cost": {"gpu": "a100-40gb", "cloud": "gcp"},
        "search": {
            "sampler": "grid",
            "max_batch_size": {"low": 16, "high": 16},
            "max_queue_delay_microseconds": {"low": 0, "high": 0},
            "capacity": {"step_duration_s": 1.0, "tolerance": 0.3, "start_speed": 0.5, "max_steps": 4},
            "top_k": 1,
            "remeasure_repeats": 3,
        },
        "output": str(tmp / name),
    }
    for key, value in over.items():
        node = study
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


if __name__ == "__main__":  # a worker process: `fake_worker`
    import optuna

    from tuner import search

    settings = pickle.loads(Path(sys.argv[1]).read_bytes())
    study = optuna.load_study(study_name=settings.name, storage=search.open_storage(sys.argv[2], settings.search),
                              sampler=search.make_sampler(settings.search))
    search.run_trials(study, settings, SlowFakeEvaluation(), n_trials=100)


class FakeLauncher:
    """A launcher stand-in for a command's own logic (no server): a context manager serving `config`."""

    def __init__(self, config=None):
        self.config = config

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def model_config(self, model):
        return self.config


# --- a measurement made up for the pure stages (score, capacity search) ------------------------------


def measurement(speed: float, p99: float = 10.0, errors: int = 0, valid: bool = True,
                busy_s: float = 1.0) -> Measurement:
    requests = 1000
    return Measurement(
        speed=speed, offered_rps=BASE_RPS * speed, duration_s=requests / (BASE_RPS * speed),
        requests=requests, errors=errors, error_rate=errors / requests, throughput_rps=BASE_RPS * speed,
        latency_ms={"p50": p99 / 2, "p90": p99 * 0.8, "p95": p99 * 0.9, "p99": p99, "max": p99 * 2},
        send_lag_ms={"p50": 0.1, "p99": 1.0 if valid else 50.0}, valid=valid, busy_s=busy_s,
    )
