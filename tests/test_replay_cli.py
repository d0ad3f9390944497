"""`tuner replay STUDY.yaml`: a real server, the CLI run as users run it (exit codes, one-line errors)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.parse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tuner import modelconfig, space
from tuner.cli.replay_cmd import format_measurement
from tuner.measurement import Measurement
from tuner.server.local import LocalLauncher

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(__file__).resolve().parent / "data" / "replay_models"


@pytest.fixture(scope="module")
def server(triton_install):
    with LocalLauncher(MODELS, models=["echo", "stream_echo"], install=triton_install) as launcher:
        yield launcher


def tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def study(tmp_path: Path, url: str, model: str = "echo", traffic: pd.DataFrame | None = None,
          step_s: float | None = None, warmup: bool = True) -> Path:
    """`warmup=False`: for a test that reads neither the warm-up nor a latency (the warm-up is ~4 s of
    each replay; test_replay_prints_the_measurement_and_writes_json checks it)."""
    if traffic is None:
        n = 300
        traffic = pd.DataFrame({"timestamp": np.arange(n) / 100.0, "seq_len": np.arange(n) % 9 + 3})
    traffic.to_csv(tmp_path / "traffic.csv", index=False)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({
        "name": "replay-cli", "model_repository": str(MODELS), "model": model,
        "traffic": {"path": "traffic.csv"},
        "server": {"launcher": "remote", "url": url},
        "replay": {"warmup_s": 0.5, "workers": 1, "lag_budget_ms": 20},
        **({"search": {"capacity": {"step_duration_s": step_s}}} if step_s else {}),
        **({} if warmup else {"measurement": {"warmup": False}}),
    }))
    return path


def assert_one_line_error(run: subprocess.CompletedProcess, *words: str) -> None:
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: "), run.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.slow
def test_replay_prints_the_measurement_and_writes_json(server, tmp_path):
    out = tmp_path / "m.json"
    run = tuner("replay", str(study(tmp_path, server.endpoints.http)), "--speed", "2",
                "--set", "max_batch_size=4", "--set", "max_queue_delay_microseconds=3000", "--json", str(out),
                "--records", str(tmp_path / "requests.csv"))
    assert run.returncode == 0, run.stderr
    for label in ("throughput", "latency", "send lag", "fill rate", "histogram", "load generator"):
        assert label in run.stdout
    data = json.loads(out.read_text())
    m = data["measurement"]
    assert m["speed"] == 2.0 and m["errors"] == 0
    assert m["requests"] == 200  # 3 s at speed 2 is 1.5 s; the first 0.5 s is warm-up
    assert m["max_batch_size"] == 4 and max(int(k) for k in m["batch_histogram"]) <= 4
    assert data["params"] == {"max_batch_size": 4, "max_queue_delay_microseconds": 3000}
    assert data["workers"] >= 1 and data["attempts"] >= 1
    # warmed up as a trial is: the shape sweep, then windows until steady; the record is what it said
    warm = data["warmup"]
    assert warm["seconds"] > 0 and warm["sweep_requests"] > 0 and warm["sweep_errors"] == 0
    assert (warm["reason"] == "") == warm["stable"]
    said = "steady" if warm["stable"] else f"NOT steady: {warm['reason']}"
    assert f"warm-up: {warm['seconds']:.1f} s, {warm['sweep_requests']} shape requests, {said}" in run.stderr
    # the remote server got its own configuration back
    assert server.model_config("echo").max_batch_size == 32
    # --records: every request of every replay behind the figures (a retry, repeats near the SLA); the
    # figures are one replay's measured requests
    records = pd.read_csv(tmp_path / "requests.csv")
    assert list(records.columns[:3]) == ["replay", "speed", "measured"] and (records["speed"] == 2.0).all()
    replays = records["replay"].max()
    assert f"records: {len(records)} requests of {replays} replay" in run.stderr
    assert (records.groupby("replay").size() == 300).all()  # the whole schedule, warm-up included
    stands = [k for k, r in records[records["measured"]].groupby("replay")
              if len(r) == m["requests"] and r["ok"].all()
              and r["latency_ms"].max() == pytest.approx(m["latency_ms"]["max"], rel=1e-9)]
    assert stands, records.groupby("replay")["latency_ms"].max()
    assert (records["latency_ms"] >= 0).all() and (records["end_s"] >= records["send_s"]).all()


@pytest.mark.slow
def test_config_replays_against_a_named_config_pbtxt(server, tmp_path):
    """--config: a tune's recommended/config.pbtxt, say, loaded instead of the repository's (here: echo's
    with max_batch_size 4); --set changes it further; the remote server gets its own back."""
    config = modelconfig.load(MODELS / "echo" / "config.pbtxt")
    config.max_batch_size = 4
    path = tmp_path / "recommended.pbtxt"
    path.write_text(modelconfig.to_text(config))
    out = tmp_path / "m.json"
    run = tuner("replay", str(study(tmp_path, server.endpoints.http, warmup=False)), "--config", str(path),
                "--set", "max_queue_delay_microseconds=2000", "--duration", "1", "--json", str(out))
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text())
    m = data["measurement"]
    assert m["max_batch_size"] == 4 and max(int(k) for k in m["batch_histogram"]) <= 4 and m["errors"] == 0
    # which configuration was measured: the file, and what the server read back having loaded it
    assert data["config"] == str(path) and data["params"] == {"max_queue_delay_microseconds": 2000}
    assert data["running"]["max_batch_size"] == 4 and data["running"]["max_queue_delay_microseconds"] == 2000
    assert server.model_config("echo").max_batch_size == 32


def test_a_config_that_is_missing_or_not_a_config_is_one_line_and_exit_2(tmp_path):
    run = tuner("replay", str(study(tmp_path, "127.0.0.1:1")), "--config", str(tmp_path / "nowhere.pbtxt"))
    assert_one_line_error(run, "--config", "nowhere.pbtxt")
    (tmp_path / "bad.pbtxt").write_text("max_batch_size: [oops\n")
    run = tuner("replay", str(study(tmp_path, "127.0.0.1:1")), "--config", str(tmp_path / "bad.pbtxt"))
    assert_one_line_error(run, "bad.pbtxt")
    # an empty file parses as a config that does not batch; another model's config loads nothing of this one
    (tmp_path / "empty.pbtxt").write_text("")
    run = tuner("replay", str(study(tmp_path, "127.0.0.1:1")), "--config", str(tmp_path / "empty.pbtxt"))
    assert_one_line_error(run, "empty.pbtxt: max_batch_size is 0 (an empty or partial config?)")
    (tmp_path / "other.pbtxt").write_text('name: "other"\nmax_batch_size: 8\n')
    run = tuner("replay", str(study(tmp_path, "127.0.0.1:1")), "--config", str(tmp_path / "other.pbtxt"))
    assert_one_line_error(run, "other.pbtxt: names model 'other', not the study's")


@pytest.mark.slow
def test_duration_cuts_the_measured_part(server, tmp_path):
    out = tmp_path / "m.json"
    run = tuner("replay", str(study(tmp_path, server.endpoints.http, warmup=False)), "--duration", "1",
                "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["measurement"]["requests"] == 100  # [0.5, 1.5) s at 100 req/s


@pytest.mark.slow
def test_step_replays_what_a_search_step_measures_at_that_speed(server, tmp_path):
    """--step: the busiest search.capacity.step_duration_s of the traffic after its warm-up, as a trial's
    capacity step replays it, so a trial's figure can be checked again at its speed."""
    steady = np.arange(300) / 100.0                     # 100 req/s for 3 s
    burst = 2.0 + np.arange(50) / 100.0                 # and 50 more in [2.0, 2.5): the busiest half second
    traffic = pd.DataFrame({"timestamp": np.sort(np.concatenate([steady, burst])), "seq_len": 4})
    out = tmp_path / "m.json"
    run = tuner("replay", str(study(tmp_path, server.endpoints.http, traffic=traffic, step_s=0.5, warmup=False)),
                "--step", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "one search step (the busiest 0.5 s of the traffic)" in run.stdout
    m = json.loads(out.read_text())["measurement"]
    assert m["requests"] == 100 and m["duration_s"] == pytest.approx(0.5, abs=0.05)  # the burst's half second
    assert m["offered_rps"] == pytest.approx(200, rel=0.1)                             # not the traffic's 117
    # a step longer than the traffic: a step replays all of it after its warm-up, and the line says so
    run = tuner("replay", str(study(tmp_path, server.endpoints.http, traffic=traffic, step_s=5, warmup=False)),
                "--step", "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert ("one search step (the whole traffic after its warm-up: at this speed it lasts no longer than a step's "
            "0.5 s of warm-up and 5 s)") in run.stdout
    assert json.loads(out.read_text())["measurement"]["requests"] == 300  # all but the first 0.5 s's 50


def test_a_duration_longer_than_the_traffic_says_what_is_replayed(server, tmp_path):
    traffic = pd.DataFrame({"timestamp": np.arange(30) / 10.0, "seq_len": 4})  # 3 s at 10 req/s
    run = tuner("replay", str(study(tmp_path, server.endpoints.http, traffic=traffic, warmup=False)),
                "--duration", "1000")
    assert run.returncode == 0, run.stderr
    assert "note: --duration 1000: the traffic holds 2.4 s after its warm-up at speed 1" in run.stderr, run.stderr


def test_step_and_duration_together_are_one_line_and_exit_2(tmp_path):
    run = tuner("replay", str(study(tmp_path, "127.0.0.1:1")), "--step", "--duration", "2")
    assert_one_line_error(run, "--step and --duration", "search.capacity.step_duration_s")


def test_an_unreachable_server_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert_one_line_error(tuner("replay", str(study(tmp_path, f"127.0.0.1:{port}"))), f"127.0.0.1:{port}")


@pytest.mark.parametrize("where,why", [("proc", "the directory /proc takes no new file"),
                                       ("long", "File name too long"), ("dir", "it is a directory")])
def test_a_json_output_that_cannot_be_written_is_refused_before_the_replay(server, tmp_path, where, why):
    target = {"proc": Path("/proc/tuner-replay.json"), "long": tmp_path / ("j" * 300 + ".json"),
              "dir": tmp_path}[where]
    run = tuner("replay", str(study(tmp_path, server.endpoints.http)), "--json", str(target))
    assert_one_line_error(run, "--json", why)
    assert "replay:" not in run.stderr and run.stdout == ""  # nothing was replayed


def test_a_records_file_of_another_format_or_one_tuner_did_not_write_is_refused_before_the_replay(tmp_path):
    path = study(tmp_path, "127.0.0.1:9")  # no server: the refusal comes first
    assert_one_line_error(tuner("replay", str(path), "--records", str(tmp_path / "r.txt")),
                          "--records", "a .csv or .parquet file")
    mine = tmp_path / "mine.csv"
    mine.write_text("a,b\n1,2\n")
    assert_one_line_error(tuner("replay", str(path), "--records", str(mine)), "--records", "--force")
    assert mine.read_text() == "a,b\n1,2\n"
    assert_one_line_error(tuner("replay", str(path), "--records", str(tmp_path / "traffic.csv"), "--force"),
                          "--records")  # the study's own traffic, whatever --force says


@pytest.mark.slow
@pytest.mark.parametrize("port,what", [("metrics", "(GET /v2: an empty answer, not JSON)"),
                                       ("grpc", "(GET /v2: an HTTP/2 frame")])
def test_a_url_at_another_triton_port_is_one_line_and_exit_2(server, tmp_path, port, what):
    ep = server.endpoints
    address = urllib.parse.urlsplit(ep.metrics).netloc if port == "metrics" else ep.grpc
    run = tuner("replay", str(study(tmp_path, address)))
    assert_one_line_error(run, f"{address} answers but is not Triton's HTTP endpoint {what}")
    assert run.stdout == ""


def test_a_model_without_batching_has_no_fill_rate():
    m = Measurement(speed=1.0, offered_rps=10.0, duration_s=1.0, requests=10, errors=0, error_rate=0.0,
                    throughput_rps=10.0, latency_ms={"p99": 1.0}, send_lag_ms={"p99": 0.1}, valid=True,
                    inference_count=10, execution_count=10, mean_batch_size=1.0, fill_rate=1.0,
                    max_batch_size=0)
    line = next(row for row in format_measurement(m).splitlines() if row.startswith("batch size"))
    assert "no batching (max_batch_size 0)" in line and "no fill rate" in line and "1.00" not in line, line
    batching = format_measurement(dataclasses.replace(m, max_batch_size=4, mean_batch_size=2.0, fill_rate=0.5))
    assert "mean 2.00 of max 4 (fill rate 0.50)" in batching


@pytest.mark.parametrize("window_s,short", [(3.0, True), (12.0, False)])
def test_a_generative_replays_streamed_row_says_when_its_window_is_too_short_to_read_the_rate(window_s, short):
    """Requests living 5 s end to end (50 tokens, 0.1 s apart): over a 3-s window the engine's streamed
    rate lags what was asked, and the row says so with the life; over 12 s it does not."""
    from tuner.cli.replay_cmd import format_generate
    from tuner.measurement_tokens import measure_tokens
    from tuner.trial.generate import GenerateRun

    due = np.arange(0.0, 2.0 + window_s, 0.5)
    first = due + 0.1
    n = len(due)
    records = pd.DataFrame({"row": np.arange(n), "due_s": due, "send_s": due, "end_s": first + 4.9 + 0.001,
                            "send_lag_ms": 0.1, "ok": True, "error": "", "prompt_tokens": 5, "output_tokens": 50,
                            "tokens": 50, "first_token_s": first, "last_token_s": first + 4.9,
                            "itl_ms": [np.full(49, 100.0)] * n})
    m = measure_tokens(records, speed=1.0, warmup_s=2.0, lag_budget_ms=50.0, duration_s=2.0 + window_s)
    row = next(line for line in format_generate(GenerateRun(m, m, None)).splitlines() if line.startswith("streamed"))
    assert ("a window under 2x a request's life (5.0 s here) reads it low" in row) is short, row


@pytest.mark.slow
def test_a_missing_model_is_one_line_and_exit_2(server, tmp_path):
    assert_one_line_error(tuner("replay", str(study(tmp_path, server.endpoints.http, model="nope"))), "nope")


@pytest.mark.slow
def test_traffic_that_does_not_fit_the_model_is_one_line_and_exit_2(server, tmp_path):
    traffic = pd.DataFrame({"timestamp": np.arange(10) / 10.0, "tokens": 5})
    run = tuner("replay", str(study(tmp_path, server.endpoints.http, traffic=traffic)))
    assert_one_line_error(run, "INPUT_IDS", "seq_len")


@pytest.mark.slow
def test_a_row_no_request_can_carry_is_one_line_and_exit_2(server, tmp_path):
    """A seq_len of 1e12 would be terabytes of tensor data: refused before the replay, naming the row."""
    traffic = pd.DataFrame({"timestamp": np.arange(10) / 10.0, "seq_len": [8] * 7 + [10**12] + [8] * 2})
    run = tuner("replay", str(study(tmp_path, server.endpoints.http, traffic=traffic)))
    assert_one_line_error(run, "traffic row 8, timestamp 0.7", "3.64 TiB", "64 MiB per request")


def test_a_replay_whose_measured_window_lasts_no_time_is_one_line_and_exit_2_before_any_server(tmp_path):
    """Its offered rate would read 0 req/s: three requests due at the warm-up's end, the window ending there."""
    traffic = pd.DataFrame({"timestamp": [0.0, 0.25, 0.5, 0.5, 0.5], "seq_len": 4})
    run = tuner("replay", str(study(tmp_path, "127.0.0.1:1", traffic=traffic)))
    assert_one_line_error(run, "traffic.csv: the measured window has no length: at speed 1 its 3 request(s) are "
                               "all due at 0.5 s, where the warm-up ends", "a lower --speed")


@pytest.mark.parametrize("argv,where", [
    (["--speed", "1000"], "at speed 1000 the traffic lasts 0.00299 s, within the 0.5 s warm-up"),
    (["--speed", "1000", "--step"], "at speed 1000 the traffic lasts 0.00299 s, within the 0.5 s warm-up"),
])
def test_a_replay_that_would_measure_no_request_is_one_line_and_exit_2_before_any_server(tmp_path, argv, where):
    """3 s of traffic at 1000x is over within the warm-up: refused before the (unreachable) server is asked."""
    run = tuner("replay", str(study(tmp_path, "127.0.0.1:1")), *argv)
    assert_one_line_error(run, "traffic.csv: no requests due in the measured window", where, "a lower --speed")


def test_a_bad_speed_is_one_line_and_exit_2(tmp_path):
    assert_one_line_error(tuner("replay", str(study(tmp_path, "127.0.0.1:1")), "--speed", "0"), "--speed")


@pytest.mark.slow
def test_the_example_study_runs_on_the_embedded_default(tmp_path):
    """examples/encoder_sim_flash_crowd.yaml: local launcher, encoder_sim template, shipped profile."""
    out = tmp_path / "m.json"
    run = tuner("replay", "examples/encoder_sim_flash_crowd.yaml", "--duration", "3", "--json", str(out))
    assert run.returncode == 0, run.stderr
    m = json.loads(out.read_text())["measurement"]
    assert m["requests"] > 0 and m["errors"] == 0 and m["execution_count"] > 0


@pytest.mark.slow
def test_a_server_killed_in_the_middle_of_a_replay_ends_it_at_once_in_one_line_and_exit_1(tmp_path):
    """A minute of traffic; its tritonserver killed 3 s into the replay: `tuner replay` ends within seconds
    with the local launcher's own line (which process, how it exited, its log), not a minute later."""
    import threading
    import time
    import urllib.request

    import psutil

    n = 1200  # 20 req/s for 60 s
    traffic = pd.DataFrame({"timestamp": np.arange(n) / 20.0, "seq_len": np.arange(n) % 9 + 3})
    path = study(tmp_path, "127.0.0.1:1", traffic=traffic, warmup=False)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "server": {"launcher": "local"}}))
    job = subprocess.Popen([sys.executable, "-m", "tuner", "replay", str(path), "--quiet"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed: list[tuple[int, float]] = []

    def kill_once_the_replay_runs() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None:
            with contextlib.suppress(psutil.Error, OSError, KeyError, IndexError, ValueError):
                (server,) = [p for p in psutil.Process(job.pid).children(recursive=True) if p.name() == "tritonserver"]
                port = server.cmdline()[server.cmdline().index("--http-port") + 1]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/echo/stats", timeout=2) as r:
                    if json.load(r)["model_stats"][0]["inference_count"] > 0:  # the replay is under way
                        time.sleep(3.0)
                        os.kill(server.pid, signal.SIGKILL)
                        killed.append((server.pid, time.monotonic()))
                        return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_once_the_replay_runs, daemon=True)
    killer.start()
    try:
        _out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    ended = time.monotonic()
    killer.join(timeout=5)
    assert killed, f"the server was never killed: {err}"
    pid, at = killed[0]
    assert ended - at < 15, f"tuner replay went on {ended - at:.1f} s after the kill: {err}"
    assert job.returncode == 1, err
    # one line (a slow start may say how long it has waited before it)
    errors = [line for line in err.splitlines() if line.startswith("tuner: error: ")]
    assert len(errors) == 1 and err.strip().endswith(errors[0]) and "Traceback" not in err, err
    assert errors[0].startswith(f"tuner: error: tritonserver (pid {pid}) exited with code -9"), err
    assert "; its log: " in errors[0], err


@pytest.mark.slow
def test_a_generative_model_is_streamed_and_measured_in_tokens(server, tmp_path):
    """stream_echo (the vLLM backend's interface; a first token 20 ms + 1 ms per prompt token after
    the request arrives, then one every 10 ms): the replay's TTFT and TPOT follow its sleeps, every
    output token counted; it reports no engine series. A dynamic-batcher knob is refused in one line."""
    n = 20
    traffic = pd.DataFrame({"timestamp": np.arange(n) * 0.1, "prompt_tokens": 5 + np.arange(n) % 4,
                            "output_tokens": 6})
    path = study(tmp_path, server.endpoints.http, model="stream_echo", traffic=traffic)
    run = tuner("replay", str(path), "--json", str(tmp_path / "r.json"), "--records", str(tmp_path / "r.parquet"))
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    everything = data["all_requests"]
    assert everything["requests"] == n and everything["errors"] == 0 and everything["output_tokens"] == 6 * n
    records = pd.read_parquet(tmp_path / "r.parquet")  # a request each, with its tokens and their times
    assert len(records) == n and records["tokens"].sum() == 6 * n and (records["replay"] == 1).all()
    assert (records["first_token_s"] > records["due_s"]).all() and "itl_ms" not in records
    assert records["measured"].sum() == data["measurement"]["requests"]
    # a token cannot come faster than the model's 10 ms, but its arrival can: the first token's delivery
    # delayed by a busy machine shortens (last - first) / (n - 1) (CI measured 9.99)
    assert 9.5 <= everything["tpot_ms"]["p50"] <= 14.0
    assert 25.0 <= everything["ttft_ms"]["p50"] <= 60.0
    assert data["engine"] is None
    assert "TTFT (replay)" in run.stdout and "(engine)" not in run.stdout and "output tokens/s" in run.stdout
    rows = {line[:22].strip(): line[22:].split() for line in run.stdout.splitlines() if "(replay)" in line}
    assert set(rows) == {"TTFT (replay)", "TPOT (replay)", "ITL (replay)", "end to end (replay)"}
    assert all(len(v) == 3 and "nan" not in v for v in rows.values()), rows  # p50, p99 and the mean of each
    assert_one_line_error(tuner("replay", str(path), "--set", "max_batch_size=4"), "vLLM handles the batching")
    assert_one_line_error(tuner("replay", str(path), "--set", "max_num_seqs=4"), "not a vLLM-backend model")

    # --step: the busiest half second, 10 more requests in [1.0, 1.5), streamed as a search step streams it
    burst = pd.DataFrame({"timestamp": 1.025 + np.arange(10) * 0.05, "prompt_tokens": 5, "output_tokens": 6})
    traffic = pd.concat([traffic, burst]).sort_values("timestamp", ignore_index=True)
    path = study(tmp_path, server.endpoints.http, model="stream_echo", traffic=traffic, step_s=0.5)
    run = tuner("replay", str(path), "--step", "--json", str(tmp_path / "r.json"))
    assert run.returncode == 0, run.stderr
    assert "one search step (the busiest 0.5 s of the traffic)" in run.stdout
    m = json.loads((tmp_path / "r.json").read_text())["measurement"]
    assert m["requests"] == 15 and m["errors"] == 0  # 5 of the steady 10 req/s and the burst's 10
    sent = json.loads((tmp_path / "r.json").read_text())["all_requests"]["requests"]
    # --warmup 0.8: 0.8 s of what came before the burst replayed first (8 requests at 10 req/s, 3 more than
    # the study's 0.5 s), the measured half second the same (a generative trial's capacity step, as its
    # check-it line replays it)
    run = tuner("replay", str(path), "--step", "--warmup", "0.8", "--json", str(tmp_path / "w.json"))
    assert run.returncode == 0, run.stderr
    warmed = json.loads((tmp_path / "w.json").read_text())
    assert warmed["measurement"]["requests"] == 15 and warmed["all_requests"]["requests"] - sent == 3


def test_a_generative_models_config_is_its_model_json_checked_before_any_server(tmp_path):
    """--config of a vLLM-served model is a model.json, checked as vLLM's backend reads it; a streaming model
    vLLM does not serve has none to replace. One line each, exit 2, no server asked."""
    traffic = pd.DataFrame({"timestamp": [0.0, 0.5, 1.0], "prompt_tokens": 10, "output_tokens": 10})
    traffic.to_csv(tmp_path / "tokens.csv", index=False)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "llm", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "llm_vllm", "traffic": {"path": "tokens.csv"},
                                    "sla": {"ttft_ms": 1000}, "output": str(tmp_path / "out")}))
    (tmp_path / "model.json").write_text(json.dumps({"model": "tiny", "max_num_seqs": 8, "max_num_batchd_tokens": 64}))
    run = tuner("replay", str(path), "--config", str(tmp_path / "model.json"))
    assert_one_line_error(run, "model.json: max_num_batchd_tokens: not an engine argument vLLM takes",
                          "did you mean max_num_batched_tokens?")
    run = tuner("replay", str(path), "--config", str(tmp_path / "config.pbtxt"))
    assert_one_line_error(run, "--config", "config.pbtxt: no such file")
    (tmp_path / "partial.json").write_text(json.dumps({"max_num_seqs": 4}))  # the knobs alone: no model
    assert_one_line_error(tuner("replay", str(path), "--config", str(tmp_path / "partial.json")),
                          "partial.json: no \"model\": a model.json names the model vLLM loads")
    (tmp_path / "dtype.json").write_text(json.dumps({"model": "tiny", "dtype": "float33"}))  # vLLM: at its load
    assert_one_line_error(tuner("replay", str(path), "--config", str(tmp_path / "dtype.json")),
                          "dtype.json: dtype: must be one of auto, half, float16, bfloat16, float, float32")
    assert not (tmp_path / "out").exists()
    stream = study(tmp_path, "127.0.0.1:1", model="stream_echo", traffic=traffic)
    run = tuner("replay", str(stream), "--config", str(tmp_path / "model.json"))
    assert_one_line_error(run, "stream_echo streams but is not a vLLM-backend model")


