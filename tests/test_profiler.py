"""`tuner profile` (tuner/profiler.py): the grid it measures and how samples become a profile, on
synthetic samples; then a profile of the emulated GPU on a real Triton, checked against the
emulation's own formula (README of model_repository_templates/encoder_sim), and the command's errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from benchmarks.encoder_sim import emulation
from tuner import modelconfig
from tuner.cli import main
from tuner.errors import ProfileError
from tuner.profiler import (
    Sample,
    build_profile,
    concurrency_of,
    length_buckets,
    model_max_length,
    overlap_of,
    request_extras,
    row_grid,
)
from tuner.settings import read_study
from tuner.simulate import read_profile
from tuner.study import study_traffic
from tuner.traffic import read_traffic

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "model_repository_templates" / "encoder_sim"
CODE_TRACE = ROOT / "traffic_profiles" / "azure_llm_2023_code.csv"
BURSTY = ROOT / "traffic_profiles" / "bursty_60s.csv"


# --- the grid ----------------------------------------------------------------------------------------


def test_rows_are_a_log_ish_grid_up_to_and_including_the_largest_max_batch_size():
    assert row_grid(64) == (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
    assert row_grid(10) == (1, 2, 4, 8, 10)
    assert row_grid(1) == (1,)
    assert row_grid(100) == (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 100)


def test_lengths_are_quantiles_of_the_traffic_capped_at_the_model_maximum():
    traffic = read_traffic(CODE_TRACE)
    # 77 % of the code trace's requests are 512 tokens or more: capped, the quantiles from the 25th up
    # are all 512; the 2nd and 10th percentiles are the short requests
    assert length_buckets(traffic, "seq_len", 512) == (35, 147, 512)
    uncapped = length_buckets(traffic, "seq_len")
    assert uncapped[-1] == traffic["seq_len"].max() and len(uncapped) > 3
    assert length_buckets(traffic, None) == (1,)
    # a length within 15 % below the next one is measured as that one
    close = pd.DataFrame({"timestamp": range(100), "seq_len": [100] * 50 + [110] * 50})
    assert length_buckets(close, "seq_len", quantiles=(0.0, 1.0)) == (110,)


def test_the_model_maximum_length_comes_from_its_config():
    config = modelconfig.load(TEMPLATE / "config.pbtxt")
    assert model_max_length(config) == 512
    del config.parameters["max_sequence_length"]
    assert model_max_length(config) is None
    config.parameters["max_sequence_length"].string_value = "many"
    with pytest.raises(ProfileError, match="max_sequence_length must be an integer, got 'many'"):
        model_max_length(config)


def _study_settings(tmp_path, max_batch_size: int):
    repo = tmp_path / "models"
    shutil.copytree(TEMPLATE, repo / "encoder_sim")
    path = repo / "encoder_sim" / "config.pbtxt"
    config = modelconfig.load(path)
    config.max_batch_size = max_batch_size
    path.write_text(modelconfig.to_text(config))
    study = {"name": "lengths", "model_repository": str(repo), "model": "encoder_sim",
             "traffic": {"path": str(BURSTY), "busiest_s": 8, "speed": 4.0},
             "sla": {"latency_ms": 100, "percentile": 99}, "cost": {"gpu": "a100-40gb"},
             "search": {"max_batch_size": {"low": 1, "high": 64}}, "output": str(tmp_path / "out")}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    return read_study(tmp_path / "study.yaml")


def test_padded_lengths_are_those_the_incumbents_simulated_batches_take(tmp_path):
    from tuner.profiler import padded_lengths
    from tuner.simulate import Profile
    from tuner.study import base_config

    profile = Profile.from_function(lambda r, n: 1.0 + r * n / 500, rows=[1, 8, 64], lengths=[32, 512],
                                    max_length=512)
    alone = _study_settings(tmp_path / "one", 1)  # batches of one request: its own length
    traffic = study_traffic(alone)
    lengths = padded_lengths(alone, traffic, base=base_config(alone), profile=profile, column="seq_len")
    capped = np.minimum(traffic["seq_len"].to_numpy(), 512)
    assert lengths == tuple(sorted({int(np.quantile(capped, q, method="higher")) for q in
                                    (0.02, 0.1, 0.25, 0.5, 0.75, 1.0)}))
    # batches of up to 64 at 4x: a request pays for the longest of its batch; the short quantiles rise
    batched = _study_settings(tmp_path / "many", 64)
    longer = padded_lengths(batched, traffic, base=base_config(batched), profile=profile, column="seq_len")
    assert longer[0] > lengths[0] and longer[-1] == lengths[-1] == 512, (lengths, longer)


# --- samples -> profile --------------------------------------------------------------------------------


def sample(rows, length, infer, *, ok=True, measured=True, inp=0.05, out=0.1, client=None, error=""):
    return Sample(rows=rows, length=length, ok=ok, client_ms=client if client is not None else inp + infer + out + 0.5,
                  input_ms=inp, infer_ms=infer, output_ms=out, measured=measured, error=error)


def test_a_point_is_the_median_and_spread_of_its_measured_requests_not_its_first():
    samples = [sample(4, 128, 30.0, measured=False)]  # a shape's first run: compilation, not the model
    samples += [sample(4, 128, ms) for ms in (5.0, 5.2, 5.1, 4.9, 6.0)]
    profile, notes = build_profile(samples)
    (point,) = profile.points
    assert (point.rows, point.length, point.count) == (4, 128, 5)
    assert point.median_ms == pytest.approx(5.1)
    assert point.p10_ms == pytest.approx(np.percentile([5.0, 5.2, 5.1, 4.9, 6.0], 10))
    assert point.p90_ms == pytest.approx(np.percentile([5.0, 5.2, 5.1, 4.9, 6.0], 90)) and point.p90_ms < 30
    assert notes == []


def test_host_time_is_a_line_in_rows_and_overhead_what_the_client_saw_beyond_the_execution():
    samples = []
    for rows in (1, 2, 4, 8):
        host = 0.2 + 0.05 * rows  # input + output: 0.2 ms per execution + 0.05 ms per row
        for infer in (1.0 * rows, 1.0 * rows + 0.1):
            samples.append(sample(rows, 64, infer, inp=host / 2, out=host / 2,
                                  client=host + infer + (0.7 if rows == 1 else 3.0)))
    profile, _ = build_profile(samples, concurrent_executions=2, model="m")
    assert profile.host_ms_per_row == pytest.approx(0.05)
    assert profile.host_ms_per_execution == pytest.approx(0.2)
    assert profile.overhead_ms == pytest.approx(0.7)  # of 1-row requests: bigger ones carry more bytes
    assert profile.concurrent_executions == 2 and profile.model == "m"
    # host time that shrinks with rows is no line through them: a constant
    flat = [sample(r, 64, 1.0, inp=0.3 / r, out=0.0) for r in (1, 2, 4)]
    profile, _ = build_profile(flat)
    assert profile.host_ms_per_row == 0 and profile.host_ms_per_execution == pytest.approx(0.15)


def test_the_smallest_failing_rows_at_each_length_is_its_memory_limit_and_failing_points_are_left_out():
    oom = "CUDA out of memory (emulated): batch of 33 rows x 512 tokens"
    samples = [sample(r, 512, float(r)) for r in (1, 2, 32)] + [sample(64, 128, 8.0)]
    samples += [sample(33, 512, 3.0, ok=False, measured=False, error=oom),
                sample(48, 512, 2.8, ok=False, measured=False, error=oom),
                # a point whose first run worked and a repeat failed: the point fails
                sample(40, 256, 9.0, measured=False), sample(40, 256, 9.0),
                sample(40, 256, 3.2, ok=False, error=oom)]
    profile, notes = build_profile(samples, max_length=512)
    assert profile.oom_rows == ((256, 40), (512, 33)) and profile.oom_tokens is None
    assert profile.oom_ms == pytest.approx(3.0)
    # 32 x 512 ran and stays although 40 x 256 (fewer tokens) failed: a limit per length, not in tokens;
    # 64 x 128 (8192 tokens) ran too, at a length where nothing failed
    assert {(p.rows, p.length) for p in profile.points} == {(1, 512), (2, 512), (32, 512), (64, 128)}
    assert notes == [] and not profile.fails(64, 128) and profile.fails(33, 512) and not profile.fails(32, 512)
    # a point that ran at or above rows that failed at its own length is left out, and said so
    flaky = samples + [sample(36, 512, 9.0)]
    profile, notes = build_profile(flaky, max_length=512)
    assert (36, 512) not in {(p.rows, p.length) for p in profile.points}
    assert any("36 rows x 512 ran although 33 rows failed at that length" in n for n in notes)
    # nothing ran at all: one line, not a profile
    with pytest.raises(ProfileError, match="no execution ran without an error"):
        build_profile([sample(1, 512, 3.0, ok=False, measured=False, error=oom)])


def test_the_per_request_cost_is_the_slope_of_n_requests_over_one_request_of_n_rows():
    samples = []
    for n in (1, 2, 4, 8):
        samples += [sample(n, 64, 1.0 + 0.1 * n, measured=False)] + [sample(n, 64, 1.0 + 0.1 * n) for _ in range(3)]
        if n > 1:  # N one-row requests batched: 0.04 ms more per request after the first, in infer and output
            extra = 0.04 * (n - 1)
            samples += [Sample(rows=n, length=64, ok=True, client_ms=9.0, input_ms=0.05, infer_ms=1.0 + 0.1 * n + extra / 2,
                               output_ms=0.1 + extra / 2, measured=k > 0, requests=n) for k in range(4)]
    profile, _ = build_profile(samples)
    assert profile.host_ms_per_request == pytest.approx(0.04)
    # the batches of separate requests are not points: the points are the single requests' times
    assert [p.median_ms for p in profile.points] == pytest.approx([1.1, 1.2, 1.4, 1.8])
    assert request_extras(samples)[0] == pytest.approx((2, 64, 1.35, 1.39))
    # separate requests faster than one request (noise): never a negative cost; none timed: 0
    faster = [s if s.requests == 1 else Sample(**{**s.__dict__, "infer_ms": 0.5}) for s in samples]
    assert build_profile(faster)[0].host_ms_per_request == 0
    assert build_profile([s for s in samples if s.requests == 1])[0].host_ms_per_request == 0


def test_executions_at_once_are_k_times_one_alone_over_k_together_rounded_within_one_and_k():
    assert concurrency_of(2, 100.0, 200.0) == 1  # two together took twice one: they took turns
    assert concurrency_of(2, 100.0, 104.0) == 2  # as long as one: side by side
    assert concurrency_of(2, 100.0, 125.0) == 2  # 1.6 at once: a whole second slot
    assert concurrency_of(2, 100.0, 150.0) == 1  # 1.33
    assert concurrency_of(4, 100.0, 90.0) == 4 and concurrency_of(3, 100.0, 400.0) == 1  # never past 1..k
    assert concurrency_of(2, 0.0, 100.0) == 1  # nothing measured: the shared device
    # taking turns, each other execution of 100 ms device time added 80 ms: a fifth of it ran beside;
    # the 5 ms outside the device (HTTP, Triton) in both wall times cancel
    assert overlap_of(2, 100.0, alone_ms=105.0, together_ms=185.0) == pytest.approx(0.2)
    assert overlap_of(3, 100.0, alone_ms=105.0, together_ms=265.0) == pytest.approx(0.2)
    assert overlap_of(2, 100.0, alone_ms=105.0, together_ms=215.0) == 0.0  # never below 0
    assert overlap_of(1, 100.0, alone_ms=105.0, together_ms=105.0) == 0.0  # one instance: nothing to share
    assert overlap_of(2, 100.0, alone_ms=105.0, together_ms=105.0) == 0.95  # at most MAX_OVERLAP


# --- on a real server --------------------------------------------------------------------------------


BUDGET = 4096  # the emulated GPU's padded-token budget, small so that 16 rows run out of memory


@pytest.fixture(scope="module")
def study(tmp_path_factory, triton_install) -> Path:
    tmp = tmp_path_factory.mktemp("profile")
    repo = tmp / "models"
    shutil.copytree(TEMPLATE, repo / "encoder_sim")
    path = repo / "encoder_sim" / "config.pbtxt"
    config = modelconfig.load(path)
    config.parameters["max_padded_tokens"].string_value = str(BUDGET)
    path.write_text(modelconfig.to_text(config))
    study = {
        "name": "profile", "model_repository": str(repo), "model": "encoder_sim",
        "traffic": {"path": str(BURSTY), "busiest_s": 8, "speed": 0.25},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 100},
        "measurement": {"window_s": 0.5, "warmup_max_s": 10},
        "sla": {"latency_ms": 100, "percentile": 99},
        "cost": {"gpu": "a100-40gb"},
        "search": {"sampler": "grid", "max_batch_size": {"low": 1, "high": 16, "log": True},
                   "max_queue_delay_microseconds": {"low": 0, "high": 0}},
        "output": str(tmp / "out"),
    }
    file = tmp / "study.yaml"
    file.write_text(yaml.safe_dump(study))
    return file


@pytest.mark.slow
def test_a_profile_on_real_triton_finds_the_emulated_gpu_its_cold_start_left_out(study, capsys):
    """The template's cold start is on: a profile taken before the warm-up, or counting a shape's
    first run (24 ms more here), would be far off the emulation's warm formula."""
    out = study.parent / "out" / "profile.csv"
    assert main(["profile", str(study), "--repeats", "5"]) == 0  # the default output: the study's directory
    printed = capsys.readouterr().out
    profile = read_profile(out)
    m = emulation()
    params = {k: v.string_value for k, v in modelconfig.load(TEMPLATE / "config.pbtxt").parameters.items()}
    tokens, ms = m.parse_table(params["latency_table_ms"])
    scale, host_ms = float(params["time_scale"]), float(params["host_us_per_request"]) * 1e-3

    def truth(rows: int, length: int) -> float:  # the warm emulated execute(): GPU time and its host work
        gpu = m.execute_ms(rows * min(length, 512), tokens, ms, float(params["memory_bound_tokens"]),
                           float(params["memory_bound_slowdown"]))
        return gpu * scale + host_ms * scale * rows

    lengths = sorted({p.length for p in profile.points})
    traffic = study_traffic(read_study(study))  # the busiest 8 s of the profile
    requested = length_buckets(traffic, "seq_len", 512)
    # the requests' lengths, and those the incumbent's simulated batches are padded to (printed)
    padded = [int(n) for n in printed.split("the incumbent's simulated padded lengths: ")[1].split("\n")[0].split(", ")
              if n.isdigit()]
    assert set(requested) <= set(lengths) <= set(requested) | set(padded) and profile.max_length == 512
    wide, slow = [], []
    for p in profile.points:
        want = truth(p.rows, p.length)
        # the Python backend adds ~0.5 ms to every execution; a busy 2-core machine oversleeps a little.
        # Contention only adds time: every point's fastest tenth is held to the warm formula, and its
        # median too but for a few points that a stall of the loaded machine lifted (CI saw rows=1,
        # length=324 at 8.9 ms for 5.5 ms with its p10 at 6.4 ms while three test workers ran).
        assert want - 0.5 <= p.p10_ms <= want * 1.1 + 2.0, (p, want)
        assert want - 0.5 <= p.median_ms, (p, want)
        if p.median_ms > want * 1.1 + 2.0:
            slow.append((p, want))
        if p.p90_ms > want * 1.3 + 4.0:
            wide.append((p, want))
        assert p.count == 5 and p.rows * min(p.length, 512) <= BUDGET
    # A first run's 24 ms is not in the spread: counted, it would be one of every point's six samples and
    # put every p90 past want + 12 ms. Of 5 repeats the p90 is nearly the largest, so one stall of the
    # loaded machine widens one point: some such points are allowed, not most (CI saw 4 of 39 while the
    # other test worker ran; a counted first run makes it 39 of 39).
    assert len(wide) <= max(2, len(profile.points) // 4), wide
    assert len(slow) <= max(1, len(profile.points) // 20), slow
    # the smallest failing rows, found to one row at each length that fails within 16 rows
    failing = {n: BUDGET // min(n, 512) + 1 for n in lengths if BUDGET // min(n, 512) + 1 <= 16}
    assert failing and dict(profile.oom_rows) == failing and profile.oom_tokens is None
    assert 0 < profile.oom_ms < 20
    # batches of N separate one-row requests were held behind a slow execution and timed, for every N
    # that ran at the shortest length; the Python backend's work per request is small but not negative
    shortest = min(lengths)
    held = [r for r in (2, 4, 8, 12, 16) if (r, shortest) in {(p.rows, p.length) for p in profile.points}]
    table_lines = printed.split("batches of N separate one-row requests vs one request of N rows")[1].splitlines()
    assert [line.split()[0] for line in table_lines[2:2 + len(held)]] == [str(n) for n in held], printed
    # none given up ("... did not form one batch behind the slowest execution"); a loaded machine may
    # start some of an N's sends late, which the profile says ("timed 4 of 5 times") and keeps (CI saw it)
    assert "did not form one batch behind" not in printed
    assert 0 <= profile.host_ms_per_request < 1.0
    assert 0 <= profile.host_ms_per_row < 0.1 and 0 <= profile.host_ms_per_execution < 2
    assert 0 < profile.overhead_ms < 10 and profile.concurrent_executions == 1
    assert "OOM" in printed and "out of memory from " + ", ".join(
        f"{r} rows at length {n}" for n, r in sorted(failing.items())) in printed
    assert f"wrote {out}" in printed


@pytest.mark.slow
def test_bad_arguments_are_one_line_before_any_server_starts(study, tmp_path, capsys):
    assert main(["profile", str(study), "--max-batch-size", "0"]) == 2
    assert capsys.readouterr().err.strip() == "tuner: error: --max-batch-size: must be >= 1, got 0"
    (tmp_path / "in-the-way").mkdir()
    assert main(["profile", str(study), "-o", str(tmp_path / "in-the-way")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # tuner.paths checks -o before the work, naming the path as given
    assert err[-1].startswith("tuner: error: ") and len(err) == 1
    assert f"{tmp_path / 'in-the-way'}: cannot write: it is a directory" in err[-1]
    assert main(["profile", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_space_of_two_instances_measures_how_many_executions_run_at_once(gpus, tmp_path, triton_install, capsys):
    """encoder_sim's instances share one emulated GPU (its lock: they take turns), or with `gpus` 2
    each has its own: the profile finds 1 and 2."""
    repo = tmp_path / "models"
    shutil.copytree(TEMPLATE, repo / "encoder_sim")
    path = repo / "encoder_sim" / "config.pbtxt"
    config = modelconfig.load(path)
    config.parameters["gpus"].string_value = str(gpus)
    # 5x the template's time: an execution of 2 x 512 takes ~45 ms, against which the few ms of HTTP and
    # the Python backend's IPC around it (which two requests at once partly queue for on a 2-core host) are small
    config.parameters["time_scale"].string_value = "30"
    path.write_text(modelconfig.to_text(config))
    traffic = tmp_path / "traffic.csv"  # one length: a profile of two points
    pd.DataFrame({"timestamp": np.arange(200) / 20.0, "batch_size": 1, "seq_len": 512}).to_csv(traffic, index=False)
    study = {
        "name": "instances", "model_repository": str(repo), "model": "encoder_sim",
        "traffic": {"path": str(traffic), "busiest_s": 4},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 100},
        "measurement": {"window_s": 0.5, "warmup_max_s": 10},
        "sla": {"latency_ms": 100, "percentile": 99},
        "cost": {"gpu": "a100-40gb"},
        "search": {"sampler": "grid", "max_batch_size": {"low": 1, "high": 2, "log": True},
                   "max_queue_delay_microseconds": {"low": 0, "high": 0}, "instance_count": {"low": 1, "high": 2}},
        "output": str(tmp_path / "out"),
    }
    file = tmp_path / "study.yaml"
    file.write_text(yaml.safe_dump(study))
    out = tmp_path / "profile.csv"
    assert main(["profile", str(file), "--repeats", "2", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("instances at once: "))
    print(line)  # the figures, with -s
    ratio = float(line.split(" ms: ")[1].split(" executions at once")[0])
    assert read_profile(out).concurrent_executions == gpus, line
    # the ratio is near 1 (turns) or near 2 (side by side), not at the rounding's edge
    assert (0.85 <= ratio <= 1.25) if gpus == 1 else (1.7 <= ratio <= 2.1), line
    # taking turns, the little that overlaps is the host work around the emulated GPU's sleep (a few %)
    overlap = read_profile(out).device_overlap
    assert (0 <= overlap <= 0.2) if gpus == 1 else overlap == 0, (overlap, line)
    if gpus == 1:  # one instance in the space: nothing to measure; or the device's count given
        study["search"]["instance_count"] = {"low": 1, "high": 1}
        file.write_text(yaml.safe_dump(study))
        capsys.readouterr()
        assert main(["profile", str(file), "--repeats", "2", "-o", str(out), "--concurrent-executions", "3"]) == 0
        assert "instances at once" not in capsys.readouterr().out and read_profile(out).concurrent_executions == 3


@pytest.mark.parametrize("budget", [4096, 96])
def test_the_progress_never_goes_back_while_the_memory_limit_is_bisected(tmp_path, monkeypatch, budget):
    """The bar's total counts the bisection, the incumbent's padded lengths and the batches of separate
    requests up front and only falls as the work turns out smaller: done / total never falls, and the
    bar ends full. A fake server here: out of memory past `budget` padded tokens (96: not two rows at the
    shortest length, so no batch of separate requests is timed, and the total falls after the last point)."""
    import tuner.profiler as profiler

    class Sender:
        resent, untimed = 2, 1  # as if Triton had counted three requests' executions late, one every time

        def __init__(self, *args, **kwargs):
            pass

        def send(self, rows, length, *, measured=True):
            fits = rows * length <= budget
            return sample(rows, length, 0.01 * rows * length, ok=fits, measured=measured,
                          error="" if fits else "CUDA out of memory (emulated)")

        def send_held(self, n, length, *, blocker, measured=True):
            return Sample(rows=n, length=length, ok=True, client_ms=1.0, infer_ms=0.5 + 0.1 * n, measured=measured,
                          requests=n)

    class Launcher:
        def apply_config(self, model, config):
            return config

    monkeypatch.setattr(profiler, "_Sender", Sender)
    monkeypatch.setattr(profiler, "padded_lengths", lambda *a, **k: (1000, 3000))  # two lengths more to measure
    (tmp_path / "traffic.csv").write_text("timestamp,batch_size,seq_len\n" + "".join(
        f"{i / 10},1,{64 if i % 2 else 400}\n" for i in range(40)))
    (tmp_path / "study.yaml").write_text(yaml.safe_dump({
        "name": "p", "model_repository": str(ROOT / "model_repository_templates"), "model": "encoder_sim",
        "traffic": {"path": str(tmp_path / "traffic.csv")}, "sla": {"latency_ms": 100, "percentile": 99},
        "cost": {"gpu": "a100-40gb"}, "measurement": {"warmup": False},
        "search": {"max_batch_size": {"low": 1, "high": 64, "log": True}}}))
    settings = read_study(tmp_path / "study.yaml")
    seen: list[tuple[int, int]] = []
    run = profiler.measure_profile(Launcher(), settings, study_traffic(settings),
                                   base=modelconfig.load(TEMPLATE / "config.pbtxt"), length_column="seq_len",
                                   concurrent_executions=1, repeats=3,
                                   on_progress=lambda done, total, what: seen.append((done, total)))
    assert run.profile.oom_rows  # the limit was bisected: at 400, 10 rows of 12 fail (4000 of 4096 tokens ran)
    # one report a point, then one more only where the total fell after the last point
    points = seen[:-1] if len(seen) > 1 and seen[-1][0] == seen[-2][0] else seen
    assert [d for d, _ in points] == list(range(1, len(points) + 1)) and all(d <= t for d, t in seen)
    fractions = [d / t for d, t in seen]
    assert all(b >= a for a, b in zip(fractions, fractions[1:], strict=False)), seen
    assert seen[-1][0] == seen[-1][1], seen
    assert "2 request(s) sent again: Triton's statistics did not show their one execution within 1 s " \
           "(a loaded host counts late); 1 not timed in 3 tries" in run.notes, run.notes


@pytest.mark.slow
def test_a_request_of_several_inputs_sized_by_one_length_column_is_served(triton_install):
    """A Triton trace of a BERT gives INPUT_IDS:0, ATTENTION_MASK:0, ... of one length: the profile
    takes the first as its length, and its requests must size every variable input by it (a frame of
    that one column left the other inputs' variable dims unsized, and the replay refused the request)."""
    from tuner.profiler import _Sender
    from tuner.server.local import LocalLauncher

    models = ROOT / "tests" / "data" / "replay_models"
    with LocalLauncher(models, models=["dtypes"], install=triton_install) as launcher:
        sender = _Sender(launcher, "dtypes", "F16:0", timeout_s=30)
        one = sender.send(2, 5)
        held = sender.send_held(2, 5, blocker=(1, 5, 1.0))
    assert one.ok, one.error
    assert held is None or held.ok  # timed, or said not to have formed one batch: never a refused request


@pytest.mark.slow
def test_an_execution_triton_counts_late_is_sent_again_not_timed_at_zero(triton_install, monkeypatch):
    """On a loaded host Triton can count an execution after the profile stops waiting for it: that
    request's delta was 0 ms and the next request's held both executions (CI saw a point's p10 at half its
    emulated sleep). Here the statistics are read stale for a while, as they are then."""
    import time

    from tuner import profiler
    from tuner.profiler import _Sender
    from tuner.server.local import LocalLauncher

    monkeypatch.setattr(profiler, "STATS_WAIT_S", 0.05)
    models = ROOT / "tests" / "data" / "replay_models"
    with LocalLauncher(models, models=["dtypes"], install=triton_install) as launcher:
        real = launcher.statistics
        stale: dict = {}

        def late(model):  # the first snapshot again until `until`: the execution is counted late
            now = real(model)
            if time.monotonic() < stale.get("until", 0.0):
                return stale.setdefault("snapshot", now)
            return now

        monkeypatch.setattr(launcher, "statistics", late)
        senders = [_Sender(launcher, "dtypes", "F16:0", timeout_s=30) for _ in range(3)]
        honest = senders[0].send(2, 5)
        stale.update(until=time.monotonic() + 0.2)
        recovered = senders[1].send(2, 5)
        stale.clear()
        stale.update(until=time.monotonic() + 60)  # counted late every time: kept, but not measured
        never = senders[2].send(2, 5)
    # what the profile's note counts: requests sent more than once, and those never timed
    assert [(s.resent, s.untimed) for s in senders] == [(0, 0), (1, 0), (1, 1)]
    assert honest.ok and honest.measured and honest.execution_ms > 0
    assert recovered.ok and recovered.measured and recovered.execution_ms > 0, recovered
    # one execution's time, not two: within a few times the undisturbed one
    assert recovered.execution_ms < honest.execution_ms * 5 + 1.0, (recovered, honest)
    assert never.ok and not never.measured
