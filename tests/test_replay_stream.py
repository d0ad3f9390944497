"""The generative (streaming) replay against a real tritonserver: `stream_echo`
(tests/data/replay_models) speaks the vLLM backend's interface and streams exactly max_tokens tokens,
the first 20 ms + 1 ms per prompt token after a request arrives, then one every 10 ms; a request
with a 13-token prompt fails after half its tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tuner.errors import ServerSetupError, TrafficError
from tuner.measurement_tokens import measure_tokens
from tuner.replay import replay
from tuner.replay._generate import is_generative_model, plan_generate
from tuner.server.local import LocalLauncher
from tuner.settings import ReplaySettings

MODELS = Path(__file__).resolve().parent / "data" / "replay_models"
FIRST_MS, PROMPT_MS, TOKEN_MS = 20.0, 1.0, 10.0
FAILING_PROMPT = 13
COLUMNS = ["row", "due_s", "send_s", "end_s", "latency_ms", "send_lag_ms", "ok", "error", "worker",
           "prompt_tokens", "output_tokens", "tokens", "first_token_s", "last_token_s", "itl_ms", "cut"]


@pytest.fixture(scope="module")
def server(triton_install):
    with LocalLauncher(MODELS, models=["stream_echo", "echo"], install=triton_install) as launcher:
        yield launcher


def settings(**kw) -> ReplaySettings:
    return ReplaySettings(**{"workers": 1, "warmup_s": 0.0, **kw})


def generative(rate: float, count: int, *, prompt, output) -> pd.DataFrame:
    return pd.DataFrame({"timestamp": 50.0 + np.arange(count) / rate, "prompt_tokens": prompt,
                         "output_tokens": output})


@pytest.mark.slow
def test_ttft_and_tpot_measured_agree_with_the_model_s_sleeps(server):
    prompt = np.arange(60) % 40 + 20  # 20 .. 59 tokens: TTFT 40 .. 79 ms
    traffic = generative(20, 60, prompt=prompt, output=np.arange(60) % 3 * 8 + 8)  # 8, 16, 24 tokens
    for _ in range(3):  # as a trial does (its attempts): a replay the loaded machine sent late is made again
        result = replay(server.endpoints, "stream_echo", traffic, speed=1.0, settings=settings())
        m = measure_tokens(result.records, speed=1.0, warmup_s=0.0, lag_budget_ms=5.0, ttft_ms=200.0, tpot_ms=12.0)
        if m.valid:
            break
    recs = result.records
    assert result.generative and list(recs.columns) == COLUMNS
    assert recs["ok"].all(), recs["error"].unique()
    # every request got exactly its output tokens
    assert (recs["tokens"] == recs["output_tokens"]).all() and (recs["prompt_tokens"] == prompt).all()
    assert [len(x) for x in recs["itl_ms"]] == (recs["tokens"] - 1).tolist()
    over = (recs["first_token_s"] - recs["due_s"]) * 1000 - (FIRST_MS + PROMPT_MS * recs["prompt_tokens"])
    # what the measurement must get right: its origin (the due time: never early, the send lag counted) and
    # its token (the first: a first token counted at the second would put every request a TOKEN_MS over).
    # How small the overhead (HTTP, Triton, the model's stub) stays is a speed figure of the machine,
    # printed by benchmarks/stream_replay.py (docs/replay.md: p50 ~2 ms); a loaded CI machine made it 5.2 ms.
    assert over.min() > -1.0 and over.quantile(0.25) < TOKEN_MS / 2, over.describe()
    assert over.median() < TOKEN_MS, over.describe()
    # the tail as "nearly all" below: 54 of 60 (a busy CI machine stalled one stream's tokens: p99 18 ms)
    assert m.tpot_ms["p50"] == pytest.approx(TOKEN_MS, rel=0.05) and m.tpot_ms["p90"] < TOKEN_MS * 1.25
    assert m.itl_ms["p50"] == pytest.approx(TOKEN_MS, rel=0.2)
    # the figure is the records' own (from the due time, at the first token), the sleeps' within a token:
    # how far above them it sits is the overhead, a speed figure (above; CI on a loaded machine: 5.9 ms)
    ttft = (recs["first_token_s"] - recs["due_s"]) * 1000
    assert m.ttft_ms["p50"] == pytest.approx(float(ttft.median()), rel=1e-9)
    expected_ttft = FIRST_MS + PROMPT_MS * prompt
    assert np.median(expected_ttft) - 1.0 < m.ttft_ms["p50"] < np.median(expected_ttft) + TOKEN_MS
    assert m.output_tokens == recs["output_tokens"].sum() and m.errors == 0 and m.valid
    assert m.good_requests >= 55, m.tpots_ms  # TPOT within 12 ms for nearly all
    assert result.details["locust"] == {"requests": 60, "failures": 0}


@pytest.mark.slow
def test_hundreds_of_concurrent_streams_are_replayed_and_their_send_lag_judged(server):
    # a 2,000-token prompt waits 2.02 s for its first token: at 200 requests/s, ~400 streams are open.
    # How low the send lag stays is a speed figure, printed by benchmarks/stream_replay.py (docs/replay.md), not
    # asserted here: on a loaded CI machine its p99 was 6.5 and 7.9 ms against the 5 ms budget
    traffic = generative(200, 500, prompt=2000, output=5)
    result = replay(server.endpoints, "stream_echo", traffic, speed=1.0, settings=settings())
    recs = result.records
    assert recs["ok"].all(), recs["error"].unique()[:3]
    edges = np.concatenate([np.stack([recs["send_s"], np.ones(len(recs))], 1),
                            np.stack([recs["end_s"], -np.ones(len(recs))], 1)])
    open_streams = np.cumsum(edges[np.argsort(edges[:, 0], kind="stable"), 1]).max()
    assert open_streams >= 300, open_streams
    m = measure_tokens(recs, speed=1.0, warmup_s=0.0, lag_budget_ms=5.0)
    print(f"{open_streams:.0f} streams open at once; send lag p50 {m.send_lag_ms['p50']:.3f} ms, "
          f"p99 {m.send_lag_ms['p99']:.3f} ms, max {m.send_lag_ms['max']:.3f} ms; "
          f"load generator {result.load_generator_cpu:.2f} CPU s/s")
    lags = recs["send_lag_ms"].to_numpy()
    assert np.isfinite(lags).all() and (lags >= 0).all() and m.send_lag_ms["max"] == pytest.approx(lags.max())
    assert m.valid == (m.send_lag_ms["p99"] <= 5.0), (m.send_lag_ms, m.invalid_reason)
    assert m.ttft_ms["p50"] == pytest.approx(FIRST_MS + 2000 * PROMPT_MS, rel=0.05)
    # a budget the walk met is valid; one it cannot meet is said, not hidden
    assert measure_tokens(recs, speed=1.0, warmup_s=0.0, lag_budget_ms=m.send_lag_ms["p99"] * 1.01 + 1e-3).valid
    tight = measure_tokens(recs, speed=1.0, warmup_s=0.0, lag_budget_ms=1e-6)
    assert not tight.valid and "the load generator was the bottleneck" in tight.invalid_reason


@pytest.mark.slow
def test_a_stream_that_fails_midway_is_an_error(server):
    prompt = np.where(np.arange(40) % 4 == 0, FAILING_PROMPT, 30)
    traffic = generative(40, 40, prompt=prompt, output=10)
    recs = replay(server.endpoints, "stream_echo", traffic, speed=1.0, settings=settings()).records
    failed = recs[recs["prompt_tokens"] == FAILING_PROMPT]
    assert len(failed) == 10 and not failed["ok"].any()
    assert (failed["error"] == "failed on purpose after 5 tokens").all()
    assert (failed["tokens"] == 5).all()  # what came before the error is kept
    assert recs.loc[recs["prompt_tokens"] != FAILING_PROMPT, "ok"].all()
    m = measure_tokens(recs, speed=1.0, warmup_s=0.0, lag_budget_ms=50.0)
    assert m.errors == 10 and m.error_rate == pytest.approx(0.25) and m.output_tokens == 300


@pytest.mark.slow
def test_traffic_without_output_lengths_is_refused_and_encoders_replay_as_before(server):
    no_tokens = pd.DataFrame({"timestamp": np.arange(5.0), "seq_len": 8})
    with pytest.raises(TrafficError, match="model 'stream_echo' generates text and the traffic has no "
                                           "'prompt_tokens' or 'output_tokens' column"):
        replay(server.endpoints, "stream_echo", no_tokens, speed=1.0, settings=settings())
    # a generative table replayed against an encoder: its seq_len sizes the tensors, as always
    both = no_tokens.assign(prompt_tokens=8, output_tokens=3)
    result = replay(server.endpoints, "echo", both, speed=10.0, settings=settings())
    assert not result.generative and result.records["ok"].all() and "tokens" not in result.records


def test_the_plan_shares_a_prompt_beginning_only_within_a_prefix_id():
    config = {"name": "m", "model_transaction_policy": {"decoupled": True},
              "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}]}
    assert is_generative_model(config) and not is_generative_model({"input": [{"name": "INPUT_IDS"}]})
    traffic = pd.DataFrame({"timestamp": np.arange(6.0), "prompt_tokens": [5, 5, 9, 5, 5, 5],
                            "output_tokens": [3, 3, 3, 3, 4, 3],
                            "prefix_id": ["a", "a", "a", None, None, "b"]})
    plan = plan_generate(config, traffic)
    starts = [plan.requests[i][2] for i in plan.shape_ids]
    assert starts[0] == starts[1] == starts[2] and len({starts[0], starts[3], starts[4], starts[5]}) == 4
    assert plan.shape_ids[0] == plan.shape_ids[1] and len(plan.requests) == 5  # rows 0 and 1 are one request
    assert [plan.requests[i][:2] for i in plan.shape_ids] == [[5, 3], [5, 3], [9, 3], [5, 3], [5, 4], [5, 3]]
    with pytest.raises(ServerSetupError, match=r"takes text_input but is not decoupled: .*\(model_transaction_policy \{ decoupled: true \}\)$"):
        plan_generate({**config, "model_transaction_policy": {}}, traffic)
    with pytest.raises(TrafficError, match=r"traffic row 3, timestamp 2.0: output_tokens=0 is not a positive integer"):
        plan_generate(config, traffic.assign(output_tokens=[3, 3, 0, 3, 3, 3]))


def stream_study(repository: Path, *, sla: dict, capacity: dict):
    """A study of stream_echo in `repository`: a 0.2-s warm-up, a send-lag budget a shared machine keeps,
    the SLA's p99 limits and the capacity search given."""
    from tuner.settings import study_from_dict

    return study_from_dict({
        "name": "stream", "model_repository": str(repository), "model": "stream_echo", "traffic": {"path": "t.csv"},
        "replay": {"warmup_s": 0.2, "lag_budget_ms": 200}, "sla": {**sla, "percentile": 99},
        "search": {"capacity": capacity},
    })