def test_a_request_longer_than_the_engines_context_is_refused_before_any_server(tmp_path):
    """llm_vllm's tiny model takes 2,048 tokens: a trace with longer requests is one line, exit 2,
    before a server is started (the local launcher would start one: nothing is left behind)."""
    traffic = pd.DataFrame({"timestamp": [0.0, 0.5, 1.0], "prompt_tokens": [100, 2000, 3000],
                            "output_tokens": [10, 100, 10]})
    traffic.to_csv(tmp_path / "tokens.csv", index=False)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "too-long", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "llm_vllm", "traffic": {"path": "tokens.csv"},
                                    "sla": {"ttft_ms": 1000}, "output": str(tmp_path / "out")}))
    run = tuner("replay", str(path))
    assert_one_line_error(run, "2 of 3 requests need more tokens than llm_vllm's context of 2,048",
                          "traffic row 2, timestamp 0.5", "2,000 prompt + 100 output tokens")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml", "tokens.csv"]


def test_the_warm_ups_failed_requests_are_said_beside_its_line(tmp_path, monkeypatch, capsys):
    """A server that failed requests of its warm-up (a fresh one, say) while the measured window had
    none: the warm-up line says how many, and where; the JSON keeps the counts (the measurement judges
    the measured window only, as a trial's does)."""
    import tuner.server
    import tuner.trial.step
    import tuner.trial.warmup
    from tests.support import FakeLauncher, measurement
    from tuner.cli import main
    from tuner.trial import Warmup

    config = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")

    warm = Warmup(seconds=3.0, sweep_requests=192, sweep_errors=96, window_errors=4, first_error="400: out of memory")
    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: FakeLauncher(config))
    monkeypatch.setattr(tuner.trial.warmup, "warm_up", lambda *a, **k: warm)
    monkeypatch.setattr(tuner.trial.step, "make_probe", lambda *a, **k: measurement)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "w", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "encoder_sim", "traffic": {"path": str(ROOT / "traffic_profiles" /
                                                                                     "bursty_60s.csv")}}))
    assert main(["replay", str(path), "--json", str(tmp_path / "m.json")]) == 0
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warm-up:")]
    assert len(line) == 1 and line[0].endswith(
        "; 100 requests failed (96 of 192 shape-sweep requests, 4 while replaying the traffic) (not judged: the "
        "measured window is)"), line
    assert json.loads((tmp_path / "m.json").read_text())["warmup"]["window_errors"] == 4
    monkeypatch.setattr(tuner.trial.warmup, "warm_up", lambda *a, **k: Warmup(seconds=3.0))
    assert main(["replay", str(path)]) == 0
    assert "failed" not in capsys.readouterr().err
    # a warm-up whose windows the model failed: said as the model failing, with its first error, not as unsteady
    reason = ("the model failed its requests: 48 of the 78 answered in the warm-up failed (the shape sweep and 30 s "
              "of windows after it); the first error: Stub process 'm_0_0' is not healthy.")
    monkeypatch.setattr(tuner.trial.warmup, "warm_up", lambda *a, **k: dataclasses.replace(
        warm, stable=False, failing=True, reason=reason))
    assert main(["replay", str(path)]) == 0
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warm-up:")]
    assert len(line) == 1 and f"shape requests, FAILING, not slow: {reason}; 100 requests failed" in line[0], line
    assert "steady" not in line[0]


