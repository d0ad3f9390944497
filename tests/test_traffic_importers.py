"""tuner.traffic.importers: Triton trace files (a real one from a real tritonserver), the Azure
columns, and any CSV with a column mapping.

The fixture tests/data/triton_trace_timestamps.json was recorded with `_record_trace` below
(`python tests/test_traffic_importers.py tests/data/triton_trace_timestamps.json`): 12 HTTP requests
to `echo_a` and 6 gRPC requests to `echo_b`, 40 ms apart, traced at level=TIMESTAMPS, rate=1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.cli import main
from tuner.errors import TrafficError
from tuner.server.install import TritonInstall, find_tritonserver
from tuner.traffic import import_azure, import_csv, import_triton_trace, read_traffic

DATA = Path(__file__).resolve().parent / "data"
FIXTURE = DATA / "triton_trace_timestamps.json"

MODEL_PY = """
import os, sys
for p in reversed(os.environ.get("TUNER_MODEL_PYTHONPATH", "").split(os.pathsep)):
    if p and p not in sys.path:
        sys.path.insert(0, p)
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x)]))
        return out
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT", data_type: TYPE_FP32, dims: [ 4 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record_trace(
    workdir: Path, http_requests: int = 12, grpc_requests: int = 6, gap_s: float = 0.04, extra: tuple = (),
    install: TritonInstall | None = None,
):
    """Start a real tritonserver with tracing, send requests at a known pace, stop it; returns the
    trace file and, per model, each request's (sent, answered) times on the client's monotonic clock.
    The server is tuner's own install (the user cache `tuner server install` fills), found or
    installed by `find_tritonserver`."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    install = install or find_tritonserver()
    repo, trace = workdir / "repo", workdir / "trace.json"
    for name in ("echo_a", "echo_b"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(MODEL_PY)
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=str(install.lib_dir),
        TUNER_MODEL_PYTHONPATH=str(install.model_pythonpath),
    )
    log = open(workdir / "server.log", "wb")
    sent: dict[str, list[tuple[float, float]]] = {"echo_a": [], "echo_b": []}
    proc = None
    try:
        # a port picked free can be taken by another process before tritonserver binds it (a busy
        # machine running other suites): a server that exits while starting is started again
        for _attempt in range(3):
            http_port, grpc_port = _free_port(), _free_port()
            cmd = _traced_server_cmd(install, repo, trace, (http_port, grpc_port, _free_port()), extra)
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            if _ready(proc, http_port):
                break
        else:
            raise RuntimeError(f"tritonserver did not start: {(workdir / 'server.log').read_text()[-2000:]}")
        data = np.ones((1, 4), dtype=np.float32)
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        hin = httpclient.InferInput("INPUT", [1, 4], "FP32")
        hin.set_data_from_numpy(data)
        gin = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        gin.set_data_from_numpy(data)
        start = time.monotonic()
        for i in range(max(http_requests, grpc_requests)):
            time.sleep(max(0.0, start + i * gap_s - time.monotonic()))
            if i < http_requests:
                before = time.monotonic()
                http.infer("echo_a", [hin])
                sent["echo_a"].append((before, time.monotonic()))
            if i < grpc_requests:
                before = time.monotonic()
                grpc.infer("echo_b", [gin])
                sent["echo_b"].append((before, time.monotonic()))
        http.close()
        grpc.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # a clean shutdown writes the collected traces
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
    return trace, sent


def _traced_server_cmd(install: TritonInstall, repo: Path, trace: Path, ports: tuple[int, int, int],
                       extra: tuple) -> list[str]:
    http_port, grpc_port, metrics_port = ports
    return [
        str(install.binary),
        "--model-repository",
        str(repo),
        "--backend-directory",
        str(install.backends_dir),
        "--http-address",
        "127.0.0.1",
        "--grpc-address",
        "127.0.0.1",
        "--metrics-address",
        "127.0.0.1",
        f"--http-port={http_port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--trace-config",
        f"triton,file={trace}",
        "--trace-config",
        "level=TIMESTAMPS",
        "--trace-config",
        "rate=1",
        *extra,
    ]


def _ready(proc: subprocess.Popen, http_port: int, timeout_s: float = 60) -> bool:
    """Whether the server answers ready; False once it has exited. A minute without either fails."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"tritonserver at port {http_port} was not ready within {timeout_s:g} s")
        time.sleep(0.2)
    return False


