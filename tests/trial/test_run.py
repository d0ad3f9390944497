"""`tuner.trial.run.make_evaluate` on a real tritonserver: a configuration evaluated again right after
its own measurement is neither loaded again nor warmed (the re-measurement's mirrored rounds); any other
is loaded and warmed."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import write_tune_study

from tuner import modelconfig
from tuner.server.local import LocalLauncher
from tuner.settings import read_study
from tuner.study import study_traffic
from tuner.trial import MEASURED, Hints
from tuner.trial.run import make_evaluate


@pytest.mark.slow
def test_a_configuration_evaluated_again_at_once_is_not_reloaded_nor_warmed(tmp_path, triton_install):
    settings = read_study(write_tune_study(
        tmp_path, "run", measurement={"window_s": 0.5, "warmup_max_s": 15, "max_repeats": 1},
        **{"search.max_batch_size": {"low": 1, "high": 16, "log": True}, "search.capacity.max_steps": 1}))
    base = modelconfig.load(Path(settings.model_repository) / "encoder_sim" / "config.pbtxt")
    a = {"max_batch_size": 8, "max_queue_delay_microseconds": 0}
    b = {"max_batch_size": 4, "max_queue_delay_microseconds": 0}
    with LocalLauncher(settings.model_repository, models=["encoder_sim"], install=triton_install) as server:
        loads = []
        apply = server.apply_config
        server.apply_config = lambda model, config: loads.append(config.max_batch_size) or apply(model, config)
        evaluate = make_evaluate(server, settings, base, traffic=study_traffic(settings))
        records = [evaluate(p, Hints()) for p in (a, a, b, a)]
    assert [r.outcome for r in records] == [MEASURED] * 4
    assert loads == [8, 4, 8]  # the second evaluation of a ran on the server as it was
    assert [r.warmup is not None for r in records] == [True, False, True, True]
    assert records[0].warmup.stable and records[0].warmup.sweep_requests >= 8
    assert all(r.at_load.requests > 0 for r in records)  # measured all the same