def test_a_replay_whose_every_request_failed_exits_1_with_a_line_saying_so(tmp_path, monkeypatch, capsys):
    """The replay measured, and the table says 100 % errors: a script that runs it learns it too."""
    import tuner.server
    import tuner.trial.step
    from tests.support import FakeLauncher, measurement
    from tuner.cli import main

    config = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: FakeLauncher(config))
    failed = dataclasses.replace(measurement(1.0, errors=1000), first_error="400: Stub process is not healthy.\nAt:")
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "w", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "encoder_sim", "measurement": {"warmup": False},
                                    "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv")}}))
    monkeypatch.setattr(tuner.trial.step, "make_probe", lambda *a, **k: lambda speed: failed)
    assert main(["replay", str(path)]) == 1
    out, err = capsys.readouterr()
    assert "1000 (100.00%)" in out
    assert err.splitlines()[-1] == ("tuner replay: every one of the 1000 measured requests failed; the first: "
                                    "400: Stub process is not healthy.")
    monkeypatch.setattr(tuner.trial.step, "make_probe", lambda *a, **k: lambda speed: measurement(1.0, errors=999))
    assert main(["replay", str(path)]) == 0  # one request served: measured, the table says the rest


@pytest.mark.slow
def test_a_model_that_fails_executions_has_a_mean_batch_of_its_histogram_and_a_one_line_error(triton_install,
                                                                                              tmp_path):
    """odd_fails raises in an execution that holds an odd length: Triton counts the failed executions
    (execution_count, batch_stats) but not their rows (inference_count). The printed mean batch is the
    histogram's (at least 1), and the model's multi-line exception shows as its first line."""
    with LocalLauncher(MODELS, models=["odd_fails"], install=triton_install) as server:
        n = 300  # 100 req/s, every 7th request of odd length
        traffic = pd.DataFrame({"timestamp": np.arange(n) / 100.0, "seq_len": np.where(np.arange(n) % 7, 4, 3)})
        path = study(tmp_path, server.endpoints.http, model="odd_fails", traffic=traffic)
        data = yaml.safe_load(path.read_text())
        path.write_text(yaml.safe_dump({**data, "measurement": {"warmup": False}}))
        out = tmp_path / "m.json"
        run = tuner("replay", str(path), "--set", "max_queue_delay_microseconds=20000", "--json", str(out))
    assert run.returncode == 0, run.stderr
    m = json.loads(out.read_text())["measurement"]
    histogram = {int(k): v for k, v in m["batch_histogram"].items()}
    rows = sum(size * count for size, count in histogram.items())
    assert 0 < m["errors"] < m["requests"] and m["inference_count"] < rows  # some executions failed
    assert m["mean_batch_size"] == pytest.approx(rows / sum(histogram.values())) and m["mean_batch_size"] >= 1
    assert m["fill_rate"] == pytest.approx(m["mean_batch_size"] / 16)
    assert f"mean {m['mean_batch_size']:.2f} of max 16" in run.stdout
    assert f"for {rows} rows, {m['inference_count']} of them succeeded" in run.stdout
    errors = [line for line in run.stdout.splitlines() if line.startswith("errors")]
    assert len(errors) == 1 and re.search(r"; the first: .*TritonModelException: odd length \d+$", errors[0]), run.stdout
    assert "At:" not in run.stdout and "model.py" not in run.stdout


