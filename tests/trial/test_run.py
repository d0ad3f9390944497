"""`tuner.trial.run.make_evaluate` on a real tritonserver: a configuration evaluated again right after
its own measurement is neither loaded again nor warmed (the re-measurement's mirrored rounds); any other
is loaded and warmed; a server that dies during a load is started again and the load tried once more."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import ROOT, write_tune_study

from tuner import modelconfig
from tuner.server.local import LocalLauncher
from tuner.settings import read_study
from tuner.study import study_traffic
from tuner.trial import CRASHED, MEASURED, Hints
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


# encoder_sim behind a load that kills its own tritonserver: on the first load only (the marker file does
# not exist yet: a flake, as Triton's Python backend once aborted on a reload), or on every load of one
# max_batch_size (a configuration that brings the server down, as an out-of-memory can on a GPU)
CRASHING_MODEL = '''
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from emulated import TritonPythonModel as Emulated  # noqa: E402


def _server_pid():
    pid = os.getppid()  # the stub's parent, or a shell between them
    while pid > 1:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() == "tritonserver":
                return pid
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no tritonserver above this stub")


class TritonPythonModel(Emulated):
    def initialize(self, args):
        config = json.loads(args["model_config"])
        marker = config["parameters"]["crash_marker"]["string_value"]
        always = int(config["parameters"]["crash_batch_size"]["string_value"])
        if config["max_batch_size"] == always or not os.path.exists(marker):
            with open(marker, "a") as f:
                f.write(f"{config['max_batch_size']}\\n")
            os.kill(_server_pid(), signal.SIGKILL)
            time.sleep(60)
        super().initialize(args)
'''


@pytest.mark.slow
def test_a_server_that_dies_during_a_load_is_started_again_and_only_a_second_death_is_the_configurations(
        tmp_path, triton_install):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository_templates" / "encoder_sim", repo / "encoder_sim")
    version = repo / "encoder_sim" / "1"
    (version / "model.py").rename(version / "emulated.py")
    (version / "model.py").write_text(CRASHING_MODEL)
    marker = tmp_path / "loads-that-crashed"
    config = repo / "encoder_sim" / "config.pbtxt"
    cold = 'parameters { key: "cold_start_factor" value { string_value: "21" } }'
    assert cold in config.read_text()
    config.write_text(config.read_text().replace(cold, cold.replace('"21"', '"1"'))  # the trials are about loads
                      + f'parameters {{ key: "crash_marker" value {{ string_value: "{marker}" }} }}\n'
                      'parameters { key: "crash_batch_size" value { string_value: "13" } }\n')
    settings = read_study(write_tune_study(
        tmp_path, "crash", repo=repo, measurement={"window_s": 0.5, "warmup_max_s": 15, "max_repeats": 1},
        **{"search.max_batch_size": {"low": 1, "high": 16, "log": True}, "search.capacity.max_steps": 1}))
    base = modelconfig.load(config)
    # nothing loaded at the server's start: each load is a trial's
    with LocalLauncher(settings.model_repository, models=["encoder_sim"], load_models=False,
                       install=triton_install) as server:
        evaluate = make_evaluate(server, settings, base, traffic=study_traffic(settings))
        pid = server._proc.pid
        survived = evaluate({"max_batch_size": 8, "max_queue_delay_microseconds": 0}, Hints())
        assert survived.outcome == MEASURED and survived.at_load.requests > 0
        assert "crashed during this configuration's load and was started again" in survived.note
        assert server._proc.pid != pid  # a new server
        assert marker.read_text().split() == ["8"]

        pid = server._proc.pid
        crashed = evaluate({"max_batch_size": 13, "max_queue_delay_microseconds": 0}, Hints())
        assert crashed.outcome == CRASHED and not crashed.meets_sla
        assert "the server crashed loading this configuration 2 times" in crashed.sla_reason
        assert "last log lines" in crashed.note
        assert marker.read_text().split() == ["8", "13", "13"]
        assert server.is_alive() and server._proc.pid != pid  # started again for the next trial

        after = evaluate({"max_batch_size": 4, "max_queue_delay_microseconds": 0}, Hints())
        assert after.outcome == MEASURED and not after.note
        assert marker.read_text().split() == ["8", "13", "13"]
