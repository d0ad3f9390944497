"""Steady state before a measurement (tuner/trial/warmup.py) and repeats near the SLA's limit (tuner/trial/step.py):
the pure rules on synthetic windows, then a real server whose emulated GPU starts cold, and one whose
compute time never settles."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tuner import modelconfig, space
from tuner.cli import main
from tuner.measurement import Measurement
from tuner.server.local import LocalLauncher
from tuner.settings import MeasurementSettings, SlaSettings, read_study
from tuner.traffic import read_traffic
from tuner.trial.step import with_repeats
from tuner.trial.warmup import (
    FLOOR_MS,
    MAX_APART,
    MIN_EXECUTIONS,
    describe_windows,
    executions,
    fixed_mix_ms,
    rule_text,
    shape_sweep,
    steady,
    warm_up,
    windows_of,
)

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "traffic_profiles" / "bursty_60s.csv"


# --- the shape sweep ---------------------------------------------------------------------------------


def test_the_sweep_covers_every_batch_size_up_to_max_batch_size_at_the_lengths_batches_take():
    traffic = read_traffic(PROFILE)
    sweep = shape_sweep(traffic, 16)
    assert sorted(sweep["batch_size"].unique()) == list(range(1, 17))
    lengths = traffic["seq_len"]
    assert sweep["seq_len"].between(lengths.min(), lengths.max()).all()
    # a batch is as long as its longest request: the padded lengths grow with the rows
    by_rows = sweep.groupby("batch_size")["seq_len"].median()
    assert by_rows.loc[16] >= by_rows.loc[1]
    assert 16 <= len(sweep) <= 3 * 16 and sweep["timestamp"].is_monotonic_increasing
    no_lengths = shape_sweep(pd.DataFrame({"timestamp": [0.0, 1.0]}), 4)
    assert no_lengths["batch_size"].tolist() == [1, 2, 3, 4] and "seq_len" not in no_lengths


# --- the stability rule ------------------------------------------------------------------------------


def window(ms_by_size: dict[int, float], counts: dict[int, int] | None = None) -> dict[int, tuple[int, int]]:
    counts = counts or {size: 10 for size in ms_by_size}
    return {size: (counts[size], int(counts[size] * ms * 1e6)) for size, ms in ms_by_size.items()}


def test_steady_windows_agree_and_a_changing_batch_mix_alone_does_not_break_it():
    # the same time per batch size, but one window ran mostly small batches and another mostly large
    windows = [window({1: 2.0, 8: 10.0}, {1: 30, 8: 2}), window({1: 2.0, 8: 10.0}, {1: 2, 8: 30}),
               window({1: 2.1, 8: 9.9}, {1: 15, 8: 15})]
    assert steady(windows, k=3, pct=10)
    values = fixed_mix_ms(windows)
    assert max(values) / min(values) - 1 < 0.05  # valued at one mix, not at each window's own


def test_drifting_windows_are_not_steady_and_noisy_ones_only_within_the_percentage():
    drifting = [window({4: 5.0 * 1.06 ** k}) for k in range(6)]
    assert not steady(drifting, k=3, pct=10)
    rng = np.random.default_rng(0)
    noisy = [window({4: 5.0 * (1 + rng.uniform(-0.15, 0.15))}) for _ in range(3)]
    quiet = [window({4: 5.0 * (1 + rng.uniform(-0.02, 0.02))}) for _ in range(3)]
    assert not steady(noisy, k=3, pct=5) and steady(quiet, k=3, pct=5)
    assert not steady(quiet[:2], k=3, pct=10)  # too few windows
    assert not steady([*quiet[:2], {}], k=3, pct=10)  # a window with no execution says nothing


def replayed(ticks: int, *, seed: int, cold: int = 0, cold_factor: float = 10.0, drift: float = 0.0,
             lengths: tuple[float, ...] = (90.0, 200.0, 512.0)):
    """What Triton's statistics show, tick by tick (one a second), while the warm-up replays one stretch
    of a few requests a second on a real encoder on a CPU: the same requests every second, but the
    batcher groups them differently (now alone, now two together), an execution costs its rows times
    its longest length (0.05 ms a token-row) with 8 % jitter; the first `cold` executions are `cold_factor`
    slower, and every execution `drift` slower than the one before."""
    rng = np.random.default_rng(seed)
    out, k = [], 0
    for _ in range(ticks):
        order = list(rng.permutation(len(lengths)))
        tick: dict[int, tuple[int, int]] = {}
        while order:
            rows = 2 if len(order) >= 2 and rng.random() < 0.35 else 1
            batch, order = order[:rows], order[rows:]
            ms = 0.05 * rows * max(lengths[i] for i in batch) * rng.lognormal(0.0, 0.08) * (1 + drift) ** k
            ms *= cold_factor if k < cold else 1.0
            k += 1
            count, ns = tick.get(rows, (0, 0))
            tick[rows] = (count + 1, ns + int(ms * 1e6))
        out.append(tick)
    return out


def first_steady(windows, k=3, pct=10) -> int | None:
    """The number of windows after which the rule first calls the server steady (None: never)."""
    return next((j for j in range(k, len(windows) + 1) if steady(windows[:j], k=k, pct=pct)), None)


def old_steady(windows) -> bool:
    """The rule before: windows of 1 s valued at the sizes all of them ran, within 10 %."""
    common = set.intersection(*(set(w) for w in windows))
    if not common:
        return False
    weights = {s: sum(w[s][0] for w in windows) for s in common}
    values = [sum(weights[s] * w[s][1] / w[s][0] for s in common) for w in windows]
    return max(values) / min(values) - 1 <= 0.10


def test_a_few_executions_of_mixed_sizes_a_second_are_steady_when_the_server_is():
    at_once, within_5, old_rule = 0, 0, 0
    for seed in range(100):
        ticks = replayed(30, seed=seed)
        windows, _ = windows_of(ticks)
        assert all(executions(w) >= MIN_EXECUTIONS for w in windows)
        when = first_steady(windows)
        at_once += when == 3  # the first three windows already agree
        within_5 += when is not None and when <= 5
        old_rule += any(old_steady(ticks[j:j + 3]) for j in range(6))  # 8 s of 1-s windows
    assert at_once >= 85 and within_5 >= 97, (at_once, within_5)  # judged by its noise: steady, nearly always
    assert old_rule <= 40, old_rule  # where 1-s windows within 10 % mostly were not


def test_a_cold_start_ten_times_slower_is_not_steady_until_its_windows_are_past():
    for seed in range(20):
        windows, _ = windows_of(replayed(30, seed=seed, cold=4))
        assert not steady(windows[:3], k=3, pct=10), seed  # the cold executions' window stands out
        when = first_steady(windows)
        assert when is not None and when >= 4, (seed, when)  # steady only once the cold window is left behind


def test_a_server_that_keeps_slowing_down_is_almost_never_steady_at_a_few_executions_a_second():
    # 3 % slower every execution: 40 s of windows, 40 runs; the noise of a dozen executions, which the
    # drift itself widens, hid it in one of them (seed 6) until windows half apart were never steady
    # (MAX_APART: CI saw 47, 57 and 86 ms per execution called steady on a loaded machine)
    called = [seed for seed in range(40) if first_steady(windows_of(replayed(40, seed=seed, drift=0.03))[0])]
    assert called == [], called
    # with the same requests always batched alike (no grouping noise) it never passes
    for seed in range(20):
        assert first_steady(windows_of(replayed(40, seed=seed, drift=0.03, lengths=(200.0, 200.0, 200.0)))[0]) is None


def test_noise_on_a_very_fast_model_is_not_called_drift():
    # 40 us per execution, windows 30 % apart with thousands of executions: a tiny standard error, a
    # difference far beyond 10 %, but under the floor
    windows = [window({1: ms}, {1: 4000}) for ms in (0.04, 0.052, 0.045)]
    assert steady(windows, k=3, pct=10)
    assert 0.052 - 0.04 < FLOOR_MS and not steady([window({1: ms}, {1: 4000}) for ms in (0.4, 0.52, 0.45)], k=3, pct=10)


def test_the_windows_are_always_printed_with_their_uncertainty():
    assert describe_windows([], open_window=[{}, {}], window_s=1.0) == "no execution in the window (2 s)"
    assert describe_windows([], open_window=[], window_s=1.0) == "no execution in the window (0 s)"
    windows, current = windows_of(replayed(15, seed=1))
    text = describe_windows(windows[-3:], open_window=current, window_s=1.0)
    assert text.count(" ms (") == 3 and text.count(" ± ") == 3 and "executions" in text, text


# --- repeats near the limit --------------------------------------------------------------------------


def m(p99: float, valid: bool = True, errors: int = 0) -> Measurement:
    return Measurement(speed=1.0, offered_rps=10, duration_s=1, requests=10, errors=errors, error_rate=errors / 10,
                       throughput_rps=10, latency_ms={"p50": p99 / 2, "p99": p99}, send_lag_ms={"p99": 0.1},
                       valid=valid)


def test_a_close_call_is_repeated_until_two_agree_and_the_median_stands():
    sla = SlaSettings(latency_ms=100.0)
    draws = iter([95.0, 130.0, 104.0, 105.0])
    calls = []

    def probe(speed):
        calls.append(speed)
        return m(next(draws))

    result = with_repeats(probe, sla=sla, near=0.15, max_repeats=4, pct=10)(2.0)
    assert len(calls) == 4 and result.repeats == 4  # 130 vs 95 and 104 vs 130 disagreed; 105 vs 104 agreed
    assert result.latency_ms["p99"] == 105.0  # of 95, 104, 105, 130 the slower middle one
    far = with_repeats(lambda s: m(40.0), sla=sla, near=0.15, max_repeats=4, pct=10)(2.0)
    assert far.repeats == 1  # far from the limit: one measurement decides


def test_two_runs_that_straddle_the_limit_fail_it():
    # 107 and 98 agree within 10 %: their median, 102.5, is over the limit, and so is the one that stands
    sla = SlaSettings(latency_ms=100.0)
    draws = iter([107.0, 98.0])
    result = with_repeats(lambda s: m(next(draws)), sla=sla, near=0.15, max_repeats=3, pct=10)(2.0)
    assert result.repeats == 2 and result.latency_ms["p99"] == 107.0
    three = iter([107.0, 80.0, 98.0])  # 107 vs 80 disagree, 80 vs 98 agree: the median of three stands
    assert with_repeats(lambda s: m(next(three)), sla=sla, near=0.15, max_repeats=3, pct=20)(2.0).latency_ms["p99"] == 98.0
    # two that straddle the error budget: the faster one failed requests, the slower held its limit
    runs = iter([m(92.0, errors=1), m(97.0)])
    worse = with_repeats(lambda s: next(runs), sla=sla, near=0.15, max_repeats=3, pct=10)(2.0)
    assert worse.repeats == 2 and worse.errors == 1 and worse.latency_ms["p99"] == 92.0


# --- on a real server ----------------------------------------------------------------------------------


H200 = {"cold_start_factor": "21", "new_shape_ms": "4"}


def repository(tmp: Path, **parameters: str) -> Path:
    repo = tmp / "models"
    shutil.copytree(ROOT / "model_repository_templates" / "encoder_sim", repo / "encoder_sim")
    path = repo / "encoder_sim" / "config.pbtxt"
    config = modelconfig.load(path)
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    path.write_text(modelconfig.to_text(config))
    return repo


def write_study(tmp: Path, repo: Path, name: str = "warm", traffic: dict | None = None, **measurement) -> Path:
    study = {
        "name": name, "model_repository": str(repo), "model": "encoder_sim",
        "traffic": {"path": str(PROFILE), "busiest_s": 8, "speed": 0.25, **(traffic or {})},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 100},
        "measurement": {"window_s": 0.5, "warmup_max_s": 15, **measurement},
        "sla": {"latency_ms": 100, "percentile": 99},
        "cost": {"gpu": "a100-40gb"},
        "search": {"sampler": "grid", "max_batch_size": {"low": 8, "high": 8},
                   "max_queue_delay_microseconds": {"low": 0, "high": 0},
                   "capacity": {"step_duration_s": 1.0, "tolerance": 0.3, "start_speed": 0.5, "max_steps": 3},
                   "top_k": 1, "remeasure_repeats": 1},
        "output": str(tmp / name),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def _compute_ms(server) -> float:
    s = server.statistics("encoder_sim")
    return sum(int(b["compute_infer"]["ns"]) for b in s.get("batch_stats", [])) / max(
        1, sum(int(b["compute_infer"]["count"]) for b in s.get("batch_stats", []))) / 1e6


@pytest.mark.slow
def test_after_the_warm_up_a_cold_server_computes_as_fast_as_a_warm_one(tmp_path, triton_install):
    settings = read_study(write_study(tmp_path, repository(tmp_path, **H200)))
    traffic = read_traffic(PROFILE)
    base = modelconfig.load(Path(settings.model_repository) / "encoder_sim" / "config.pbtxt")
    with LocalLauncher(settings.model_repository, models=["encoder_sim"], install=triton_install) as server:
        server.apply_config("encoder_sim", space.apply(base, {"max_batch_size": 8, "max_queue_delay_microseconds": 0}))
        cold_first = _compute_ms(server)  # nothing ran yet
        warm = warm_up(server, settings, traffic, max_batch_size=8)
        assert cold_first == 0 and warm.stable, warm
        assert warm.sweep_requests >= 8 and warm.sweep_errors == 0 and len(warm.windows_ms) == 3
        values = warm.windows_ms
        assert max(values) / min(values) - 1 <= 0.10
        # the sweep ran every row count up to 8: Triton counted executions of each batch size
        sizes = {int(b["batch_size"]) for b in server.statistics("encoder_sim")["batch_stats"]}
        assert set(range(1, 9)) <= sizes


@pytest.mark.slow
def test_a_server_that_never_settles_is_unstable_not_recommended_and_the_run_finishes(tmp_path, capsys):
    # every execution 3 % slower than the one before: no three windows ever agree within 10 %
    repo = repository(tmp_path, compute_drift_per_execution="0.03")
    # the incumbent at 16, not the template's 64: its batches over 32 rows fail (an emulated out-of-memory),
    # and a model that fails most of its warm-up's requests is judged failing, not unsteady
    path = repo / "encoder_sim" / "config.pbtxt"
    config = modelconfig.load(path)
    config.max_batch_size = 16
    path.write_text(modelconfig.to_text(config))
    # each trial still replays its load after the warm-up gave up: the busiest 2 s at speed 0.14 (83 req/s,
    # the busiest 8 s's 81 req/s at 0.25) make that replay 15 s instead of 32 s
    study = write_study(tmp_path, repo, name="drift", traffic={"busiest_s": 2, "speed": 0.14}, warmup_max_s=6)
    code = main(["tune", str(study), "--quiet"])
    captured = capsys.readouterr()
    assert code == 1, captured.out + captured.err
    summary = json.loads((tmp_path / "drift" / "summary.json").read_text())
    assert summary["best"] is None and summary["trials"]["unstable"] == 2  # the incumbent and batch 8
    assert all(u["outcome"] == "unstable" and "did not settle" in u["reason"] for u in summary["unmeasured"])
    assert "never reached steady state" in captured.err and "measurement.warmup_max_s" in captured.err
    assert not (tmp_path / "drift" / "recommended" / "config.pbtxt").exists()
    trials = pd.read_csv(tmp_path / "drift" / "trials.csv")
    assert (trials["outcome"] == "unstable").all() and (trials["warmup_stable"] == False).all()  # noqa: E712


def test_the_measurement_section_is_checked_by_name(tmp_path):
    from tuner.errors import SettingsError
    from tuner.settings import study_from_dict

    base = {"name": "x", "model_repository": ".", "model": "m", "traffic": {"path": "t.csv"}}
    with pytest.raises(SettingsError, match="measurement.stability_pct: must be > 0"):
        study_from_dict({**base, "measurement": {"stability_pct": 0}})
    with pytest.raises(SettingsError, match="measurement.windoe_s: unknown key"):
        study_from_dict({**base, "measurement": {"windoe_s": 1}})
    assert dataclasses.asdict(study_from_dict(base).measurement) == dataclasses.asdict(MeasurementSettings())


def test_every_window_replays_the_same_busiest_stretch():
    from tuner.traffic import busiest_window
    from tuner.trial.warmup import repeated_stretch

    traffic = read_traffic(PROFILE)
    rep = repeated_stretch(traffic, speed=0.5, window_s=2.0, times=3)
    one = len(rep) // 3
    assert len(rep) == 3 * one and one == busiest_window(traffic, 1.0)[1]  # 2 s at speed 0.5: 1 s recorded
    t = rep["timestamp"].to_numpy()
    assert (t[one:2 * one] - t[:one] == pytest.approx(1.0)) and rep["timestamp"].is_monotonic_increasing
    assert (rep["seq_len"].to_numpy()[:one] == rep["seq_len"].to_numpy()[one:2 * one]).all()


def _stand_in_replay(monkeypatch, walk, *, sent) -> pd.DataFrame:
    """The replay module as the warm-up calls it, on no server: the rows fit, the shape sweep is `sent`,
    and every replay calls `walk(watch)` (its ticks) and ends as a watch-stopped replay (no records).
    Returns a traffic of three rows to warm up with."""
    import tuner.replay as replay_module
    from tuner.replay import ReplayResult

    def replay(endpoints, model, part, *, watch, **kwargs):
        walk(watch)
        return ReplayResult(records=pd.DataFrame(), stats_before=None, stats_after=None, speed=1.0, warmup_s=0.0,
                            duration_s=1.0, mode="local", workers=1, reason="", load_generator_cpu=0.0, stopped=True)

    monkeypatch.setattr(replay_module, "check_fits", lambda *a: None)
    monkeypatch.setattr(replay_module, "send_one_by_one", lambda *a, **k: sent)
    monkeypatch.setattr(replay_module, "replay", replay)
    return pd.DataFrame({"timestamp": [0.0, 0.1, 0.2], "input_length": [64, 64, 64]})


def test_the_windows_failures_are_counted_from_tritons_statistics(tmp_path, monkeypatch):
    """A replay the watch stops keeps no records: the warm-up counts its windows' failures from Triton's
    own counter, and keeps the shape sweep's count and first error beside them."""
    from tuner.replay._sequential import Sent
    from tuner.settings import read_study
    from tuner.trial.warmup import warm_up

    settings = read_study(write_study(tmp_path, repository(tmp_path), window_s=0.1, warmup_max_s=0.2))
    failed, calls = [0], []

    class Launcher:
        endpoints = type("E", (), {"http": "127.0.0.1:9"})()

        def statistics(self, model):
            return {"inference_stats": {"fail": {"count": failed[0]}}, "batch_stats": []}

        def exited(self):
            return False

    def walk(watch):
        # the first replay: two windows of 7 failures each; the loop replays again until warmup_max_s
        for elapsed in (0.1, 0.2) if not calls else ():
            failed[0] += 7
            watch(elapsed)
        calls.append(1)

    traffic = _stand_in_replay(monkeypatch, walk, sent=Sent(10, 3, 0.1, "400: out of memory"))
    warm = warm_up(Launcher(), settings, traffic, max_batch_size=4)
    assert (warm.sweep_errors, warm.first_error) == (3, "400: out of memory")
    assert warm.window_errors == 14 and warm.errors == 17
    assert warm.failures() == "17 requests failed (3 of 10 shape-sweep requests, 14 while replaying the traffic)"
    # 17 of the 24 answered failed (the sweep's 3 of 10, the windows' 14 of 14): the model fails, not unsteady
    assert not warm.stable and warm.failing and "did not settle" not in warm.reason
    assert warm.reason == ("the model failed its requests: 17 of the 24 answered in the warm-up failed (the shape "
                           "sweep and the windows after it); the first error: 400: out of memory")