def test_a_json_the_user_wrote_is_kept_unless_force_before_any_server(tmp_path, monkeypatch, capsys):
    """--json over a file tuner did not write is refused (one line, exit 2) before a server starts, as
    simulate's is; --force replaces it, and a measurement tuner wrote is replaced without it."""
    import tuner.server
    import tuner.trial.step
    from tests.support import FakeLauncher, measurement
    from tuner.cli import main

    config = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    started = []
    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: started.append(1) or FakeLauncher(config))
    monkeypatch.setattr(tuner.trial.step, "make_probe", lambda *a, **k: measurement)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "w", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "encoder_sim", "measurement": {"warmup": False},
                                    "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv")}}))
    mine = tmp_path / "mine.json"
    mine.write_text('{"my": "precious data"}\n')
    assert main(["replay", str(path), "--json", str(mine)]) == 2
    assert capsys.readouterr().err == (f"tuner: error: --json {mine}: exists and tuner did not write it: give "
                                       "--force to replace it, or write to another file\n")
    assert mine.read_text() == '{"my": "precious data"}\n' and started == []
    assert main(["replay", str(path), "--json", str(mine), "--force"]) == 0
    assert "measurement" in json.loads(mine.read_text()) and started == [1]
    assert main(["replay", str(path), "--json", str(mine)]) == 0  # tuner's own: replaced as before
    assert started == [1, 1]