def _check_against_sends(df: pd.DataFrame, sent: dict[str, list[tuple[float, float]]]) -> None:
    """Each imported arrival lies within its own request's round trip, as the client timed it.

    Triton's trace clock is steady_clock, CLOCK_MONOTONIC on Linux, the clock of Python's
    time.monotonic(): the server received request i after the client sent it and before the answer
    came back. The client sends one request at a time, so the round trips are disjoint and in order:
    an importer that dropped, added, reordered or shifted a timestamp fails, however slowly a loaded
    machine schedules the client or the server: each gap between arrivals is the gap between the
    client's actual sends, within the two round trips (not the pace it aimed at)."""
    assert df["model"].value_counts().to_dict() == {m: len(t) for m, t in sent.items()}
    for model, trips in sent.items():
        arrivals = df.loc[df["model"] == model, "timestamp"].to_numpy()
        sends, answers = np.array(trips).T
        late = arrivals - sends
        early = answers - arrivals
        assert (late >= 0).all() and (early >= 0).all(), (model, late, early)


def test_fixture_is_a_real_triton_trace_with_both_protocols():
    entries = json.loads(FIXTURE.read_text())
    names = {t["name"] for e in entries for t in e.get("timestamps", [])}
    assert {"HTTP_RECV_START", "REQUEST_START", "QUEUE_START", "COMPUTE_START"} <= names
    assert {e.get("model_name") for e in entries} >= {"echo_a", "echo_b"}


def test_import_triton_trace_fixture_one_row_per_request_per_model():
    df = import_triton_trace(FIXTURE)
    assert list(df.columns) == ["timestamp", "batch_size", "model"]
    assert df["model"].value_counts().to_dict() == {"echo_a": 12, "echo_b": 6}
    assert df["timestamp"].is_monotonic_increasing
    a = df.loc[df["model"] == "echo_a", "timestamp"].to_numpy()
    assert abs(np.median(np.diff(a)) - 0.04) < 0.01
    # the HTTP requests arrive at HTTP_RECV_START, before the core's REQUEST_START
    entries = json.loads(FIXTURE.read_text())
    recv = sorted(t["ns"] for e in entries for t in e.get("timestamps", []) if t["name"] == "HTTP_RECV_START")
    assert a[0] == pytest.approx(recv[0] / 1e9, abs=1e-6)