@pytest.mark.slow
def test_a_generative_trials_capacity_steps_are_warmed_by_a_requests_life_at_the_load(server, monkeypatch):
    """A short step from an idle engine measures a burst it absorbs: the capacity steps replay, before
    their window, as much traffic as a request took end to end at the recorded load (here ~1 s: 100
    tokens at 10 ms), not replay.warmup_s (0.2 s), and the trial says so."""
    from tuner import trial
    from tuner.trial import Hints
    from tuner.trial.run import make_measure

    study = stream_study(MODELS, sla={"ttft_ms": 500, "tpot_ms": 50},
                         capacity={"step_duration_s": 1.0, "tolerance": 0.5, "start_speed": 2, "max_speed": 2,
                                   "max_steps": 2})
    warmups = []
    real = trial.generate.replay_generate

    def spy(*args, **kwargs):
        warmups.append(kwargs["warmup_s"])
        return real(*args, **kwargs)

    monkeypatch.setattr(trial.generate, "replay_generate", spy)
    traffic = pd.DataFrame({"timestamp": np.arange(40) * 0.1, "prompt_tokens": 5, "output_tokens": 100})
    record = make_measure(server, study, traffic, generative=True)({}, Hints())
    assert 0.9 <= record.step_warmup_s <= 1.3, record.step_warmup_s  # the mean end to end at the load
    assert warmups[0] <= 0.2 and len(warmups) >= 2  # the load step (its busiest second starts the traffic)
    assert all(w == pytest.approx(record.step_warmup_s, abs=0.11) for w in warmups[1:]), warmups