def test_a_server_that_exits_in_the_windows_ends_the_warm_up_with_an_error_never_as_settled(tmp_path, monkeypatch):
    """The watch that ends the windows once they settle also ends them when the server has exited: by
    raising, at the next tick, so that a dead server never reads as a steady one. Here the stand-in's
    statistics go on counting identical windows after its death (a real launcher's would fail too, but
    the watch does not count on it): read, they would settle at the third tick."""
    from tuner.errors import ServerError
    from tuner.replay._sequential import Sent
    from tuner.settings import read_study
    from tuner.trial.warmup import warm_up

    settings = read_study(write_study(tmp_path, repository(tmp_path), window_s=0.1, warmup_max_s=5))
    ticks = []

    class Launcher:
        name = "stand-in"
        endpoints = type("E", (), {"http": "127.0.0.1:9"})()
        gone = False
        reads = 0

        def statistics(self, model):
            self.reads += 1  # 20 executions of 1 ms between two reads: identical windows
            n = 20 * self.reads
            return {"batch_stats": [{"batch_size": 1, "compute_infer": {"count": n, "ns": n * 1_000_000}}]}

        def exited(self):
            return self.gone

    launcher = Launcher()

    def walk(watch):
        for k in range(1, 50):
            launcher.gone = k > 2  # the server dies after the second tick
            ticks.append(k)
            if watch(k * 0.1):
                break

    traffic = _stand_in_replay(monkeypatch, walk, sent=Sent(10, 0, 0.1, ""))
    with pytest.raises(ServerError, match=r"^the Triton server \(stand-in\) exited during the replay$"):
        warm_up(launcher, settings, traffic, max_batch_size=4)
    assert ticks == [1, 2, 3]  # ended at the first tick after the death


