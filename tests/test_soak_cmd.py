"""`tuner soak`: a long replay against one configuration, on a real Triton with real Locust replays.

- the pieces that need no server: the repeated recording cut into windows, the plan, the failed rows
  put on the largest batches, the capacity projection from a soak's tables, bad flags (one line, exit 2);
- a real soak of the shipped diurnal profile (short windows: seconds) on a private copy of encoder_sim
  with an aggressive fragmentation, restarted in the middle: every window on disk, the drift found,
  the batch sizes that stopped succeeding named, the recovery after the restart, the restart window it
  prints checked against a brute-force scan, the report page, the audit's and the nightly's lines;
- Ctrl-C (SIGINT to a real `python -m tuner soak`): every finished window kept, exit 130, the report
  still renders, no server left behind.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import yaml

from tuner import modelconfig
from tuner.cli import main
from tuner.errors import SettingsError
from tuner.nightly.drift import drift_table
from tuner.nightly.rule import keep
from tuner.nightly.summary import markdown_summary
from tuner.soak import (
    analyze,
    last_soak,
    make_plan,
    read_findings,
    read_meta,
    read_windows,
    restart_windows,
    soak_dir,
)
from tuner.soak.analysis import fixed_mix, split_failures, window_traffic
from tuner.traffic import read_traffic

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "model_repository_templates" / "encoder_sim"
DIURNAL = ROOT / "traffic_profiles" / "diurnal_day_in_10m.csv"


# --- no server ------------------------------------------------------------------------------------


def test_the_recording_repeats_end_to_end_and_each_window_takes_its_stretch():
    traffic = pd.DataFrame({"timestamp": [100.0, 101.0, 102.0, 103.0, 104.0], "seq_len": [1, 2, 3, 4, 5]})
    plan = make_plan(traffic, hours=60 / 3600, speed=1.0, window_minutes=0.1)  # windows of 6 s
    assert plan.cycle_s == 5.0  # the span (4 s) and one mean gap (1 s)
    assert plan.windows == 10 and plan.bounds(0) == (0.0, 6.0) and plan.bounds(9) == (54.0, 60.0)
    part = window_traffic(traffic, 3.0, 12.0, cycle_s=plan.cycle_s)
    assert part["timestamp"].tolist() == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert part["seq_len"].tolist() == [4, 5, 1, 2, 3, 4, 5, 1, 2]
    assert window_traffic(traffic, 0.0, 60.0, cycle_s=plan.cycle_s).shape[0] == 60


def test_the_plan_needs_enough_windows_and_a_restart_inside_the_soak():
    traffic = read_traffic(DIURNAL)
    plan = make_plan(traffic, hours=1, speed=10, window_minutes=0.5, restart_at_hours=0.5)
    assert plan.windows == 12 and plan.window_s == 300
    assert [k for k in range(plan.windows) if plan.restart_before(k)] == [6]
    assert plan.bounds(11)[1] == 3600
    with pytest.raises(SettingsError, match=r"gives 2 window\(s\); the trend test needs at least 6"):
        make_plan(traffic, hours=1, speed=60, window_minutes=0.5)
    with pytest.raises(SettingsError, match=r"0 < restart_at < hours must hold, but got \(restart_at=2, hours=1\)"):
        make_plan(traffic, hours=1, speed=10, window_minutes=0.5, restart_at_hours=2)
    with pytest.raises(SettingsError, match=r"--speed: must be a positive number, got 0"):
        make_plan(traffic, hours=1, speed=0, window_minutes=0.5)


def test_the_fixed_mix_sees_slower_batches_not_a_different_mix_or_fast_failures():
    reference = {1: (100, 5.0), 4: (50, 8.0), 8: (10, 12.0)}  # 380 rows in 1020 ms: 2.68 ms per request
    assert fixed_mix(reference, reference, {}) == pytest.approx(1020 / 380)
    # another mix of the same per-size times: the same figure (per request it would fall with bigger batches)
    assert fixed_mix(reference, {1: (10, 5.0), 4: (20, 8.0), 8: (90, 12.0)}, {}) == pytest.approx(1020 / 380)
    # every size 10 % slower, and the 8s failing fast: 10 % more, the failures left out
    slower = {1: (100, 5.5), 4: (50, 8.8), 8: (10, 0.5)}
    assert fixed_mix(reference, slower, {8: 10}) == pytest.approx(1.1 * 1020 / 380)
    assert math.isnan(fixed_mix(reference, {2: (5, 6.0)}, {}))


def test_failed_rows_fall_on_the_largest_batches():
    histogram = {1: 10, 4: 3, 7: 2, 8: 1}
    assert split_failures(histogram, 15) == {1: (10, 0), 4: (3, 0), 7: (1, 1), 8: (0, 1)}
    assert split_failures(histogram, 0) == {1: (10, 0), 4: (3, 0), 7: (2, 0), 8: (1, 0)}
    # rows that do not make a whole batch of the larger sizes go to a smaller one
    assert split_failures({4: 2, 8: 1}, 4) == {4: (1, 1), 8: (1, 0)}


def _synthetic_windows(n: int = 12, drift_per_hour: float = 0.02, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = np.arange(n) + 0.5
    load = 100 + 20 * np.sin(age)
    compute = 5.0 * (1 + drift_per_hour * age) - 0.01 * (load - 100) + rng.normal(0, 0.02, n)
    return pd.DataFrame({"window": np.arange(n), "segment": 0, "restarted": False, "age_hours": age,
                         "t_hours": age, "offered_rps": load, "requests": 1000, "valid": True,
                         "sla_ok": True, "compute_ms_fixed_mix": compute, "compute_ms_per_request": compute,
                         "latency_p99_ms": 50 + rng.normal(0, 1, n), "error_rate": 0.0})


def test_the_capacity_at_the_start_and_the_compute_trend_project_the_breach():
    meta = {"sla": {"latency_ms": 200, "percentile": 99, "max_error_rate": 0.001}, "window_hours": 1.0,
            "capacity": {"capacity_rps": 150.0, "rate_rps": 100.0}}
    findings = analyze(_synthetic_windows(), pd.DataFrame(), meta)
    assert findings.verdict == "drift"
    breach = findings.analysis.breach
    # capacity 150 falls to 100 when compute time is 1.5x its level: 0.5 / 0.02 = 25 h
    assert breach.figure == "capacity_rps" and breach.hours == pytest.approx(25, rel=0.1)
    assert findings.restart.action == "restart" and findings.restart.every == 20 and findings.restart.unit == "hour"
    flat = analyze(_synthetic_windows(drift_per_hour=0.0), pd.DataFrame(), meta)
    assert flat.verdict == "no drift detected" and flat.analysis.breach is None


def test_a_persistent_sla_break_is_observed_and_a_single_bad_window_is_not():
    meta = {"sla": {"latency_ms": 200, "percentile": 99, "max_error_rate": 0.001}, "window_hours": 1.0}
    blip = _synthetic_windows(drift_per_hour=0.0)
    blip.loc[3, ["sla_ok", "error_rate"]] = [False, 0.01]
    assert analyze(blip, pd.DataFrame(), meta).observed is None
    broken = blip.copy()
    broken.loc[8:, ["sla_ok", "error_rate"]] = [False, 0.02]
    found = analyze(broken, pd.DataFrame(), meta)
    assert found.observed.figure == "error_rate" and found.observed.hours == pytest.approx(8.0)
    assert found.restart.action == "restart" and found.restart.interval_hours <= 0.8 * 8.0


def write_study(tmp: Path, repository: Path, *, speed: float = 2.0, name: str = "soak") -> Path:
    study = {
        "name": name, "model_repository": str(repository), "model": "encoder_sim",
        "traffic": {"path": str(DIURNAL), "speed": speed},
        "replay": {"warmup_s": 0.5, "lag_budget_ms": 100},
        # past the cold start only: the fragmenting model never settles, so warm-up stops at its limit
        "measurement": {"window_s": 0.5, "warmup_max_s": 3.0},
        "sla": {"latency_ms": 200, "percentile": 99, "max_error_rate": 0.001},
        "output": str(tmp / "out"),
    }
    path = tmp / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_each_window_is_measured_to_its_stretchs_end_not_to_its_last_request(tmp_path, capsys):
    """A window's offered rate is its requests per second of the window: the replay is told where the
    window ends (its stretch's end, from its first request), as a trial's step is, whenever the stretch's
    last request is due."""
    from tuner.settings import read_study
    from tuner.soak import _run

    settings = read_study(write_study(tmp_path, TEMPLATE.parent))
    traffic = pd.DataFrame({"timestamp": [0.0, 1.0, 2.0, 10.0, 11.0, 19.5], "seq_len": 8})
    plan = make_plan(traffic, hours=60 / 3600, speed=1.0, window_minutes=0.1)  # windows of 6 s
    asked = []

    def measure(part, speed, warmup, *, duration_s):
        asked.append((float(part["timestamp"].min()), duration_s))
        return {"requests": len(part)}, []

    kind = _run._Kind(measure, lambda: None, ["window", "requests"], ())
    _run._windows(None, settings, kind, plan=plan, traffic=traffic, folder=tmp_path, progress=False)
    capsys.readouterr()
    ends = {start: plan.bounds(k)[1] for k in range(plan.windows) for start in [plan.bounds(k)[0]]}
    assert asked, "no window was replayed"
    for first, duration in asked:
        end = next(e for start, e in ends.items() if start <= first < e)
        assert duration == pytest.approx(end - first)  # at speed 1: seconds of the traffic are wall seconds


@pytest.mark.parametrize("args, message", [
    (["--hours", "0"], "--hours: must be a positive number, got 0.0"),
    (["--hours", "0.02", "--window", "0.5"], "the trend test needs at least 6"),
    (["--hours", "1", "--window", "0.5", "--restart-at", "3"], "0 < restart_at < hours must hold"),
    (["--restart-minutes", "20", "--window", "0.5"], "the restart window must fit in a day of the recording"),
    (["--set", "max_batch_sise=8"], "unknown key 'max_batch_sise'; did you mean max_batch_size? known keys"),
    (["--margin", "1.5"], "--margin: must be a fraction in [0, 1), got 1.5"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, capsys, args, message):
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    assert main(["soak", str(study), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: ") and message in err and "Traceback" not in err, err


def test_a_soak_longer_than_a_month_of_wall_time_is_refused(tmp_path, capsys):
    traffic = read_traffic(DIURNAL)
    with pytest.raises(SettingsError, match=r"--hours 1e\+09 at --speed 1 is .* days of replay; a soak is at most "
                                            r"31 days of wall time \(--hours 744 at this speed\)"):
        make_plan(traffic, hours=1e9, speed=1.0, window_minutes=3)
    assert make_plan(traffic, hours=744 * 10, speed=10.0, window_minutes=3).wall_s == 31 * 24 * 3600
    # refused before anything else is read or started (the --config below, not a config, is never parsed)
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    (tmp_path / "garbage.pbtxt").write_text("not a config {")
    assert main(["soak", str(study), "--hours", "1e9", "--config", str(tmp_path / "garbage.pbtxt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: --hours 1e+09") and "at most 31 days" in err and err.count("\n") == 1


def _short_recording(tmp: Path) -> Path:
    """A study whose recording spans one minute: shorter than the default 5-min restart."""
    path = tmp / "short.csv"
    pd.DataFrame({"timestamp": np.arange(121) * 0.5, "seq_len": 16}).to_csv(path, index=False)
    study = yaml.safe_load(write_study(tmp, ROOT / "model_repository_templates").read_text())
    study["traffic"]["path"] = str(path)
    (tmp / "study.yaml").write_text(yaml.safe_dump(study))
    return tmp / "study.yaml"


def test_a_short_recording_blames_restart_minutes_only_when_given(tmp_path, capsys):
    study = _short_recording(tmp_path)
    args = ["soak", str(study), "--hours", "0.1", "--window", "0.05", "--speed", "10"]
    # the flag not given: the real error is reached and named, not the default restart length
    assert main([*args, "--set", "max_batch_sise=8"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'max_batch_sise'" in err and "--restart-minutes" not in err, err
    # given: the flag is named, with the recording's real length
    assert main([*args, "--restart-minutes", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error: --restart-minutes 2: the restart window must fit") and "short.csv spans 1 min" in err
    # a study that cuts a window of a longer recording: the window is named, not the file (whose hour was
    # said to span a minute)
    data = yaml.safe_load(study.read_text())
    data["traffic"].update(busiest_s=30)
    study.write_text(yaml.safe_dump(data))
    assert main([*args, "--restart-minutes", "2"]) == 2
    err = capsys.readouterr().err
    assert "the study's traffic window (the busiest 30 s of" in err and "short.csv) spans 0.492 min" in err, err


def test_a_recording_shorter_than_the_default_restart_has_no_restart_window():
    traffic = pd.DataFrame({"timestamp": np.arange(121) * 0.5, "seq_len": 16})
    quiet, line = restart_windows(traffic, minutes=None, recording="the recording t.csv")
    assert quiet is None and line.startswith("none: the recording t.csv spans 1 min, shorter than the default 5-min")
    quiet, line = restart_windows(traffic, minutes=0.5)
    assert quiet is not None and quiet.length_s == 30 and line.startswith("the recording's quietest 0.5 min")
    # its soak's findings have no quiet windows, and say why
    meta = {"sla": {"latency_ms": 200, "percentile": 99, "max_error_rate": 0.001}, "window_hours": 1.0,
            "quiet": None}
    findings = analyze(_synthetic_windows(), pd.DataFrame(), meta, traffic=traffic)
    assert findings.analysis.quiet is None and "no restart window: the recording is shorter than the restart" in \
        findings.notes


@pytest.mark.parametrize("kind, reason", [
    ("loop", "cannot read (Too many levels of symbolic links)"),
    ("long", "cannot read (File name too long)"),
    ("directory", "is a directory, not a config.pbtxt"),
    ("missing", "no such file"),
])
def test_an_unreadable_config_names_the_path_and_the_os_reason(tmp_path, capsys, kind, reason):
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    path = {"loop": tmp_path / "loop", "long": tmp_path / ("c" * 300), "directory": tmp_path,
            "missing": tmp_path / "absent.pbtxt"}[kind]
    if kind == "loop":
        path.symlink_to(path)
    assert main(["soak", str(study), "--hours", "0.2", "--window", "0.5", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"tuner: error: --config {path}: {reason}\n"
    assert not (tmp_path / "out").exists()  # nothing started or written


def test_an_earlier_soak_is_kept_unless_replaced(tmp_path, capsys):
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    folder = soak_dir(tmp_path / "out")
    folder.mkdir(parents=True)
    (folder / "soak.json").write_text("{}")  # a soak writes it before its first window
    (folder / "windows.csv").write_text("window\n0\n")
    assert main(["soak", str(study), "--hours", "0.02", "--window", "0.05"]) == 2
    assert "holds an earlier soak; pass --replace" in capsys.readouterr().err
    assert (folder / "windows.csv").read_text() == "window\n0\n"


def test_files_of_a_soaks_names_without_its_soak_json_are_someones_own_even_with_replace(tmp_path, capsys):
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    folder = soak_dir(tmp_path / "out")
    folder.mkdir(parents=True)
    (folder / "windows.csv").write_text("my own data\n")
    assert main(["soak", str(study), "--hours", "0.02", "--window", "0.05", "--replace"]) == 2
    assert "holds windows.csv but no soak.json: not a soak's files (not replaced" in capsys.readouterr().err
    assert (folder / "windows.csv").read_text() == "my own data\n"


@pytest.mark.parametrize("where", ["--output", "study"])
def test_an_output_in_the_models_directory_is_refused_before_anything(tmp_path, capsys, where):
    """As tune refuses it (tuner.study.check_not_in_model): one line, exit 2, nothing made there; the
    study's own `output` the same as --output."""
    repository = tmp_path / "models"
    (repository / "encoder_sim").mkdir(parents=True)
    (repository / "encoder_sim" / "config.pbtxt").write_text((TEMPLATE / "config.pbtxt").read_text())
    study = write_study(tmp_path, repository)
    target = repository / "encoder_sim" / "soak"
    args = ["--output", str(target)]
    if where == "study":
        data = yaml.safe_load(study.read_text())
        data["output"], args = str(target), []
        study.write_text(yaml.safe_dump(data))
    assert main(["soak", str(study), "--hours", "0.02", "--window", "0.05", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"tuner: error: output directory {target}: in the model's directory "
                                 f"{repository / 'encoder_sim'}, which the server loads; refusing to write there\n")
    assert sorted(p.name for p in (repository / "encoder_sim").iterdir()) == ["config.pbtxt"]


# --- a real soak ---------------------------------------------------------------------------------


def fragmenting_repository(tmp: Path, *, per_1k: str, budget: str = "4096", slowdown: str = "1") -> Path:
    """A private copy of encoder_sim with the fragmentation on (the README's way: set in config.pbtxt)."""
    repo = tmp / "models"
    (repo / "encoder_sim" / "1").mkdir(parents=True)
    (repo / "encoder_sim" / "1" / "model.py").write_text((TEMPLATE / "1" / "model.py").read_text())
    config = modelconfig.load(TEMPLATE / "config.pbtxt")
    config.parameters["fragmentation_per_1k_executions"].string_value = per_1k
    config.parameters["fragmentation_slowdown"].string_value = slowdown
    config.parameters["max_padded_tokens"].string_value = budget
    (repo / "encoder_sim" / "config.pbtxt").write_text(modelconfig.to_text(config))
    return repo


def run_cli(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def soaked(tmp_path_factory, triton_install):
    """12 windows of 3 s (12 s of the diurnal profile each at speed 4: its quiet start, about 80 req/s),
    a budget of 4,096 padded tokens losing 60% per 1,000 executions, the server restarted before the
    window at 0.024 h (86 s of traffic).

    Compute time grows by 3x the fraction of the budget lost (fragmentation_slowdown 3): by the
    window before the restart (~1,250 executions, 75% lost) an execution's emulated time is 3.2x its
    fresh value, against 1.75x at the template's 1. At 1 the rise in compute per request (~+20% over
    the segment, the per-execution overhead of the Python backend diluting it) was drowned by a loaded
    2-core machine's window-to-window noise (+-10-15%): the trend read 'no drift detected' and the
    first window after the restart could be slower than the last before it. At 3 the rise was +40% to
    +75% in two runs on a loaded machine (trend p < 2e-5; the window before the restart ~30% above the
    one after it), and the server, ~70% busy at its slowest, still does not saturate (which would grow
    the batches and lower compute per request, hiding the drift).

    max_batch_size 6: the first window cannot run out of memory (6 rows x 512 tokens, the profile's
    longest, fit the budget until a quarter of it is lost, past 400 executions; the first window ends
    near 220), so the errors that come later are the drift's alone. At 16 a stall of a loaded machine
    queued 9 or more requests into one batch and the first window failed (CI, stop 61), where the
    largest batch of a window is otherwise 4 to 7 rows."""
    tmp = tmp_path_factory.mktemp("soak")
    study = write_study(tmp, fragmenting_repository(tmp, per_1k="0.6", slowdown="3"), speed=4.0)
    done = run_cli("soak", str(study), "--set", "max_batch_size=6", "--set", "max_queue_delay_microseconds=8000",
                   "--hours", "0.04", "--window", "0.05", "--restart-at", "0.024", "--no-capacity",
                   "--output", str(tmp / "soak out"), timeout=240)  # a space: the printed command quotes it
    return tmp / "soak out", done


def test_every_window_is_on_disk_with_its_figures(soaked):
    output, done = soaked
    assert done.returncode == 10, done.stdout[-3000:] + done.stderr[-3000:]  # 10: drift detected
    windows = read_windows(soak_dir(output))
    assert windows["window"].tolist() == list(range(12))
    for column in ("t_hours", "age_hours", "offered_rps", "throughput_rps", "latency_p50_ms", "latency_p99_ms",
                   "fill_rate", "compute_ms_per_execution", "compute_ms_per_request", "largest_batch",
                   "errors", "oom_errors", "executions_since_load", "memory_mb"):
        assert windows[column].notna().all(), column
    assert (windows["memory_source"] == "rss").all() and (windows["memory_mb"] > 10).all()
    assert windows["offered_rps"].between(40, 400).all()  # the profile at speed 4: its quiet start
    assert "hours of recorded traffic" in done.stdout and "restart window:" in done.stdout


def test_the_closing_line_names_a_command_that_runs_as_printed(soaked):
    output, done = soaked
    command = re.search(r"`(tuner report [^`]+)` draws it", done.stdout).group(1)
    assert shlex.split(command) == ["tuner", "report", str(output)]


def test_the_drift_is_found_and_the_batches_that_stopped_succeeding_are_named(soaked):
    output, done = soaked
    findings = read_findings(soak_dir(output))
    assert findings["verdict"] == "drift"
    compute = next(t for t in findings["trends"] if t["figure"] == "compute_ms_per_request")
    assert compute["verdict"] == "drift" and compute["direction"] == "up", compute
    batches = findings["batches"]
    assert batches["smallest_failing"] is not None and batches["largest_recent"] < batches["smallest_failing"]
    windows = read_windows(soak_dir(output))
    before = windows[windows["segment"] == 0]
    assert before["oom_errors"].iloc[-1] > 0 and before["oom_errors"].iloc[0] == 0
    print(f"soak: compute per request {compute['relative_per_hour']:+.1%} per hour of traffic; largest batch "
          f"still succeeding {batches['largest_recent']}, {batches['smallest_failing']} and up failed")


def test_the_restart_starts_the_server_afresh_and_the_windows_after_it_recover(soaked):
    output, _ = soaked
    windows = read_windows(soak_dir(output))
    assert windows.loc[windows["restarted"], "window"].tolist() == [8]
    assert windows["segment"].tolist() == [0] * 8 + [1] * 4
    before, after = windows.iloc[7], windows.iloc[8]
    assert after["executions_since_load"] < before["executions_since_load"]
    assert after["age_hours"] < before["age_hours"] and after["t_hours"] > before["t_hours"]
    assert after["compute_ms_per_request"] < before["compute_ms_per_request"]
    assert after["oom_errors"] < before["oom_errors"]


def test_the_printed_restart_window_is_the_recordings_quietest_stretch(soaked):
    _, done = soaked
    start = float(re.search(r"restart window: .*? start \S+ into the day \(at ([0-9.]+) s\)", done.stdout).group(1))
    ts = np.sort(read_traffic(DIURNAL)["timestamp"].to_numpy(dtype=np.float64))
    off = ts - ts[0]
    counts = {s: int(np.count_nonzero((off >= s) & (off < s + 300))) for s in range(0, int(off[-1]) - 300 + 1)}
    fewest = min(counts.values())
    assert counts[int(start)] == fewest and start == min(s for s, n in counts.items() if n == fewest)


def test_the_report_audit_and_nightly_show_the_soak(soaked, capsys):
    output, _ = soaked
    assert main(["report", str(output)]) == 0
    page = (soak_dir(output) / "report.html").read_text()
    assert "Verdict: drift" in page and "hours of recorded traffic" in page and "plotly" in page
    lines = last_soak(output)
    assert lines[0].startswith("last soak (") and ": drift in " in lines[0] and "compute_ms_per_request" in lines[0]
    from tuner.audit import soak_findings

    found = soak_findings(output)
    assert found[0].check == "last soak" and found[0].verdict == "watch"
    summary = markdown_summary(stamp="tonight", model="encoder_sim", decision=keep("nothing better"),
                               production={"max_batch_size": 16}, candidate=None, pairs=[],
                               drift=drift_table(None, read_traffic(DIURNAL)), sla="p99 <= 200 ms",
                               scoring="capacity", soak=lines)
    assert f"- {lines[0]}" in summary


def test_a_soak_with_too_few_usable_windows_is_no_verdict_exit_1_not_no_drift(tmp_path, capsys, monkeypatch):
    # 6 of 8 windows invalid (the load generator's send lag): "not analysed" is no verdict, and a
    # scheduler reading exit 0 took it for "no drift detected"
    import types

    from tuner import soak
    from tuner.soak import SoakFindings

    findings = SoakFindings(analysis=None, restart=None, windows=2, left_out=6, error="2 usable window(s)")
    monkeypatch.setattr(soak, "run_soak", lambda *a, **k: types.SimpleNamespace(findings=findings,
                                                                               folder=tmp_path / "out" / "soak"))
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    assert main(["soak", str(study), "--hours", "0.04", "--window", "0.005", "--no-capacity", "--quiet"]) == 1
    assert "not analysed" in capsys.readouterr().out


def test_ctrl_c_keeps_every_finished_window_and_the_report_renders(tmp_path, triton_install):
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    job = subprocess.Popen([sys.executable, "-m", "tuner", "soak", str(study), "--hours", "0.2", "--window", "0.05",
                            "--no-capacity", "--quiet"], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    windows_csv = soak_dir(tmp_path / "out") / "windows.csv"
    servers = []
    try:
        deadline = time.monotonic() + 120
        while not (windows_csv.exists() and len(windows_csv.read_text().splitlines()) >= 3):
            assert job.poll() is None and time.monotonic() < deadline, "no two finished windows"
            time.sleep(0.3)
        servers = [p for p in psutil.Process(job.pid).children(recursive=True) if p.name() == "tritonserver"]
        os.killpg(job.pid, signal.SIGINT)
        log = job.communicate(timeout=60)[0]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 130, log
    assert "soak interrupted after" in log and "Traceback" not in log
    windows = read_windows(soak_dir(tmp_path / "out"))
    assert len(windows) >= 2 and windows["window"].tolist() == list(range(len(windows)))
    assert windows["compute_ms_per_request"].notna().all()
    assert read_meta(soak_dir(tmp_path / "out"))["interrupted"] is True
    findings = json.loads((soak_dir(tmp_path / "out") / "findings.json").read_text())
    assert findings["interrupted"] is True
    assert servers and not [p for p in servers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert main(["report", str(tmp_path / "out")]) == 0
    page = (soak_dir(tmp_path / "out") / "report.html").read_text()
    assert "the soak was interrupted" in page


def test_a_remote_server_its_launcher_would_refuse_is_refused_before_the_soaks_directory(tmp_path, capsys):
    # the refusal came from the launcher, after the soak's directory was made
    study = write_study(tmp_path, ROOT / "model_repository_templates")
    data = yaml.safe_load(study.read_text())
    data["server"] = {"launcher": "remote", "url": "127.0.0.1:9"}  # nothing answers there
    study.write_text(yaml.safe_dump(data))
    assert main(["soak", str(study), "--hours", "0.1", "--window", "0.5", "--quiet"]) == 2
    assert "cannot reach a Triton server at 127.0.0.1:9" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