@pytest.mark.slow
def test_a_generative_capacity_step_fails_where_the_engine_falls_behind_though_its_latency_holds(
        triton_install, tmp_path):
    """stream_echo limited to 400 tokens a second in all (an engine's throughput) on traffic of 100 output
    tokens a second at speed 1: it holds 4x. A step of 3 s above that meets a 5-s TTFT limit while its
    queue grows; the step fails because the engine streamed less than its window asked for and less
    than the traffic's average at that speed, and the capacity found is the rate it holds."""
    import shutil

    from tuner import modelconfig
    from tuner.score import check_tokens
    from tuner.traffic import mean_output_tps
    from tuner.trial import Hints
    from tuner.trial.generate import BEHIND, falls_behind
    from tuner.trial.run import make_measure

    repo = tmp_path / "models"
    shutil.copytree(MODELS / "stream_echo", repo / "stream_echo")
    path = repo / "stream_echo" / "config.pbtxt"
    config = modelconfig.load(path)
    for key, value in (("tokens_per_s", "400"), ("token_ms", "2"), ("prompt_token_ms", "0")):
        config.parameters[key].string_value = value
    path.write_text(modelconfig.to_text(config))
    study = stream_study(repo, sla={"ttft_ms": 5000, "tpot_ms": 500},
                         capacity={"step_duration_s": 3.0, "tolerance": 0.3, "start_speed": 2, "max_speed": 8,
                                   "max_steps": 6})
    traffic = pd.DataFrame({"timestamp": np.arange(150) * 0.2, "prompt_tokens": 5, "output_tokens": 20})
    seen = []
    with LocalLauncher(repo, models=["stream_echo"], install=triton_install) as launcher:
        record = make_measure(launcher, study, traffic, generative=True, on_measure=seen.append)({}, Hints())
    average = mean_output_tps(traffic)  # 101 output tokens/s at speed 1 (150 requests over 29.8 s)
    holds = 400 / average                # 4.0x: the speed the engine holds
    steps = [(round(m.speed, 2), round(m.streamed_tokens_per_s), round(m.offered_tokens_per_s)) for m in seen]
    assert record.sla_met and holds / 1.3 <= record.capacity_speed <= holds / BEHIND, (record.capacity_speed, steps)
    # above it, a step the latency alone passed: the engine's rate failed it
    above = [m for m in seen if m.speed > record.capacity_speed and m.valid]
    assert any(check_tokens(m, study.sla).ok and falls_behind(m, average_tokens_per_s=m.speed * average)
               for m in above), steps
    # each step that fell behind ended with its window: its streams still open were cut, not waited for
    # (none counted as an error), and the engine had let them go before the next step
    behind = [m for m in seen if m.valid and falls_behind(m, average_tokens_per_s=m.speed * average)]
    assert behind and all(m.cut_requests > 0 and m.errors == 0 for m in behind), [
        (m.speed, m.cut_requests, m.errors) for m in seen]
    assert all(m.cut_requests == 0 for m in seen if m not in behind), [(m.speed, m.cut_requests) for m in seen]