def test_import_triton_cli_writes_a_profile(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    assert main(["traffic", "import", "triton", str(FIXTURE), "-o", str(out)]) == 0
    assert len(read_traffic(out)) == 18


@pytest.mark.parametrize(
    "content,expected",
    [
        ("", "empty file"),
        ("   \n", "empty file"),
        ("{not json", "expected a JSON list"),
        ('[{"id": 1}, {not json', "invalid JSON in entry 2: lexical error"),
        ('[{"id": 1}, {"id": 2}', "invalid JSON in entry 3: parse error: premature EOF"),
        ('{"id": 1}', "expected a JSON list"),
        ('[{"id": 1, "model_name": "m"}]', "no id / model_name / timestamps"),
        (
            '[{"id": 1, "model_name": "m"}, {"id": 1, "timestamps": [{"name": "COMPUTE_START", "ns": 5}]}]',
            "no traced requests with an arrival time",
        ),
    ],
)
def test_bad_trace_files(tmp_path, content, expected):
    path = tmp_path / "trace.json"
    path.write_text(content)
    with pytest.raises(TrafficError, match=expected):
        import_triton_trace(path)


def _trace(model="m", trace_id=1, stamps=None, **head) -> list[dict]:
    stamps = [{"name": "HTTP_RECV_START", "ns": 1_000}] if stamps is None else stamps
    return [{"id": trace_id, "model_name": model, **head}, {"id": trace_id, "timestamps": stamps}]


@pytest.mark.parametrize("entries,expected", [
    (_trace(trace_id=[1]), "entry 1: 'id' must be an integer, got [1]"),
    (_trace(trace_id={"a": 1}), "entry 1: 'id' must be an integer, got {'a': 1}"),
    (_trace(model=["m"]), "entry 1: 'model_name' must be a model's name, got ['m']"),
    (_trace(model=5), "entry 1: 'model_name' must be a model's name, got 5"),
    (_trace(parent_id="x"), "entry 1: 'parent_id' must be an integer, got 'x'"),
    (_trace(stamps="abc"), "entry 2: 'timestamps' must be a list of {name, ns} objects, got 'abc'"),
    (_trace(stamps={"name": "HTTP_RECV_START", "ns": 5}), "entry 2: 'timestamps' must be a list of"),
    (_trace(stamps=[{"name": "REQUEST_START", "ns": "Infinity"}]),
     "entry 2: REQUEST_START 'ns' must be a time in nanoseconds (an integer from 0), got 'Infinity'"),
    # past 64 bits the streaming parser itself refuses the number
    (_trace(stamps=[{"name": "HTTP_RECV_START", "ns": 10**30}]), "invalid JSON in entry 2: parse error: integer overflow"),
    (_trace(stamps=[{"name": "HTTP_RECV_START", "ns": -5}]), "got -5"),
    (_trace(stamps=[{"name": "HTTP_RECV_START", "ns": [1, 2]}]), "got [1, 2]"),
    (_trace(stamps=[{"name": "HTTP_RECV_START", "ns": True}]), "got True"),
    ([{"id": 1, "model_name": "m"}, 7], "not a Triton trace (entry 2 is 7, not an object)"),
])
def test_a_trace_entry_of_the_wrong_type_is_named(entries, expected, tmp_path, capsys):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(entries))
    with pytest.raises(TrafficError) as exc:
        import_triton_trace(path)
    assert str(exc.value).startswith(f"{path}: ") and expected in str(exc.value), str(exc.value)
    assert main(["traffic", "import", "triton", str(path), "-o", str(tmp_path / "out.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


def test_a_trace_with_a_byte_order_mark_or_float_times_imports(tmp_path):
    path = tmp_path / "trace.json"
    entries = _trace(stamps=[{"name": "HTTP_RECV_START", "ns": 1_500_000_000.0}])
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(entries).encode())
    assert import_triton_trace(path)[["timestamp", "model"]].values.tolist() == [[1.5, "m"]]


def test_ensemble_children_are_left_out_unless_asked(tmp_path):
    entries = [
        {"id": 1, "model_name": "ens", "model_version": 1},
        {"id": 2, "model_name": "child", "model_version": 1, "parent_id": 1},
        {
            "id": 1,
            "timestamps": [
                {"name": "HTTP_RECV_START", "ns": 1_000_000_000},
                {"name": "REQUEST_START", "ns": 1_000_100_000},
            ],
        },
        {"id": 2, "timestamps": [{"name": "REQUEST_START", "ns": 1_000_200_000}]},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(entries))
    assert import_triton_trace(path)[["timestamp", "model"]].values.tolist() == [[1.0, "ens"]]
    both = import_triton_trace(path, include_children=True)
    assert both["model"].tolist() == ["ens", "child"] and both["timestamp"].tolist() == [1.0, 1.0002]


def _round_trips(sends: list[float], rtt: float = 0.003) -> list[tuple[float, float]]:
    return [(t, t + rtt) for t in sends]


@pytest.mark.parametrize("fault", ["none", "dropped", "reordered", "shifted", "the client's pace"])
def test_the_check_against_the_clients_sends_catches_a_wrong_import(fault):
    # the client's sends drifted from its 40 ms plan (a loaded machine): the check follows the sends
    sends = [0.0, 0.029, 0.071, 0.12, 0.151]
    sent = {"m": _round_trips(sends)}
    arrivals = [t + 0.001 for t in sends]
    if fault == "dropped":
        arrivals = arrivals[:2] + arrivals[3:]
    elif fault == "reordered":
        arrivals[1], arrivals[2] = arrivals[2], arrivals[1]
    elif fault == "shifted":
        arrivals = [t + 0.01 for t in arrivals]
    elif fault == "the client's pace":
        arrivals = [0.001 + 0.04 * i for i in range(len(sends))]
    df = pd.DataFrame({"timestamp": arrivals, "model": "m"})
    if fault == "none":
        _check_against_sends(df, sent)
    else:
        with pytest.raises(AssertionError):
            _check_against_sends(df, sent)


@pytest.mark.slow
def test_real_tritonserver_trace_imports_at_the_clients_pace(tmp_path, triton_install):
    trace, sent = _record_trace(tmp_path, install=triton_install)
    _check_against_sends(import_triton_trace(trace), sent)


@pytest.mark.slow
def test_real_trace_written_in_parts_with_log_frequency(tmp_path, triton_install):
    trace, sent = _record_trace(tmp_path, extra=("--trace-config", "triton,log-frequency=5"),
                                install=triton_install)
    assert not trace.exists() and (tmp_path / "trace.json.3").is_file()
    _check_against_sends(import_triton_trace(trace), sent)


def test_trace_parts_are_read_in_numeric_order(tmp_path):
    entries = json.loads(FIXTURE.read_text())
    ids = sorted({e["id"] for e in entries})
    groups = [ids[i::11] for i in range(11)]  # parts .0 .. .10: .10 must sort after .9
    for n, group in enumerate(groups):
        (tmp_path / f"t.json.{n}").write_text(json.dumps([e for e in entries if e["id"] in group]))
    pd.testing.assert_frame_equal(import_triton_trace(tmp_path / "t.json"), import_triton_trace(FIXTURE))
    with pytest.raises(TrafficError, match="no such file"):
        import_triton_trace(tmp_path / "other.json")


def test_import_azure_renames_and_keeps_times(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:04.0319600,3180,8\n2023-11-16 18:17:03.9799600,4808,10\n"
    )
    df = import_azure(path)
    assert list(df.columns) == ["timestamp", "batch_size", "seq_len", "prompt_tokens", "output_tokens"]
    assert df["seq_len"].tolist() == [4808, 3180]
    assert df["prompt_tokens"].tolist() == [4808, 3180] and df["output_tokens"].tolist() == [10, 8]
    assert df["output_tokens"].dtype == np.int64
    assert df["timestamp"].iloc[0] == pytest.approx(1700158623.97996, abs=1e-6)


def test_import_azure_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "az.csv"
    path.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\r\n"
                     b"2023-11-16 18:17:04.0319600,3180,8\r\n")
    assert import_azure(path)["seq_len"].tolist() == [3180]


@pytest.mark.parametrize("rows,expected", [
    ("2023-11-16 18:17:04,3180,8\n,4808,10\n", "line 3, column 'timestamp': empty (NaN)"),
    ("2023-11-16 18:17:04,3180,8\n2023-11-16 18:17:05,inf,10\n", "line 3, column 'seq_len': not a finite number: inf"),
    ("2023-11-16 18:17:04,1e300,8\n", "line 2, column 'seq_len': too large: 1e+300"),
    ("2023-11-16 18:17:04,3180,8\n2023-11-16 18:17:05,10,\n",
     "line 3, column 'output_tokens': empty (NaN) (every generative request needs its output tokens, at least 1)"),
    ("2023-11-16 18:17:04,3180,0\n",
     "line 2, column 'output_tokens': must be a positive integer, got 0 "
     "(every generative request needs its output tokens, at least 1)"),
])
def test_import_azure_refuses_a_bad_cell_naming_its_line(rows, expected, tmp_path):
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    with pytest.raises(TrafficError) as exc:
        import_azure(path)
    assert str(exc.value) == f"{path}: {expected}"


def test_import_csv_refuses_a_parquet_list_column_naming_it(tmp_path, capsys):
    src = tmp_path / "log.parquet"
    pd.DataFrame({"ts": [1.0, 2.0], "tokens": [[1, 2], [3]]}).to_parquet(src)
    out = tmp_path / "out.csv"
    argv = ["traffic", "import", "csv", str(src), "-o", str(out), "--map", "timestamp=ts", "--map", "seq_len=tokens"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"tuner: error: {src}: row 1, column 'seq_len': a list ([1, 2]), "
                                       "not one value per request\n")
    assert not out.exists()


def test_import_csv_with_mapping_and_time_unit(tmp_path, capsys):
    src = tmp_path / "log.csv"
    src.write_text("ts,tokens,who,extra\n1500,10,m1,x\n1000,20,m2,y\n2500,30,m1,z\n")
    out = tmp_path / "out.csv"
    argv = [
        "traffic",
        "import",
        "csv",
        str(src),
        "-o",
        str(out),
        "--map",
        "timestamp=ts",
        "--map",
        "seq_len=tokens",
        "--map",
        "model=who",
        "--time-unit",
        "ms",
    ]
    assert main(argv) == 0
    df = read_traffic(out)
    assert df["timestamp"].tolist() == [1.0, 1.5, 2.5]
    assert df["seq_len"].tolist() == [20, 10, 30] and df["model"].tolist() == ["m2", "m1", "m1"]
    assert "extra" not in df.columns
    with pytest.raises(TrafficError, match=r"no column 'when' to map to 'timestamp'"):
        import_csv(src, {"timestamp": "when"})
    assert main(["traffic", "import", "csv", str(src), "-o", str(out), "--map", "seq_len"]) == 2
    assert "expected OURS=THEIRS" in capsys.readouterr().err


if __name__ == "__main__":
    import tempfile

    target = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        trace_file, sends = _record_trace(Path(tmp))
        df = import_triton_trace(trace_file)
        _check_against_sends(df, sends)
        target.write_text(trace_file.read_text())
    print(f"wrote {target}: {len(df)} traced requests")


def test_a_csv_imported_to_parquet_is_streamed_and_the_same(tmp_path, monkeypatch, capsys):
    """`tuner traffic import azure|csv X.csv -o Y.parquet` reads the CSV a chunk at a time (here 1,000
    rows) and writes the same table the whole-file import makes; a bad line is named in its chunk."""
    from tuner.traffic import import_azure, import_csv, importers, read_traffic

    monkeypatch.setattr(importers, "CHUNK_ROWS", 1000)
    shipped = Path(__file__).resolve().parents[1] / "traffic_profiles" / "azure_llm_2023_code.csv"
    assert main(["traffic", "import", "csv", str(shipped), "-o", str(tmp_path / "c.parquet")]) == 0
    assert pq_row_groups(tmp_path / "c.parquet") == 9  # 8,819 rows, 1,000 at a time
    pd.testing.assert_frame_equal(read_traffic(tmp_path / "c.parquet"), import_csv(shipped))
    azure = tmp_path / "azure.csv"  # the Azure trace's own form: ISO-8601 times, its column names
    times = pd.Timestamp("2023-11-16 18:15:46.6805900", tz="UTC") + pd.to_timedelta(np.arange(2500) * 37, unit="ms")
    pd.DataFrame({"TIMESTAMP": times.strftime("%Y-%m-%d %H:%M:%S.%f0"), "ContextTokens": np.arange(2500) % 900 + 1,
                  "GeneratedTokens": 7}).to_csv(azure, index=False)
    assert main(["traffic", "import", "azure", str(azure), "-o", str(tmp_path / "a.parquet")]) == 0
    pd.testing.assert_frame_equal(read_traffic(tmp_path / "a.parquet"), import_azure(azure))

    src = tmp_path / "t.csv"
    pd.DataFrame({"ts_ms": np.arange(2500) * 10.0, "tokens": np.arange(2500) % 50 + 1}).to_csv(src, index=False)
    args = ["traffic", "import", "csv", str(src), "--map", "timestamp=ts_ms", "--map", "seq_len=tokens",
            "--time-unit", "ms", "-o", str(tmp_path / "t.parquet")]
    assert main(args) == 0
    got = read_traffic(tmp_path / "t.parquet")
    assert len(got) == 2500 and got["timestamp"].iloc[-1] == pytest.approx(24.99)
    lines = src.read_text().splitlines()
    lines[2100] = lines[2100].split(",")[0] + ",0"  # line 2101: a zero token count
    src.write_text("\n".join(lines) + "\n")
    assert main([*args, "--force"]) == 2
    assert capsys.readouterr().err == f"tuner: error: {src}: line 2101, column 'seq_len': must be a positive integer, got 0\n"


def pq_row_groups(path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_row_groups


def test_a_csv_mapping_names_the_token_columns(tmp_path):
    src = tmp_path / "vllm_log.csv"
    src.write_text("t,input_len,output_len,conversation\n0.5,120,30,c1\n0.1,80,5,c2\n0.9,200,1,c1\n")
    df = import_csv(src, {"timestamp": "t", "prompt_tokens": "input_len", "output_tokens": "output_len",
                          "prefix_id": "conversation"})
    assert list(df.columns) == ["timestamp", "batch_size", "prompt_tokens", "output_tokens", "prefix_id"]
    assert df["prompt_tokens"].tolist() == [80, 120, 200] and df["output_tokens"].tolist() == [5, 30, 1]
    assert df["prefix_id"].tolist() == ["c2", "c1", "c1"]
    # a file whose columns already carry our names keeps them unmapped
    same = tmp_path / "ours.csv"
    same.write_text("timestamp,prompt_tokens,output_tokens,other\n1,2,3,x\n")
    assert list(import_csv(same).columns) == ["timestamp", "batch_size", "prompt_tokens", "output_tokens"]


def test_a_mapping_to_a_column_nothing_reads_names_it_and_the_columns_there_are(tmp_path, capsys):
    src = tmp_path / "other.csv"
    src.write_text("ts,tokens\n1,2\n2,3\n")
    expected = (f"{src}: cannot map 'ts' to 'bogus': not a column of the traffic table (expected timestamp, batch_size, "
                "model, seq_len, prompt_tokens, output_tokens, prefix_id, or <INPUT>:<k> for dim k of a model input)")
    with pytest.raises(TrafficError) as exc:
        import_csv(src, {"bogus": "ts"})
    assert str(exc.value) == expected
    out = tmp_path / "i.csv"
    for suffix in (".csv", ".parquet"):  # read whole, and streamed a chunk at a time
        assert main(["traffic", "import", "csv", str(src), "-o", str(out.with_suffix(suffix)), "--map", "bogus=ts"]) == 2
        assert capsys.readouterr().err == f"tuner: error: {expected}\n"
        assert not out.with_suffix(suffix).exists()
    # no timestamp mapped and none in the file: said so, not "no column 'timestamp' to map to 'timestamp'"
    with pytest.raises(TrafficError, match=r"^.*other.csv: no 'timestamp' column: map one of the file's to it "
                                           r"\(columns found: ts, tokens\)$"):
        import_csv(src, {"seq_len": "tokens"})
    # a model input's dim is a column of ours
    df = import_csv(src, {"timestamp": "ts", "INPUT_IDS:0": "tokens"})
    assert df["INPUT_IDS:0"].tolist() == [2, 3]


@pytest.mark.parametrize("source,target", [(".csv", ".csv"), (".csv", ".parquet"), (".parquet", ".csv")])
def test_columns_already_named_as_ours_are_kept(source, target, tmp_path, capsys):
    """seq_len and <INPUT>:<k> shape columns the file already has are kept unmapped, like batch_size:
    read whole and streamed to Parquet a chunk at a time."""
    table = pd.DataFrame({"ts": [1.0, 2.0], "seq_len": [100, 200], "INPUT_IDS:1": [100, 200], "batch_size": [2, 4],
                          "other": ["x", "y"]})
    src = tmp_path / f"own{source}"
    table.to_csv(src, index=False) if source == ".csv" else table.to_parquet(src)
    out = tmp_path / f"own_imp{target}"
    assert main(["traffic", "import", "csv", str(src), "--map", "timestamp=ts", "-o", str(out)]) == 0
    got = read_traffic(out)
    assert list(got.columns) == ["timestamp", "batch_size", "seq_len", "INPUT_IDS:1"]
    assert got["seq_len"].tolist() == [100, 200] and got["INPUT_IDS:1"].tolist() == [100, 200]
    assert got["batch_size"].tolist() == [2, 4]


@pytest.mark.parametrize("target", [".csv", ".parquet"])  # read whole, and streamed a chunk at a time
def test_the_first_bad_row_is_named_whatever_its_reason(target, tmp_path, capsys):
    src = tmp_path / "az.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:17:04,3180,8\n2023-11-16 18:17:05,10,9\n"
                   "2023-11-16 18:17:06,10,0\n2023-11-16 18:17:07,10,\n")  # line 4: 0, line 5: empty
    out = tmp_path / f"out{target}"
    assert main(["traffic", "import", "azure", str(src), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"tuner: error: {src}: line 4, column 'output_tokens': must be a positive integer, got 0 "
                   "(every generative request needs its output tokens, at least 1)\n")
    assert not out.exists()


def _tensor(trace_id, name, shape, activity="TENSOR_QUEUE_INPUT") -> dict:
    return {"id": trace_id, "activity": activity, "tensor": {"name": name, "data": "1,2", "shape": shape, "dtype": "INT32"}}


def _traced(trace_id, model, ns, *tensors) -> list[dict]:
    """One request as Triton writes it at level=TIMESTAMPS and level=TENSORS: its head, its timestamps
    and its input tensors as the dynamic batcher enqueued it (then the backend's batch, not its own)."""
    return [{"id": trace_id, "model_name": model, "model_version": 1},
            {"id": trace_id, "timestamps": [{"name": "HTTP_RECV_START", "ns": ns}, {"name": "QUEUE_START", "ns": ns + 5}]},
            *tensors, _tensor(trace_id, "INPUT_IDS", "16,128", activity="TENSOR_BACKEND_INPUT")]


def test_a_trace_with_its_input_tensors_gives_batch_sizes_and_shapes(tmp_path, capsys):
    entries = (_traced(1, "bert", 1_000_000_000, _tensor(1, "INPUT_IDS", "8,64"), _tensor(1, "ATTENTION_MASK", "8,64"))
               + _traced(2, "bert", 2_000_000_000, _tensor(2, "INPUT_IDS", "2,128"), _tensor(2, "ATTENTION_MASK", "2,128")))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(entries))
    out = tmp_path / "t.csv"
    assert main(["traffic", "import", "triton", str(path), "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: 2 requests\n"  # nothing left out, nothing to note
    df = read_traffic(out)
    assert list(df.columns) == ["timestamp", "batch_size", "INPUT_IDS:0", "ATTENTION_MASK:0", "model"]
    assert df["batch_size"].tolist() == [8, 2]
    assert df["INPUT_IDS:0"].tolist() == [64, 128] and df["ATTENTION_MASK:0"].tolist() == [64, 128]


def test_a_trace_without_input_tensors_says_so_in_one_line(tmp_path, capsys):
    out = tmp_path / "t.csv"
    assert main(["traffic", "import", "triton", str(FIXTURE), "-o", str(out)]) == 0
    assert capsys.readouterr().out == (
        f"note: {FIXTURE}: batch sizes and shapes were not in the trace (no TENSOR_QUEUE_INPUT entries for its "
        "requests: traced without --trace-config level=TENSORS, or models without a dynamic batcher); "
        "batch_size 1 assumed\n"
        f"wrote {out}: 18 requests\n")
    assert read_traffic(out)["batch_size"].tolist() == [1] * 18


def test_requests_without_some_input_tensors_are_noted(tmp_path):
    # a model without a dynamic batcher has no traced inputs; another model has other inputs
    entries = (_traced(1, "bert", 1_000_000_000, _tensor(1, "INPUT_IDS", "4,64"))
               + _traced(2, "resnet", 2_000_000_000, _tensor(2, "IMAGE", "2,3,224,224"))
               + _traced(3, "plain", 3_000_000_000))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(entries))
    notes = []
    df = import_triton_trace(path, notes=notes)
    assert list(df.columns) == ["timestamp", "batch_size", "model"]
    assert df["batch_size"].tolist() == [4, 2, 1]
    assert notes == [
        f"{path}: 1 of 3 requests (model plain) have no traced input tensors (no TENSOR_QUEUE_INPUT entries: a model "
        "without a dynamic batcher?); batch_size 1 assumed for them",
        f"{path}: shape columns INPUT_IDS:0, IMAGE:0, IMAGE:1, IMAGE:2 left out: not every request has the input "
        "(a traffic table has one set of shape columns) (models: bert, plain, resnet; --model NAME imports one "
        "model's requests with its shape columns)",
    ]


def test_one_models_requests_of_a_trace_of_several_keep_their_shape_columns(tmp_path, capsys):
    # the study tunes one model: its shapes were dropped because other models' requests lack its inputs
    entries = (_traced(1, "bert", 1_000_000_000, _tensor(1, "INPUT_IDS", "4,64"))
               + _traced(2, "resnet", 2_000_000_000, _tensor(2, "IMAGE", "2,3,224,224"))
               + _traced(3, "bert", 3_000_000_000, _tensor(3, "INPUT_IDS", "1,128")))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(entries))
    out = tmp_path / "bert.csv"
    assert main(["traffic", "import", "triton", str(path), "--model", "bert", "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}: 2 requests\n"
    df = read_traffic(out)
    assert df["INPUT_IDS:0"].tolist() == [64, 128] and df["batch_size"].tolist() == [4, 1]
    assert set(df["model"]) == {"bert"}
    assert main(["traffic", "import", "triton", str(path), "--model", "gpt", "-o", str(tmp_path / "gpt.csv")]) == 2
    assert "no traced requests of model 'gpt' (the trace holds: bert, resnet)" in capsys.readouterr().err
    assert main(["traffic", "import", "triton", str(path), "--model", "bret", "-o", str(tmp_path / "gpt.csv")]) == 2
    assert "no traced requests of model 'bret' (did you mean bert? the trace holds: bert, resnet)" in \
        capsys.readouterr().err
    # Triton's model names are case-sensitive: the one in another case is the nearest
    assert main(["traffic", "import", "triton", str(path), "--model", "BERT", "-o", str(tmp_path / "gpt.csv")]) == 2
    assert "no traced requests of model 'BERT' (did you mean bert? the trace holds: bert, resnet)" in \
        capsys.readouterr().err
    assert main(["traffic", "import", "csv", str(out), "--model", "bert", "-o", str(tmp_path / "x.csv")]) == 2
    assert "--model applies to 'traffic import triton' only" in capsys.readouterr().err


@pytest.mark.parametrize("tensor,expected", [
    ({"id": 1, "activity": "TENSOR_QUEUE_INPUT", "tensor": "x"},
     "entry 3: TENSOR_QUEUE_INPUT 'tensor' must be an object with the input's 'name', got 'x'"),
    (_tensor(1, "INPUT_IDS", ""), "entry 3: TENSOR_QUEUE_INPUT INPUT_IDS 'shape' must be the tensor's dims, positive "
                                  "integers (e.g. '8,64'), got ''"),
    (_tensor(1, "INPUT_IDS", "8,x"), "got '8,x'"),
    (_tensor(1, "INPUT_IDS", "8,0"), "got '8,0'"),
    (_tensor(1, "INPUT_IDS", "8,\u00b2"), "got '8,\u00b2'"),  # a digit to str.isdigit, not to int()
    (_tensor(1, "INPUT_IDS", "8," + "9" * 30), "got '8,99999999999"),  # past 64 bits
    (_tensor(1, "INPUT_IDS", [8, 64]), "got [8, 64]"),
    (_tensor("1", "INPUT_IDS", "8,64"), "entry 3: 'id' must be an integer, got '1'"),
])
def test_a_bad_traced_tensor_is_named_in_one_line(tensor, expected, tmp_path, capsys):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_traced(1, "bert", 1_000, tensor)))
    assert main(["traffic", "import", "triton", str(path), "-o", str(tmp_path / "out.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tuner: error: {path}: ") and err.count("\n") == 1 and expected in err, err


def test_a_request_whose_inputs_disagree_on_the_batch_is_refused(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_traced(7, "bert", 1_000, _tensor(7, "INPUT_IDS", "8,64"), _tensor(7, "MASK", "4,64"))))
    with pytest.raises(TrafficError, match=r"request id 7: its input tensors' first dims differ "
                                           r"\(INPUT_IDS 8, MASK 4\), not one batch size$"):
        import_triton_trace(path)


@pytest.mark.parametrize("target", [".csv", ".parquet"])  # read whole, and streamed
def test_a_column_the_import_leaves_out_is_named(target, tmp_path, capsys):
    # `bs` holds batch sizes no --map names: without a word, every row would replay as one
    src = tmp_path / "a.csv"
    src.write_text("ts,seq_len,INPUT_IDS:1,bs\n0.0,10,12,1\n0.5,20,22,2\n")
    out = tmp_path / f"out{target}"
    assert main(["traffic", "import", "csv", str(src), "-o", str(out), "--map", "timestamp=ts"]) == 0
    assert "note: columns left out (neither mapped nor named as ours): bs;" in capsys.readouterr().out
    assert main(["traffic", "import", "csv", str(src), "-o", str(tmp_path / f"b{target}"), "--map", "timestamp=ts",
                 "--map", "batch_size=bs"]) == 0
    assert "left out" not in capsys.readouterr().out
