"""`tuner.trial.run.make_evaluate` on a real tritonserver: a configuration evaluated again right after
its own measurement is neither loaded again nor warmed (the re-measurement's mirrored rounds); any other
is loaded and warmed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tuner import modelconfig
from tuner.server.local import LocalLauncher
from tuner.settings import read_study
from tuner.traffic import read_traffic
from tuner.trial import MEASURED, Hints
from tuner.trial.run import make_evaluate

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "traffic_profiles" / "bursty_60s.csv"


def write_study(tmp: Path) -> Path:
    study = {
        "name": "run", "model_repository": str(ROOT / "model_repository_templates"), "model": "encoder_sim",
        "traffic": {"path": str(PROFILE), "busiest_s": 8, "speed": 0.25},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 100},
        "measurement": {"window_s": 0.5, "warmup_max_s": 15, "max_repeats": 1},
        "sla": {"latency_ms": 100, "percentile": 99},
        "cost": {"gpu": "a100-40gb"},
        "search": {"max_batch_size": {"low": 1, "high": 16, "log": True},
                   "max_queue_delay_microseconds": {"low": 0, "high": 0},
                   "capacity": {"step_duration_s": 1.0, "tolerance": 0.3, "start_speed": 0.5, "max_steps": 1}},
        "output": str(tmp / "out"),
    }
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


@pytest.mark.slow
def test_a_configuration_evaluated_again_at_once_is_not_reloaded_nor_warmed(tmp_path, triton_install):
    settings = read_study(write_study(tmp_path))
    base = modelconfig.load(Path(settings.model_repository) / "encoder_sim" / "config.pbtxt")
    a = {"max_batch_size": 8, "max_queue_delay_microseconds": 0}
    b = {"max_batch_size": 4, "max_queue_delay_microseconds": 0}
    with LocalLauncher(settings.model_repository, models=["encoder_sim"], install=triton_install) as server:
        loads = []
        apply = server.apply_config
        server.apply_config = lambda model, config: loads.append(config.max_batch_size) or apply(model, config)
        evaluate = make_evaluate(server, settings, base, traffic=read_traffic(PROFILE))
        records = [evaluate(p, Hints()) for p in (a, a, b, a)]
    assert [r.outcome for r in records] == [MEASURED] * 4
    assert loads == [8, 4, 8]  # the second evaluation of a ran on the server as it was
    assert [r.warmup is not None for r in records] == [True, False, True, True]
    assert records[0].warmup.stable and records[0].warmup.sweep_requests >= 8
    assert all(r.at_load.requests > 0 for r in records)  # measured all the same
