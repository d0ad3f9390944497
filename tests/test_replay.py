"""The open-loop replay against a real tritonserver (tests/data/replay_models: `echo` and `flaky`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.errors import ServerSetupError, TrafficError
from tuner.localhost import OWNER_FILE, add_owner, sweep_owned
from tuner.measurement import measure
from tuner.replay import MAX_REQUEST_BYTES, describe_inputs, peak_rate, plan_requests, replay
from tuner.replay._processes import REPLAY_PREFIX as PREFIX
from tuner.server.base import Endpoints
from tuner.server.local import LocalLauncher
from tuner.settings import ReplaySettings

MODELS = Path(__file__).resolve().parent / "data" / "replay_models"


@pytest.fixture(scope="module")
def server(triton_install):
    with LocalLauncher(MODELS, models=["echo", "flaky", "dtypes", "optional_only"], install=triton_install) as launcher:
        yield launcher


def uniform(rate: float, duration_s: float, seq_len: int | None = 16, **columns) -> pd.DataFrame:
    n = int(rate * duration_s)
    df = pd.DataFrame({"timestamp": 100.0 + np.arange(n) / rate, **columns})
    if seq_len is not None:
        df["seq_len"] = seq_len
    return df


def settings(**kw) -> ReplaySettings:
    return ReplaySettings(**{"workers": 1, "warmup_s": 0.5, **kw})


@pytest.mark.slow
def test_replay_sends_every_request_on_time_and_keeps_a_record_of_each(server):
    traffic = uniform(100, 3.0, seq_len=None)
    traffic["seq_len"] = np.arange(len(traffic)) % 7 + 4
    result = replay(server.endpoints, "echo", traffic, speed=2.0, settings=settings())
    recs = result.records
    assert len(recs) == 300 and recs["ok"].all() and (recs["error"] == "").all()
    assert result.mode == "local" and result.workers == 1
    # speed 2: the 3 s of traffic is due within 1.5 s
    assert recs["due_s"].iloc[-1] == pytest.approx(299 / 200)
    assert np.allclose(recs["latency_ms"], (recs["end_s"] - recs["due_s"]) * 1000)
    assert (recs["send_lag_ms"] >= 0).all() and recs["send_lag_ms"].median() < 2.0
    assert result.stats_after["inference_count"] - result.stats_before["inference_count"] == pytest.approx(
        (recs["due_s"] >= 0.5).sum(), abs=5)
    m = measure(recs, result.stats_before, result.stats_after, speed=2.0, warmup_s=0.5, lag_budget_ms=50,
                max_batch_size=32)
    assert m.requests == (recs["due_s"] >= 0.5).sum() and m.errors == 0
    assert m.throughput_rps == pytest.approx(200, rel=0.1)
    assert m.execution_count > 0 and m.busy_s > 0 and 0 < m.fill_rate <= 1
    # Locust's own statistics counted every request too (its events are fired off the send path)
    assert result.details["locust"] == {"requests": 300, "failures": 0}


@pytest.mark.slow
def test_a_window_asked_for_ends_where_asked_not_at_its_last_due_request(server):
    """A step's window lasts its length at its speed however early its last request is due: the offered
    rate is per second of the window (a sparse step read 29 requests / 9.32 s, not / 10 s)."""
    traffic = uniform(100, 1.0, seq_len=None)  # 100 requests due in [0, 0.99] s, then nothing
    traffic["seq_len"] = 4
    result = replay(server.endpoints, "echo", traffic, speed=1.0, settings=settings(), duration_s=2.0)
    assert len(result.records) == 100 and result.duration_s == 2.0
    m = measure(result.records, result.stats_before, result.stats_after, speed=1.0, warmup_s=0.5,
                lag_budget_ms=50, max_batch_size=32, duration_s=result.duration_s)
    assert m.requests == 50 and m.duration_s == pytest.approx(1.5) and m.offered_rps == pytest.approx(50 / 1.5)
    # the throughput stays what was served over the time it took, the window's end aside
    assert m.throughput_rps == pytest.approx(50 / (result.records["end_s"].max() - 0.5))
    # no window asked for: the traffic's own span at that speed
    whole = replay(server.endpoints, "echo", traffic, speed=2.0, settings=settings())
    assert whole.duration_s == pytest.approx(0.99 / 2)


@pytest.mark.slow
def test_grpc_and_distributed_mode_replay_the_same_schedule(server):
    traffic = uniform(150, 2.0)
    grpc = replay(server.endpoints, "echo", traffic, speed=1.0, settings=settings(protocol="grpc"))
    assert grpc.records["ok"].all() and len(grpc.records) == 300
    spread = replay(server.endpoints, "echo", traffic, speed=1.0, settings=settings(workers=2))
    assert spread.mode == "distributed" and spread.workers == 2
    recs = spread.records
    assert recs["ok"].all() and list(recs["row"]) == list(range(300))
    # every other request from each worker, all from one common start time
    assert set(recs["worker"][::2]) == {0} and set(recs["worker"][1::2]) == {1}
    assert recs["send_lag_ms"].median() < 2.0
    assert len(spread.details["processes"]) == 2
    # the master's statistics hold both workers' final reports
    assert spread.details["locust"] == {"requests": 300, "failures": 0}
    assert grpc.details["locust"] == {"requests": 300, "failures": 0}


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_every_datatype_goes_out_as_prepared_requests(server, protocol):
    """The dtypes model takes FP16, FP32, INT64, UINT8, BOOL and STRING inputs, fixed and variable."""
    traffic = uniform(100, 1.0, seq_len=None)
    traffic["batch_size"] = np.arange(len(traffic)) % 3 + 1
    traffic["seq_len"] = np.arange(len(traffic)) % 5 + 1
    before = server.statistics("dtypes")["inference_count"]
    result = replay(server.endpoints, "dtypes", traffic, speed=1.0, settings=settings(protocol=protocol, warmup_s=0.0))
    assert result.records["ok"].all(), result.records["error"].unique()
    assert result.details["plan_shapes"] == 15  # 3 batch sizes x 5 lengths, each prepared once
    after = server.statistics("dtypes")["inference_count"]
    assert after - before == traffic["batch_size"].sum()  # every row of every batch


@pytest.mark.slow
def test_a_model_of_optional_inputs_gets_the_ones_the_traffic_sizes(server):
    """Every input optional: the one with a column is sent and answered; none sized is refused up front."""
    traffic = uniform(20, 1.0, seq_len=None, **{"B:0": 3})
    result = replay(server.endpoints, "optional_only", traffic, speed=1.0, settings=settings(warmup_s=0.0))
    assert len(result.records) == len(traffic) and result.records["ok"].all(), result.records["error"].unique()
    before = server.statistics("optional_only")["inference_count"]
    with pytest.raises(TrafficError, match="every input is optional"):
        replay(server.endpoints, "optional_only", uniform(20, 1.0), speed=1.0, settings=settings(warmup_s=0.0))
    assert server.statistics("optional_only")["inference_count"] == before  # nothing was sent


@pytest.mark.slow
def test_errors_are_counted_not_fatal(server):
    result = replay(server.endpoints, "flaky", uniform(200, 2.5), speed=1.0, settings=settings(warmup_s=0.0))
    m = measure(result.records, result.stats_before, result.stats_after, speed=1.0, warmup_s=0.0,
                lag_budget_ms=50, max_batch_size=16)
    assert m.requests == 500
    assert m.error_rate == pytest.approx(0.10, abs=0.003)
    failed = result.records[~result.records["ok"]]
    assert failed["error"].str.contains("fails on purpose").all()


@pytest.mark.slow
def test_a_paused_server_shows_in_latency_and_the_sends_stay_on_schedule(server):
    """No coordinated omission: SIGSTOP the server for 1 s in the middle of the replay."""
    pause: dict[str, float] = {}

    def pause_server():
        # the window is taken inside the pause: stopped before `stop`, running again only after `cont`
        os.kill(server.pid, signal.SIGSTOP)
        pause["stop"] = time.monotonic()
        time.sleep(1.0)
        pause["cont"] = time.monotonic()
        os.kill(server.pid, signal.SIGCONT)

    def stats_then_pause():
        # Called at the end of the warm-up: snapshot, then stop the server for one second.
        snapshot = server.statistics("echo")
        if not pause:
            threading.Thread(target=pause_server, daemon=True).start()
        return snapshot

    try:
        result = replay(server.endpoints, "echo", uniform(100, 3.5), speed=1.0, settings=settings(warmup_s=1.0),
                        stats=stats_then_pause)
    finally:
        os.kill(server.pid, signal.SIGCONT)
    recs = result.records
    t0 = result.details["t0_monotonic"]
    stop, cont = pause["stop"] - t0, pause["cont"] - t0
    during = recs[(recs["due_s"] > stop + 0.02) & (recs["due_s"] < cont - 0.02)]
    assert len(during) >= 80 and during["ok"].all()
    # each answer came after the pause, and its latency counts from its due time
    assert (during["end_s"] >= cont - 0.005).all()
    assert np.allclose(during["latency_ms"], (during["end_s"] - during["due_s"]) * 1000)
    assert during["latency_ms"].iloc[0] > 900 and during["latency_ms"].iloc[-1] < 200
    # the sends went out on time while the server was stopped: a generator that waited for answers
    # would show lags growing to the pause's length (~1000 ms). (Bounds leave room for a busy machine,
    # where a process can wait tens of ms for a core.)
    assert during["send_lag_ms"].median() < 1.0
    assert during["send_lag_ms"].max() < 300.0
    # (the burst of answers right after the pause may delay a few sends by some ms: not asserted)
    assert recs["send_lag_ms"].median() < 1.0


@pytest.mark.slow
def test_requests_past_max_in_flight_are_dropped_and_counted_not_queued(server):
    result = replay(server.endpoints, "echo", uniform(500, 1.0), speed=1.0, settings=settings(max_in_flight=1))
    recs = result.records
    dropped = recs[recs["send_s"].isna()]
    assert 0 < len(dropped) < len(recs)
    assert (~dropped["ok"]).all() and dropped["error"].str.contains("replay.max_in_flight").all()
    # the schedule went on: the requests that were sent left on time
    assert recs["send_lag_ms"].dropna().median() < 2.0


@pytest.mark.slow
def test_a_killed_caller_leaves_no_load_generator_running(server, tmp_path):
    psutil = pytest.importorskip("psutil")
    script = tmp_path / "caller.py"
    script.write_text(
        "import numpy as np, pandas as pd\n"
        "from tuner.replay import replay\n"
        "from tuner.server.base import Endpoints\n"
        "from tuner.settings import ReplaySettings\n"
        f"ep = Endpoints({server.endpoints.http!r}, {server.endpoints.grpc!r}, '')\n"
        "t = pd.DataFrame({'timestamp': np.arange(3000) / 100.0, 'seq_len': 8})\n"
        "replay(ep, 'echo', t, speed=1.0, settings=ReplaySettings(workers=2))\n")
    caller = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 30
        children: list = []
        # the fork server and what it forked: master + 2 workers
        while time.monotonic() < deadline and len(children) < 4 and caller.poll() is None:
            time.sleep(0.2)
            children = [c for c in psutil.Process(caller.pid).children(recursive=True)
                        if "tuner.replay" in " ".join(c.cmdline())]
        assert caller.poll() is None, f"the caller exited with {caller.returncode} (its error above)"
        assert len(children) == 4
    finally:
        caller.kill()
        caller.wait()

    def running(process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE  # a zombie has exited, awaiting its reaper
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 10
    while any(running(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c.pid for c in children if running(c)]


def test_an_unreachable_server_is_a_setup_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nobody = Endpoints(f"127.0.0.1:{port}", f"127.0.0.1:{port}", f"http://127.0.0.1:{port}/metrics")
    with pytest.raises(ServerSetupError, match="cannot reach Triton"):
        replay(nobody, "echo", uniform(10, 1), speed=1.0, settings=settings())


@pytest.mark.slow
def test_a_missing_model_is_a_setup_error(server):
    with pytest.raises(ServerSetupError, match="model 'nope' is not loaded"):
        replay(server.endpoints, "nope", uniform(10, 1), speed=1.0, settings=settings())


@pytest.mark.slow
@pytest.mark.parametrize("traffic, message", [
    (uniform(10, 1, seq_len=None), "variable dim 0 and the traffic has no 'seq_len' or 'INPUT_IDS:0'"),
    (uniform(10, 1, batch_size=64), "batch_size 64 exceeds model 'echo' max_batch_size 32"),
    (uniform(10, 1, seq_len=0), "seq_len=0 is not a positive integer"),
    (uniform(10, 1, seq_len=10**12), r"traffic row 1, timestamp 100.0: its request would carry 3.64 TiB"),
])
def test_traffic_that_does_not_fit_the_model_is_a_traffic_error(server, traffic, message):
    with pytest.raises(TrafficError, match=message):
        replay(server.endpoints, "echo", traffic, speed=1.0, settings=settings())


CONFIG = {"name": "m", "max_batch_size": 8, "input": [
    {"name": "IDS", "data_type": "TYPE_INT32", "dims": [-1]},
    {"name": "MASK", "data_type": "TYPE_FP32", "dims": [-1, 4]},
    {"name": "EXTRA", "data_type": "TYPE_FP32", "dims": [3], "optional": True},
], "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}]}


def test_shapes_map_batch_size_and_seq_len_onto_the_inputs():
    traffic = pd.DataFrame({"timestamp": [0.0, 1, 2, 3], "batch_size": [1, 2, 2, 1],
                            "seq_len": [5, 7, 7, 5], "MASK:0": [9, 9, 9, 2]})
    plan = plan_requests({"name": "m"}, CONFIG, traffic)
    assert [i.name for i in plan.inputs] == ["IDS", "MASK"]  # optional inputs are not sent
    assert plan.outputs == ("OUT",)
    shapes = [plan.shapes[k] for k in plan.shape_ids]
    assert shapes == [[[1, 5], [1, 9, 4]], [[2, 7], [2, 9, 4]], [[2, 7], [2, 9, 4]], [[1, 5], [1, 2, 4]]]
    assert len(plan.shapes) == 3  # tensors are made once per distinct shape


def test_a_non_batching_model_takes_only_single_requests():
    config = {**CONFIG, "max_batch_size": 0}
    plan = plan_requests({"name": "m"}, config, pd.DataFrame({"timestamp": [0.0], "seq_len": [3]}))
    assert plan.shapes == [[[3], [3, 4]]]
    with pytest.raises(TrafficError, match="does not batch"):
        plan_requests({"name": "m"}, config, pd.DataFrame({"timestamp": [0.0], "seq_len": [3],
                                                           "batch_size": [2]}))


def test_a_column_contradicting_a_fixed_dim_names_the_row():
    traffic = pd.DataFrame({"timestamp": [0.0, 1], "seq_len": [3, 3], "MASK:1": [4, 5]})
    with pytest.raises(TrafficError, match=r"traffic row 2, timestamp 1.0: MASK:1=5 but model 'm' input MASK dim 1 is fixed at 4"):
        plan_requests({"name": "m"}, CONFIG, traffic)


def test_an_optional_input_is_sent_when_the_traffic_has_a_column_for_it():
    traffic = pd.DataFrame({"timestamp": [0.0, 1], "seq_len": [5, 6], "EXTRA:0": [3, 3]})
    plan = plan_requests({"name": "m"}, CONFIG, traffic)
    assert [i.name for i in plan.inputs] == ["IDS", "MASK", "EXTRA"]
    assert [plan.shapes[k] for k in plan.shape_ids] == [[[1, 5], [1, 5, 4], [1, 3]], [[1, 6], [1, 6, 4], [1, 3]]]


OPTIONAL_ONLY = {"name": "opt", "max_batch_size": 8, "input": [
    {"name": "A", "data_type": "TYPE_STRING", "dims": [-1], "optional": True},
    {"name": "B", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
], "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}]}


def test_a_model_left_with_no_input_to_send_is_refused_in_one_line():
    with pytest.raises(TrafficError) as info:
        plan_requests({"name": "opt"}, OPTIONAL_ONLY, pd.DataFrame({"timestamp": [0.0], "seq_len": [4]}))
    assert str(info.value) == ("model 'opt': every input is optional (A, B) and the traffic has no <INPUT>:<k> "
                               "column for any, so a request would carry no input; add one such as 'A:0' to "
                               "send that input")
    # a column for one of them sends it; seq_len sizes its other variable dims as any input's
    plan = plan_requests({"name": "opt"}, OPTIONAL_ONLY, pd.DataFrame({"timestamp": [0.0], "B:0": [4]}))
    assert [(i.name, i.datatype) for i in plan.inputs] == [("B", "INT32")] and plan.shapes == [[[1, 4]]]
    # a model whose config lists no inputs (a backend fills them in as it loads) is not refused for it
    assert plan_requests({"name": "m"}, {"max_batch_size": 8}, pd.DataFrame({"timestamp": [0.0]})).inputs == ()


@pytest.mark.parametrize("column, says", [
    ("MASKS:0", "traffic column 'MASKS:0': model 'm' has no input 'MASKS' (did you mean MASK?)"),
    ("POS:0", "traffic column 'POS:0': model 'm' has no input 'POS' (its inputs: IDS, MASK, EXTRA)"),
    ("IDS:1", "traffic column 'IDS:1': model 'm' input IDS has no dim '1' (its dims after the batch dim: 0)"),
    ("MASK:2", "traffic column 'MASK:2': model 'm' input MASK has no dim '2' (its dims after the batch dim: 0, 1)"),
    ("MASK:01", "traffic column 'MASK:01': model 'm' input MASK has no dim '01'"),
    ("MASK:x", "traffic column 'MASK:x': model 'm' input MASK has no dim 'x'"),
])
def test_a_shape_column_no_input_takes_is_refused_naming_it(column, says):
    traffic = pd.DataFrame({"timestamp": [0.0], "seq_len": [3], column: [4]})
    with pytest.raises(TrafficError) as info:
        plan_requests({"name": "m"}, CONFIG, traffic)
    assert str(info.value).startswith(says) and "\n" not in str(info.value)
    assert str(info.value).endswith("an <INPUT>:<k> column gives dim k of that input")


def test_an_input_without_a_datatype_is_refused_not_a_traceback():
    config = {"name": "m", "max_batch_size": 8, "input": [{"name": "X", "dims": [4]}]}
    with pytest.raises(TrafficError, match="model 'm' input X: datatype INVALID is not supported"):
        plan_requests({"name": "m"}, config, pd.DataFrame({"timestamp": [0.0]}))


def test_describe_inputs_says_what_each_input_is_sent_as():
    config = {"name": "six", "max_batch_size": 8, "input": [
        {"name": "IDS", "data_type": "TYPE_INT64", "dims": [-1]},
        {"name": "FLAGS", "data_type": "TYPE_BOOL", "dims": [-1, 2]},
        {"name": "HALF", "data_type": "TYPE_FP16", "dims": [3]},
        {"name": "IMG", "data_type": "TYPE_FP32", "dims": [4, 4], "reshape": {"shape": [16]}},
        {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "POS", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
    ]}
    traffic = pd.DataFrame({"timestamp": [0.0], "batch_size": [2], "seq_len": [7], "FLAGS:0": [5], "IMG:1": [4]})
    assert describe_inputs(config, traffic) == [
        "IDS: INT64 [batch_size, -1 from seq_len], sent",
        "FLAGS: BOOL [batch_size, -1 from FLAGS:0, 2], sent",
        "HALF: FP16 [batch_size, 3], sent",
        "IMG: FP32 [batch_size, 4, 4 from IMG:1], sent",
        "TEXT: BYTES [batch_size, 1], sent",
        "POS: INT32 [batch_size, -1], optional, not sent (no POS:<k> column)",
    ]
    unbatched = describe_inputs({**config, "max_batch_size": 0}, traffic.assign(**{"POS:0": [2]}))
    assert unbatched[0] == "IDS: INT64 [-1 from seq_len], sent"
    assert unbatched[-1] == "POS: INT32 [-1 from POS:0], sent"
    assert describe_inputs(config, traffic.drop(columns="batch_size"))[2] == "HALF: FP16 [batch 1, 3], sent"
    with pytest.raises(TrafficError, match="traffic column 'IMG:2'"):  # the replay's own refusals
        describe_inputs(config, traffic.assign(**{"IMG:2": [1]}))


def test_peak_rate_is_the_busiest_second():
    due = np.concatenate([np.arange(100) / 100.0, 1.0 + np.arange(300) / 300.0])  # 100/s, then 300/s
    assert peak_rate(due) == 300.0
    assert peak_rate(np.array([])) == 0.0


def test_a_row_too_large_for_any_request_is_refused_naming_it_and_the_limit():
    traffic = pd.DataFrame({"timestamp": [0.0, 0.5, 1.0, 2.0], "batch_size": [1, 1, 2, 1],
                            "seq_len": [5, 10**12, 10**12, 7]})
    with pytest.raises(TrafficError) as info:
        plan_requests({"name": "m"}, CONFIG, traffic)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("traffic row 2, timestamp 0.5: its request would carry 18.19 TiB of tensor data "
                              "(IDS [1, 1000000000000] INT32, MASK [1, 1000000000000, 4] FP32)")
    assert message.endswith("above the replay's limit of 64 MiB per request for model 'm'")
    # just under the limit is fine: 64 MiB of FP32 mask and INT32 ids, 20 bytes per token
    fits = MAX_REQUEST_BYTES // 20
    plan = plan_requests({"name": "m"}, CONFIG, pd.DataFrame({"timestamp": [0.0], "seq_len": [fits]}))
    assert plan.shapes == [[[1, fits], [1, fits, 4]]]
    with pytest.raises(TrafficError, match=r"^traffic row 1, timestamp 0.0: "):
        plan_requests({"name": "m"}, CONFIG, pd.DataFrame({"timestamp": [0.0], "seq_len": [fits + 1]}))
    # a warm-up's synthetic rows (1 up to max_batch_size rows of a long request): those over the limit left out
    sweep = pd.DataFrame({"timestamp": [0.0, 1.0, 2.0], "batch_size": [1, 2, 3], "seq_len": fits // 2})
    kept = plan_requests({"name": "m"}, CONFIG, sweep, drop_oversize=True)
    assert [shapes[0][0] for shapes in kept.shapes] == [1, 2]
    # dims so large that their product overflows 64-bit integers are still named, not wrapped around
    with pytest.raises(TrafficError, match=r"traffic row 1, timestamp 0.0.*PiB"):
        plan_requests({"name": "m"}, CONFIG, pd.DataFrame({"timestamp": [0.0], "seq_len": [1e18]}))


def test_a_stale_directory_goes_only_when_its_owner_is_gone(tmp_path):
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    dead, alive, unowned = (tmp_path / f"{PREFIX}{name}" for name in ("dead", "alive", "unowned"))
    for path in (dead, alive, unowned):
        path.mkdir()
        (path / "records-0.npz").write_bytes(b"x")
    (dead / OWNER_FILE).write_text(finished.stdout.strip())
    (alive / OWNER_FILE).write_text(str(os.getpid()))
    # a dead owner whose server still runs (shutting down after its owner's kill): kept until both are gone
    serving = tmp_path / f"{PREFIX}serving"
    serving.mkdir()
    (serving / OWNER_FILE).write_text(finished.stdout.strip())
    add_owner(serving, os.getpid())
    assert sweep_owned(PREFIX, tmp_path) == [dead]
    assert not dead.exists() and alive.exists() and unowned.exists() and serving.exists()
    (serving / OWNER_FILE).write_text(f"{finished.stdout.strip()}\n{finished.stdout.strip()}")
    assert sweep_owned(PREFIX, tmp_path) == [serving]


def owner(path: Path) -> str | None:
    try:
        return (path / OWNER_FILE).read_text()
    except OSError:  # another replay's directory, gone meanwhile
        return None


@pytest.mark.slow
def test_the_directory_of_a_killed_replay_is_removed_by_the_next_one(server, tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(
        "import numpy as np, pandas as pd\n"
        "from tuner.replay import replay\n"
        "from tuner.server.base import Endpoints\n"
        "from tuner.settings import ReplaySettings\n"
        f"ep = Endpoints({server.endpoints.http!r}, {server.endpoints.grpc!r}, '')\n"
        "t = pd.DataFrame({'timestamp': np.arange(3000) / 100.0, 'seq_len': 8})\n"
        "replay(ep, 'echo', t, speed=1.0, settings=ReplaySettings(workers=1))\n")
    root = str(Path(__file__).resolve().parent.parent)  # this checkout's tuner, whatever is installed
    caller = subprocess.Popen([sys.executable, str(script)],
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                                  root, os.environ.get("PYTHONPATH")]))})
    try:
        deadline = time.monotonic() + 60
        mine: list[Path] = []
        while time.monotonic() < deadline and not mine and caller.poll() is None:
            time.sleep(0.2)
            mine = [p for p in Path(tempfile.gettempdir()).glob(f"{PREFIX}*")
                    if (p / "spec.json").exists() and owner(p) == str(caller.pid)]
        assert caller.poll() is None, f"the caller exited with {caller.returncode} (its error above)"
        assert mine, "the caller never started its replay"
    finally:
        caller.kill()
        caller.wait()
    assert mine[0].exists()  # SIGKILL left it behind
    replay(server.endpoints, "echo", uniform(20, 0.5), speed=1.0, settings=settings())
    assert not mine[0].exists()


def test_the_records_table_numbers_the_replays_and_marks_what_each_one_measured():
    import pandas as pd

    from tuner.replay import ReplayResult, records_table

    def result(due: list[float], warmup_s: float, speed: float) -> ReplayResult:
        records = pd.DataFrame({"row": range(len(due)), "due_s": due, "latency_ms": 1.0, "ok": True,
                                "itl_ms": [[1.0, 2.0]] * len(due)})
        return ReplayResult(records=records, stats_before=None, stats_after=None, speed=speed, warmup_s=warmup_s, duration_s=max(due), mode="local",
                            workers=1, reason="", load_generator_cpu=0.0)

    table = records_table([result([0.0, 0.5, 1.0], 0.5, 2.0), result([0.0, 1.0], 1.0, 4.0)])
    assert list(table.columns) == ["replay", "speed", "measured", "row", "due_s", "latency_ms", "ok"]
    assert table["replay"].tolist() == [1, 1, 1, 2, 2] and table["speed"].tolist() == [2.0] * 3 + [4.0] * 2
    assert table["measured"].tolist() == [False, True, True, False, True]  # due at or after each one's warm-up
    assert list(records_table([]).columns) == ["replay", "speed", "measured"]