@pytest.mark.slow
def test_a_model_that_fails_its_warm_up_is_judged_failing_not_unsteady_alike_on_the_terminal_and_in_the_summary(
        tmp_path, capsys):
    """crash_stub's stub process exits after 1 execution (inside the shape sweep): Triton stays up and fails
    every request after ("Stub process ... is not healthy."). Each trial is measured and infeasible for the
    model failing, with that first error; the terminal and summary.json say the same, nothing of steady state."""
    repo = tmp_path / "models"
    shutil.copytree(ROOT / "tests" / "data" / "replay_models" / "crash_stub", repo / "crash_stub")
    path = repo / "crash_stub" / "config.pbtxt"
    config = modelconfig.load(path)
    config.max_batch_size = 2
    config.parameters["executions"].string_value = "1"  # the sweep's first request, then none
    path.write_text(modelconfig.to_text(config))
    n = 300  # 50 req/s for 6 s
    pd.DataFrame({"timestamp": np.arange(n) / 50.0, "seq_len": np.arange(n) % 5 + 4}).to_csv(tmp_path / "t.csv",
                                                                                               index=False)
    study = write_study(tmp_path, repo, name="crash", warmup_max_s=3,
                        traffic={"path": str(tmp_path / "t.csv"), "speed": 1.0, "busiest_s": 4})
    data = yaml.safe_load(study.read_text())
    data["model"] = "crash_stub"
    data["replay"]["request_timeout_s"] = 2
    data["search"]["max_batch_size"] = {"low": 2, "high": 2}
    data["search"]["max_queue_delay_microseconds"] = {"low": 1000, "high": 1000}
    study.write_text(yaml.safe_dump(data))
    code = main(["tune", str(study), "--quiet"])
    captured = capsys.readouterr()
    assert code == 3, captured.out + captured.err  # no configuration met the SLA: a verdict
    summary = json.loads((tmp_path / "crash" / "summary.json").read_text())
    assert summary["trials"]["unstable"] == 0 and summary["trials"]["complete"] == 2, summary["unmeasured"]
    assert summary["best"] is None
    message = summary["message"]
    assert "the model failed its requests" in message and "Stub process 'crash_stub_0_0' is not healthy." in message
    assert summary["closest"] is not None and f"\n{message}\n" in captured.out, captured.out + captured.err
    assert "steady" not in captured.out + captured.err and "warmup_max_s" not in captured.out + captured.err
    trials = pd.read_csv(tmp_path / "crash" / "trials.csv")
    assert (trials["outcome"] == "measured").all() and not trials["feasible"].any()
    assert trials["warmup_failing"].all() and trials["sla_reason"].str.contains("is not healthy").all()


def test_a_model_failing_its_requests_is_told_from_a_slow_one_settled_or_not():
    from tuner.trial.warmup import model_failing

    # never settled, most of the sweep's and the windows' requests failed: a stub that died
    assert model_failing(stable=False, failed=60, answered=100, window_errors=40, served=30)
    # settled, yet its windows at the load failed more than they served: errors that come back fast
    assert model_failing(stable=True, failed=300, answered=310, window_errors=290, served=10)
    # settled, half its sweep refused (an out-of-memory at shapes the load never forms), windows fine:
    # the quick start's incumbent (96 of 192 sweep requests failed, none of its windows')
    assert not model_failing(stable=True, failed=96, answered=700, window_errors=0, served=508)
    assert not model_failing(stable=True, failed=96, answered=192, window_errors=0, served=0)
    assert not model_failing(stable=False, failed=10, answered=100, window_errors=5, served=80)  # slow, not failing


def test_the_rule_line_names_every_bound_of_the_rule():
    text = rule_text(MeasurementSettings(stable_windows=4, stability_pct=7.5))
    assert text == ("4 windows of at least 12 executions in a row agreeing on the compute time per execution within "
                    f"3 standard errors (never {MAX_APART * 100:g} % apart) or 7.5 %")
