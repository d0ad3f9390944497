"""`tuner.trial.step.replay_measured` on a real tritonserver, through the watch every replay against a
launcher runs with (`tuner.server.base.exit_watch`): a live server's replay runs its whole schedule; a
server killed in the middle of one ends it within seconds, with the launcher's own error."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pandas as pd
import pytest
from support import write_tune_study

from tuner.errors import ServerError
from tuner.server.local import LocalLauncher
from tuner.settings import read_study
from tuner.trial.step import replay_measured

pytestmark = pytest.mark.slow


def steady_traffic(rate: float, seconds: float) -> pd.DataFrame:
    n = int(rate * seconds)
    return pd.DataFrame({"timestamp": np.arange(n) / rate, "batch_size": 1, "seq_len": 64})


def test_a_live_servers_replay_runs_its_whole_schedule_while_the_watch_asks_whether_it_exited(
        tmp_path, local_server):
    settings = read_study(write_tune_study(tmp_path, "live"))
    part = steady_traffic(20, 3.0)
    asked = []
    exited = local_server.exited
    local_server.exited = lambda: asked.append(1) or exited()
    try:
        m, result = replay_measured(local_server, settings, part, speed=1.0, warmup_s=0.5, max_batch_size=64,
                                    workers=1)
    finally:
        del local_server.exited
    assert len(asked) >= 2  # once a second: the watch ran, and never stopped a server that answers
    assert not result.stopped and len(result.records) == len(part) and result.records["ok"].all()
    assert m.requests == int((result.records["due_s"] >= 0.5).sum()) and m.errors == 0


def test_a_server_killed_mid_replay_ends_it_within_seconds_with_the_launchers_error(tmp_path, triton_install):
    """Before the watch, the replay sent the rest of its 60 s to a dead port, and only then failed."""
    settings = read_study(write_tune_study(tmp_path, "kill"))
    part = steady_traffic(20, 60.0)
    killed: list[tuple[int, float]] = []
    with LocalLauncher(settings.model_repository, models=["encoder_sim"], install=triton_install) as server:

        def kill_once_the_replay_runs() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                # statistics count from the load: the first inference means the replay is under way
                if server.statistics("encoder_sim")["inference_count"] > 0:
                    time.sleep(3.0)
                    pid = server.pid
                    os.kill(pid, signal.SIGKILL)  # the launcher's own tritonserver process
                    killed.append((pid, time.monotonic()))
                    return
                time.sleep(0.1)

        killer = threading.Thread(target=kill_once_the_replay_runs, daemon=True)
        killer.start()
        started = time.monotonic()
        with pytest.raises(ServerError) as caught:
            replay_measured(server, settings, part, speed=1.0, warmup_s=0.5, max_batch_size=64, workers=1)
        ended = time.monotonic()
        killer.join(timeout=5)
    assert killed, "the server was never killed: the replay did not start"
    pid, at = killed[0]
    assert ended - at < 15, f"the replay went on {ended - at:.1f} s after the kill ({ended - started:.1f} s in all)"
    # the local launcher's own words: which process, how it exited, where its log stays (one line)
    message = str(caught.value)
    assert message.startswith(f"tritonserver (pid {pid}) exited with code -9"), message
    assert "; its log: " in message and "\n" not in message