def test_quiet_draws_no_progress_bar_and_still_prints_the_measurement(server, tmp_path):
    """In a CI log (stderr no terminal) the replay's bar writes \\r-separated frames; --quiet draws none."""
    traffic = pd.DataFrame({"timestamp": np.arange(30) / 10.0, "seq_len": 4})  # 3 s at 10 req/s
    path = study(tmp_path, server.endpoints.http, traffic=traffic)
    run = tuner("replay", str(path))
    assert run.returncode == 0, run.stderr
    # the bar's frames (text mode reads its \r as line ends)
    assert re.search(r"^replay: +\d+%\|.*req/s\]$", run.stderr, re.M), run.stderr
    quiet = tuner("replay", str(path), "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert "req/s]" not in quiet.stderr and "replay:" not in quiet.stderr and "%|" not in quiet.stderr, quiet.stderr
    assert "throughput" in quiet.stdout and "latency" in quiet.stdout  # the measurement as without it
    assert [line for line in quiet.stderr.splitlines() if line.startswith("warm-up:")]  # and its one-line notes


def test_the_json_records_the_config_replayed_and_the_table_says_a_repeated_measurement(tmp_path, monkeypatch,
                                                                                        capsys):
    """--json names the --config file and the batching fields the server ran (read back from it, not the
    file's text); a measurement repeated near the SLA's limit says so in the table, as the JSON does."""
    import tuner.server
    import tuner.trial.step
    from tests.support import FakeLauncher, measurement
    from tuner.cli import main

    class Applying(FakeLauncher):
        def apply_config(self, model, config):
            self.config = config  # what a server reads back: the loaded config
            return config

    base = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: Applying(base))
    repeated = dataclasses.replace(measurement(1.0), repeats=3)
    monkeypatch.setattr(tuner.trial.step, "make_probe", lambda *a, **k: lambda speed: repeated)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "w", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "encoder_sim", "measurement": {"warmup": False},
                                    "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv")}}))
    config = tmp_path / "recommended.pbtxt"
    config.write_text(modelconfig.to_text(space.apply(base, {
        "max_batch_size": 16, "max_queue_delay_microseconds": 2000, "preferred_batch_size": (8, 16),
        "instance_count": 2, "max_queue_size": 100})))
    out = tmp_path / "m.json"
    assert main(["replay", str(path), "--config", str(config), "--set", "max_queue_delay_microseconds=500",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["config"] == str(config)
    assert data["params"] == {"max_queue_delay_microseconds": 500}
    running = data["running"]
    assert (running["max_batch_size"], running["max_queue_delay_microseconds"], running["preferred_batch_size"],
            running["instance_count"], running["max_queue_size"]) == (16, 500, [8, 16], 2, 100)
    assert data["measurement"]["repeats"] == 3
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("repeats")]
    assert rows == ["repeats         3 replays of the same window (its p99 was near the SLA's limit); the median "
                    "by how far each breaks the SLA is shown (of two, the worse)"], rows
    # the SLA's verdict, as the table's row says it, for a script running the check-it line
    assert data["sla"]["held"] is True and data["sla"]["verdict"].startswith("held for this window: p99 10.0 ms")
    # the repository's config, a measurement taken once: no config named, no repeats row
    monkeypatch.setattr(tuner.trial.step, "make_probe", lambda *a, **k: measurement)
    assert main(["replay", str(path), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["config"] is None and data["running"]["max_batch_size"] == base.max_batch_size
    assert "repeats" not in capsys.readouterr().out


def test_a_generative_replays_json_records_the_engine_arguments_it_ran(tmp_path, monkeypatch):
    """A vLLM-served model's --json names the model.json given (or none) and the engine arguments the
    engine was loaded with: the model's own where none were applied."""
    import tuner.server
    import tuner.trial.generate
    from tests.support import FakeLauncher
    from tuner.cli import main
    from tuner.trial.generate import GenerateRun

    applied = []

    class Engine(FakeLauncher):
        def apply_engine_args(self, model, config, args):
            applied.append(dict(args))
            return config

    due, m = _streamed()
    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: Engine())
    monkeypatch.setattr(tuner.trial.generate, "replay_generate", lambda *a, **k: GenerateRun(m, m, None))
    pd.DataFrame({"timestamp": due, "prompt_tokens": 5, "output_tokens": 5}).to_csv(tmp_path / "t.csv", index=False)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "llm", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "llm_vllm", "traffic": {"path": "t.csv"}, "replay": {"warmup_s": 0.5},
                                    "sla": {"ttft_ms": 1000}}))
    own = json.loads((ROOT / "model_repository_templates" / "llm_vllm" / "1" / "model.json").read_text())
    out = tmp_path / "r.json"
    assert main(["replay", str(path), "--set", "max_num_seqs=4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["config"] is None and data["engine_args"] == {**own, "max_num_seqs": 4} == applied[-1]
    (tmp_path / "model.json").write_text(json.dumps({**own, "max_num_seqs": 2}))
    assert main(["replay", str(path), "--config", str(tmp_path / "model.json"), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["config"] == str(tmp_path / "model.json") and data["engine_args"]["max_num_seqs"] == 2
    assert main(["replay", str(path), "--json", str(out)]) == 0  # none applied: the model's own, as it loads
    data = json.loads(out.read_text())
    assert data["engine_args"] == own and len(applied) == 2
    assert isinstance(data["sla"]["held"], bool) and data["sla"]["verdict"].startswith(
        "held for this window" if data["sla"]["held"] else "MISSED for this window")


@pytest.mark.parametrize("command", ["replay", "profile"])
def test_a_seq_len_column_a_fixed_dims_model_does_not_take_is_named_before_the_server(tmp_path, monkeypatch, capsys,
                                                                                    command):
    # tune and simulate said so; replay and profile sent the same shapes whatever the lengths, without a word
    import tuner.server
    from tuner.cli import main
    from tuner.errors import ServerSetupError

    def no_server(*args, **kwargs):
        raise ServerSetupError("no server in this test")

    monkeypatch.setattr(tuner.server, "make_launcher", no_server)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "mm", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "matmul_cpu",
                                    "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv")}}))
    argv = [command, str(path)] + (["-o", str(tmp_path / "p.csv")] if command == "profile" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "column 'seq_len' is not sent: no input of matmul_cpu has a variable dim it sizes" in err, err
    if command == "profile":  # and it profiles one length, not the column's six
        assert ", no length column" in err and "lengths from the traffic's 'seq_len'" not in err, err


def test_the_table_says_whether_the_studys_sla_held_for_the_window(tmp_path, monkeypatch, capsys):
    """Reviewer U6: the check-it line tune prints replays the recommendation, and the table gave p99 181 ms
    but no verdict: the reader compared it with the 200-ms limit by hand. A row says it, by the rule a
    trial's step is judged by (`tuner.score.check_sla`), the figures beside it."""
    import tuner.server
    import tuner.trial.step
    from tests.support import FakeLauncher, measurement
    from tuner.cli import main

    config = modelconfig.load(ROOT / "model_repository_templates" / "encoder_sim" / "config.pbtxt")
    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: FakeLauncher(config))
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({"name": "w", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "encoder_sim", "measurement": {"warmup": False},
                                    "sla": {"latency_ms": 200, "max_error_rate": 0.01},
                                    "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv")}}))

    def sla_row(m) -> str:
        monkeypatch.setattr(tuner.trial.step, "make_probe", lambda *a, **k: lambda speed: m)
        assert main(["replay", str(path), "--step"]) == 0
        rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SLA ")]
        assert len(rows) == 1, rows
        return rows[0]

    assert sla_row(measurement(1.0, p99=181.0)) == (
        "SLA             held for this window: p99 181.0 ms <= 200 ms, error rate 0.00% <= 1.00%")
    assert sla_row(measurement(1.0, p99=214.0)) == "SLA             MISSED for this window: p99 214.0 ms > 200 ms"
    assert sla_row(measurement(1.0, p99=181.0, errors=20)).endswith("error rate 2.00% > 1.00%")
    assert "no verdict: the replay was not valid" in sla_row(measurement(1.0, valid=False))


def test_a_generative_replays_table_says_whether_its_token_sla_held(tmp_path, monkeypatch, capsys):
    """The same row for a generative study: its token SLA (here TTFT at p99), by `tuner.score.check_tokens`."""
    import tuner.server
    import tuner.trial.generate
    from tests.support import FakeLauncher
    from tuner.cli import main
    from tuner.trial.generate import GenerateRun

    due, m = _streamed()
    monkeypatch.setattr(tuner.server, "make_launcher", lambda settings: FakeLauncher())
    monkeypatch.setattr(tuner.trial.generate, "replay_generate", lambda *a, **k: GenerateRun(m, m, None))
    pd.DataFrame({"timestamp": due, "prompt_tokens": 5, "output_tokens": 5}).to_csv(tmp_path / "t.csv", index=False)
    for limit, row in ((1000, "held for this window: p99 TTFT 100.0 ms <= 1000 ms, error rate 0.00% <= 0.10%"),
                       (50, "MISSED for this window: p99 TTFT 100.0 ms > 50 ms")):
        path = tmp_path / "study.yaml"
        path.write_text(yaml.safe_dump({"name": "llm", "model_repository": str(ROOT / "model_repository_templates"),
                                        "model": "llm_vllm", "traffic": {"path": "t.csv"},
                                        "replay": {"warmup_s": 0.5}, "sla": {"ttft_ms": limit},
                                        "search": {"capacity": {"step_duration_s": 1.0}}}))
        for step in ([], ["--step"]):  # a step's rule (`keeping_up`): an engine that kept up passes as at the load
            assert main(["replay", str(path), *step]) == 0
            rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SLA ")]
            assert len(rows) == 1 and rows[0].split(None, 1)[1] == row, rows
    # a study that limits no token figure is still replayed (a measurement): no verdict, said, not a traceback
    path.write_text(yaml.safe_dump({"name": "llm", "model_repository": str(ROOT / "model_repository_templates"),
                                    "model": "llm_vllm", "traffic": {"path": "t.csv"}, "replay": {"warmup_s": 0.5}}))
    assert main(["replay", str(path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SLA ")]
    assert rows[0].split(None, 1)[1] == "no verdict: the study limits no token figure (sla.ttft_ms, sla.tpot_ms or " \
                                        "sla.e2e_ms)", rows


def _streamed():
    """A generative replay's due times and measurement: a request every 0.5 s for 3 s, 5 tokens each,
    its first token 100 ms after its due time, then one every 100 ms."""
    from tuner.measurement_tokens import measure_tokens

    due = np.arange(0.0, 3.0, 0.5)
    records = pd.DataFrame({"row": np.arange(len(due)), "due_s": due, "send_s": due, "end_s": due + 0.5,
                            "send_lag_ms": 0.1, "ok": True, "error": "", "prompt_tokens": 5, "output_tokens": 5,
                            "tokens": 5, "first_token_s": due + 0.1, "last_token_s": due + 0.5,
                            "itl_ms": [np.full(4, 100.0)] * len(due)})
    return due, measure_tokens(records, speed=1.0, warmup_s=0.5, lag_budget_ms=50.0, duration_s=3.0)
