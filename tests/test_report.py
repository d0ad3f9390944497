"""The study report: loading an output directory, the HTML, the CLI, and the page in a real browser."""

from __future__ import annotations

import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from nbclient import NotebookClient

from tuner import export
from tuner.report import figures, load_output, recommendation_line, top_table, write_report
from tuner.report._figures import pareto_front

ROOT = Path(__file__).resolve().parents[1]
_OUTPUTS: dict[str, Path] = {}  # made once per test session

# A small real study: the emulated-GPU template on a real local Triton, the shipped bursty profile
# replayed by Locust, a grid of four configurations after the incumbent, short capacity steps.
STUDY = {
    "name": "report",
    "model_repository": str(ROOT / "model_repository_templates"),
    "model": "encoder_sim",
    "traffic": {"path": str(ROOT / "traffic_profiles" / "bursty_60s.csv"), "busiest_s": 6, "speed": 0.25},
    "replay": {"warmup_s": 0.3, "lag_budget_ms": 25, "workers": 1},  # one Locust process: no calibration
    "measurement": {"window_s": 0.5, "warmup_max_s": 30},
    "sla": {"latency_ms": 100, "percentile": 99, "max_error_rate": 0.001},
    "cost": {"gpu": "a100-40gb", "cloud": "gcp"},
    "search": {
        "sampler": "grid",
        "seed": 1,
        "max_batch_size": {"low": 4, "high": 16, "log": True},
        "max_queue_delay_microseconds": {"low": 0, "high": 2000, "step": 2000},
        "capacity": {"step_duration_s": 1.0, "tolerance": 1.0, "start_speed": 0.5, "max_steps": 2},
        "top_k": 1,
        "remeasure_repeats": 1,
    },
}


def tuned_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output directory of a real `tuner tune` run, made once per test session."""
    if "tuned" not in _OUTPUTS:
        tmp = tmp_path_factory.mktemp("tuned")
        study = tmp / "study.yaml"
        study.write_text(yaml.safe_dump({**STUDY, "output": str(tmp / "out")}))
        result = subprocess.run([sys.executable, "-m", "tuner", "tune", str(study), "--trials", "5", "--quiet"],
                                capture_output=True, text=True, timeout=900, cwd=tmp)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        _OUTPUTS["tuned"] = tmp / "out"
    return _OUTPUTS["tuned"]


def fake_output(tmp_path_factory: pytest.TempPathFactory, trials: int, journal: bool = True) -> Path:
    """A real Optuna study with made-up measurements and per-request records (the benchmark's)."""
    key = f"fake{trials}{'j' if journal else 's'}"
    if key not in _OUTPUTS:
        from benchmarks.report_bench import build_output
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        _OUTPUTS[key] = build_output(tmp_path_factory.mktemp(key) / "out", trials, journal=journal)
    return _OUTPUTS[key]


@pytest.fixture(scope="session")
def output_dir(tmp_path_factory: pytest.TempPathFactory, triton_install) -> Path:
    return tuned_output(tmp_path_factory)


@pytest.fixture(scope="session")
def report(output_dir: Path) -> Path:
    return write_report(output_dir)


def _copy(src: Path, dst: Path, keep: tuple[str, ...]) -> Path:
    dst.mkdir()
    for name in keep:
        if (src / name).is_dir():
            shutil.copytree(src / name, dst / name)
        elif (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


@pytest.mark.slow
def test_load_output_reads_what_tuner_tune_wrote(output_dir: Path) -> None:
    out = load_output(output_dir)
    csv = pd.read_csv(output_dir / "trials.csv")
    assert len(out.trials) == len(csv) == 5
    assert out.study is not None and len(out.study.trials) == len(csv)
    assert out.storage_url == f"sqlite:///{output_dir / 'study.db'}"
    assert {"max_batch_size", "max_queue_delay_microseconds"} <= set(out.params)
    assert out.trials["feasible"].dtype == bool and out.trials["feasible"].any()
    assert out.trials.loc[out.trials["feasible"], "latency_p99_ms"].max() <= out.sla["latency_ms"]
    assert out.trials["requests_per_dollar"].max() == pytest.approx(csv["requests_per_dollar"].max())
    assert out.incumbent_config and "max_batch_size: 64" in out.incumbent_config
    traffic = json.loads((output_dir / "summary.json").read_text())["traffic"]
    assert out.traffic is not None and out.peak_rps() == traffic["peak_rps"]
    # the mean at the study's speed beside the busiest second at it (the recording's own mean is at speed 1)
    assert traffic["load_mean_rps"] == pytest.approx(traffic["mean_rps"] * traffic["speed"])
    assert traffic["load_mean_rps"] <= traffic["peak_rps"]


def test_per_request_records_give_the_latency_cdfs(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = load_output(fake_output(tmp_path_factory, 24))
    assert set(out.latency_records) >= {"incumbent"} and len(out.latency_records) == 4
    fig = figures.latency_cdfs(out)
    assert len(fig.data) == 4 and not any("percentiles" in trace.name for trace in fig.data)
    assert all(trace.y[-1] == 1.0 for trace in fig.data)


def test_the_top_trials_table_says_its_latency_is_at_the_recorded_load(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    out = load_output(fake_output(tmp_path_factory, 24))
    top = top_table(out, 3)
    best = out.top_trials(3)
    assert "latency_p99_ms" not in top.columns
    assert list(top["latency p99 ms at the recorded load"]) == list(best["latency_p99_ms"].round(2))
    assert list(top.index) == list(best["number"])
    # in the report: the score as the headline prints it, whole and with commas
    from tuner.report._html import _top_html

    html = _top_html(out)
    first = float(best["requests_per_dollar"].iloc[0])
    assert f"<td>{first:,.0f}</td>" in html and f"{round(first, 2)}<" not in html


def test_parameter_importance_from_optuna(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = load_output(fake_output(tmp_path_factory, 24))
    fig = figures.param_importance(out)
    assert fig is not None and set(fig.data[0].y) == {"max_batch_size", "max_queue_delay_microseconds"}
    importance = dict(zip(fig.data[0].y, fig.data[0].x, strict=True))
    assert importance["max_batch_size"] > importance["max_queue_delay_microseconds"]  # as the fake model makes it


@pytest.mark.slow
def headline_start(summary: dict) -> str:
    """How the report's headline starts for this study's verdict (tuner.report._html.recommendation_line):
    a best that is the incumbent, or that cannot be told apart from it, is a "keep the incumbent"."""
    if summary["best"]["trial"] == (summary.get("incumbent") or {}).get("trial"):
        return "Keep the incumbent: max_batch_size="
    if summary.get("keep_incumbent"):
        return "Keep the incumbent: the best measured, max_batch_size="
    return "Recommended: max_batch_size="


def test_report_is_one_offline_file_with_the_recommendation(output_dir: Path, report: Path) -> None:
    assert report == output_dir / "report.html"
    text = report.read_text()
    summary = json.loads((output_dir / "summary.json").read_text())
    line = recommendation_line(load_output(output_dir))
    assert f"max_batch_size={summary['best']['params']['max_batch_size']}" in line
    assert line.startswith(headline_start(summary)), line
    if headline_start(summary).startswith("Keep"):
        assert summary["best"]["trial"] == summary["incumbent"]["trial"] or "cannot be told apart" in line
    elif summary["improvement"] is not None:
        assert f"{summary['improvement']:+.1%} over the incumbent" in line
    else:
        assert "the incumbent did not meet the SLA" in line
    # as the page writes it, HTML-escaped ("the measurements' uncertainty": &#x27;)
    assert html.escape(line) in text or html.escape(line).replace("—", "&mdash;") in text
    # and the command that measures its deciding step again
    command = export.check_command(summary, str(output_dir))
    assert command and f"Check it again: <code>{html.escape(command)}</code>" in text
    # plotly.js inlined exactly once; nothing fetched from the network
    assert text.count("plotly.js v") == 1
    assert '<script src="http' not in text and "cdn.plot.ly" not in text.split("plotly.js v")[0]
    assert text.count('class="plotly-graph-div"') >= 6
    # the config diff: the incumbent's value of each changed field out, the recommended one in
    changed = {k: v for k, v in summary["best"]["params"].items() if summary["incumbent"]["params"].get(k) != v}
    diff = text.split("config.pbtxt: incumbent")[1]
    for key, value in changed.items():
        assert re.search(rf"<span class='add'>\+\s*{key}: {value}</span>", diff), (key, value)
    if not changed:
        assert "no differences" in text
    # the winner's batch histogram: its search trial's at capacity, the legend's fill rate that of its bars
    assert "Batch sizes dispatched in the search (fill rate: of the bars drawn)" in text
    assert f"(trial {summary['best']['trial']} in the search, at capacity)" in text


def test_pareto_front_keeps_only_undominated_trials() -> None:
    frame = pd.DataFrame({"lat": [10, 20, 30, 15, 40], "requests_per_dollar": [5, 8, 7, 4, 9]})
    front = pareto_front(frame, "lat")
    assert front["lat"].tolist() == [10, 20, 40]


def test_report_of_a_few_trials_says_why_importance_is_missing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out_dir = fake_output(tmp_path_factory, trials=3, journal=False)
    text = write_report(out_dir).read_text()
    assert "parameter importance needs at least 4 complete trials" in text


@pytest.mark.slow
def test_missing_extras_become_notes(output_dir: Path, tmp_path: Path) -> None:
    bare = _copy(output_dir, tmp_path / "bare", ("summary.json", "trials.csv"))
    summary = json.loads((bare / "summary.json").read_text())
    del summary["storage"], summary["traffic"], summary["study_file"]
    (bare / "summary.json").write_text(json.dumps(summary))
    text = write_report(bare).read_text()
    for note in (
        "no Optuna storage",
        "the traffic profile was not found",
        "recommended/config.pbtxt is missing",
        "incumbent/config.pbtxt was not found",
        "drawn through the measured percentiles",
    ):
        assert note in text
    assert text.count('class="plotly-graph-div"') >= 4


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_writes_the_report_finding_the_storage_in_the_directory(output_dir: Path, tmp_path: Path) -> None:
    keep = ("summary.json", "trials.csv", "recommended", "incumbent", "study.db", "records")
    copy = _copy(output_dir, tmp_path / "copy", keep)
    summary = json.loads((copy / "summary.json").read_text())
    del summary["storage"], summary["study_name"]
    (copy / "summary.json").write_text(json.dumps(summary))
    before = {p: p.stat().st_mtime_ns for p in copy.rglob("*") if p.is_file()}
    result = _tuner("report", str(copy))
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == copy / "report.html" and (copy / "report.html").stat().st_size > 1e6
    assert "Search history (Optuna)" in (copy / "report.html").read_text()
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # nothing of the study touched


@pytest.mark.slow
def test_report_of_a_study_where_nothing_met_the_sla(output_dir: Path, tmp_path: Path) -> None:
    copy = _copy(output_dir, tmp_path / "none", ("summary.json", "trials.csv", "study.db"))
    summary = json.loads((copy / "summary.json").read_text())
    summary["best"], summary["improvement"] = None, None
    (copy / "summary.json").write_text(json.dumps(summary))
    text = write_report(copy).read_text()
    assert "No configuration met the SLA (latency p99 ≤ 100 ms)" in text


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: None, "not a study output directory: summary.json is missing"),
        # a study begun here and interrupted: said as one, with the way to finish it
        (lambda d: (d / "study.db").write_bytes(b"x"),
         "the study begun here is not finished (summary.json is not written yet): run the same `tuner tune` again"),
        (
            lambda d: (d / "summary.json").write_text("{nope") and (d / "trials.csv").write_text("a\n1\n"),
            "summary.json: not valid JSON",
        ),
        (
            lambda d: (d / "summary.json").write_text("{}") and (d / "trials.csv").write_text("a\n1\n"),
            "summary.json: key 'best' is missing",
        ),
    ],
)
def test_cli_rejects_a_directory_that_is_not_a_study_output(tmp_path: Path, make, message: str) -> None:
    make(tmp_path)
    result = _tuner("report", str(tmp_path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "report.html").exists()


def test_cli_rejects_a_missing_directory(tmp_path: Path) -> None:
    result = _tuner("report", str(tmp_path / "nowhere"))
    # said by tuner.paths, which checks every command's path arguments before the work
    # (OUTPUT_DIR or AUDIT.json: either would do)
    assert result.returncode == 2 and "nowhere: no such file or directory" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# --- the page in a real browser ---------------------------------------------------------------

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


class DevTools:
    """A minimal DevTools protocol client: send commands, keep every event seen."""

    def __init__(self, ws_url: str) -> None:
        import websocket  # websocket-client

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.events: list[dict] = []
        self._id = 0

    def call(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(method)
            self.events.append(json.loads(self.ws.recv()))

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def errors(self) -> list[str]:
        found = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params["exceptionDetails"])[:300])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"{params['entry'].get('url', '')}: {params['entry']['text']}")
        return found


@pytest.fixture
def chromium(tmp_path: Path):
    binary = shutil.which("chromium")
    if binary is None:
        if os.environ.get("TUNER_REQUIRE_ALL"):
            pytest.fail("chromium is not installed (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    profile = tmp_path / "profile"
    profile.mkdir()
    proc = subprocess.Popen(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert proc.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            pages = [t for t in json.load(response) if t["type"] == "page"]
        devtools = DevTools(pages[0]["webSocketDebuggerUrl"])
        yield devtools
        devtools.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_report_renders_in_chromium_without_console_errors(report: Path, chromium: DevTools) -> None:
    for domain in ("Page", "Runtime", "Log"):
        chromium.call(f"{domain}.enable")
    chromium.call(
        "Emulation.setDeviceMetricsOverride", width=1200, height=900, deviceScaleFactor=1, mobile=False
    )
    chromium.call("Page.navigate", url=report.as_uri())
    chromium.wait_for("Page.loadEventFired")
    # a plot counts once plotly has drawn at least one trace into its SVG
    plots = "Array.from(document.querySelectorAll('.js-plotly-plot')).filter(p => p.querySelector('.main-svg .trace')).length"
    deadline = time.monotonic() + 20
    while chromium.evaluate(plots) < 6 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert chromium.evaluate(plots) >= 6
    assert chromium.evaluate("document.querySelectorAll('.js-plotly-plot').length") >= 6
    line = chromium.evaluate("document.getElementById('recommendation').innerText")
    assert line.startswith(headline_start(json.loads((report.parent / "summary.json").read_text()))), line
    assert chromium.errors() == []
    height = chromium.evaluate("document.documentElement.scrollHeight")
    chromium.call(
        "Emulation.setDeviceMetricsOverride", width=1200, height=height, deviceScaleFactor=1, mobile=False
    )
    shot = chromium.call("Page.captureScreenshot", format="png")["data"]
    import base64

    png = report.with_name("report.png")
    png.write_bytes(base64.b64decode(shot))
    assert png.stat().st_size > 100_000  # a page of plots, not a blank one
    print(f"screenshot: {png}")


# --- the simulated landscape (simulation.csv beside the study) -----------------------------------------


def _simulated(out_dir: Path, *, capacity: float = 1.1, latency: float = 0.9, infeasible: int | None = None
               ) -> pd.DataFrame:
    """A synthetic simulation.csv over the fake study's whole space (max_batch_size 1..64 x delays
    0..20 ms by 0.5 ms): a measured configuration gets its measurement times `capacity` (and its
    latency times `latency`), the rest a smooth made-up curve; trial `infeasible` misses the SLA."""
    trials = pd.read_csv(out_dir / "trials.csv")
    measured = {(int(r.max_batch_size), int(r.max_queue_delay_microseconds)): r
                for r in trials[trials["state"] == "COMPLETE"].itertuples()}
    rows = []
    for mbs in range(1, 65):
        for delay in range(0, 20001, 500):
            r = measured.get((mbs, delay))
            cap = r.capacity_rps * capacity if r is not None and r.feasible else 40.0 * mbs ** 0.5
            feasible = r.feasible if r is not None else True
            if r is not None and r.number == infeasible:
                feasible = False
            rows.append({"rank": 0, "max_batch_size": mbs, "max_queue_delay_microseconds": delay,
                         "preferred_batch_size": "default", "instance_count": 1, "max_queue_size": 0,
                         "feasible": feasible, "capacity_rps": cap if feasible else 0.0,
                         "latency_p99_ms": (r.latency_p99_ms if r is not None else 50.0) * latency,
                         "fill_rate": r.fill_rate if r is not None else 0.5,
                         "score_capacity": cap * 3600 / 2.5 if feasible else None,
                         "score_utilization": cap * 7200 / 2.5 if feasible else None})
    frame = pd.DataFrame(rows)
    frame.to_csv(out_dir / "simulation.csv", index=False)
    return frame


def test_a_simulation_beside_the_study_adds_its_landscape_and_simulated_vs_measured(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
) -> None:
    from tuner.report import simulation_line, simulation_table

    plain = fake_output(tmp_path_factory, 24)
    text = write_report(_copy(plain, tmp_path / "plain", ("summary.json", "trials.csv", "study.db"))).read_text()
    assert "Simulated landscape" not in text and "simulation.csv" not in text  # without the file: as before

    copy = shutil.copytree(plain, tmp_path / "simulated")
    trials = pd.read_csv(copy / "trials.csv")
    complete = trials[trials["state"] == "COMPLETE"]
    wrong = int(complete[complete["feasible"]]["number"].iloc[0])
    _simulated(copy, infeasible=wrong)
    out = load_output(copy)
    assert out.simulation is not None and len(out.simulation) == 64 * 41

    fig = figures.simulated_landscape(out)
    heat, marks = fig.data[0], fig.data[1]
    assert heat.type == "heatmap" and np.asarray(heat.z).shape == (41, 64)
    assert len(marks.x) == len(complete)  # every measured trial is on the map
    table = simulation_table(out)
    assert len(table) == len(complete)
    both = table[table["feasible (measured / simulated)"] == "yes / yes"]
    assert len(both) and (both["capacity error"] == "+10.0%").all()
    assert (table["p99 error"] == "-10.0%").all() and (table["fill rate error"] == "+0.0%").all()
    assert table.loc[wrong, "feasible (measured / simulated)"] == "yes / no"
    # the model strategy's rule (tuner.search.relative_error): a verdict the server refutes is a 100 % error
    assert table.loc[wrong, "capacity error"] == "-100.0%"
    line = simulation_line(out)
    assert f"capacity within 10.0% (median absolute error over the {len(both)} feasible in both)" in line
    assert f"the SLA verdict agrees on {len(complete) - 1} of {len(complete)}" in line

    text = write_report(copy).read_text()
    assert "<h2>Simulated landscape</h2>" in text and "<h2>Simulated vs measured</h2>" in text
    assert text.index("Parameters tried") < text.index("Simulated landscape") < text.index("Latency at capacity")
    assert text.count("plotly.js v") == 1 and html_escape(line) in text

    # a model-strategy study judged its simulation itself (brackets, its fine ranking): the report quotes
    # that verdict, the line the run printed, and does not judge again by the table's rules
    info = {"measured": [{}] * 3, "threshold": 0.15, "median_error": 0.0, "compared": 3, "left_out": 0,
            "infeasible_measured": 0, "spearman": 1.0, "pairs": 3, "discordant": 0, "fallback": False}
    summary = json.loads((copy / "summary.json").read_text())
    summary.pop("storage", None)  # the copy's own study.db, not the shared output's
    (copy / "summary.json").write_text(json.dumps(summary))
    own = load_output(copy)
    assert str(copy.resolve()) in own.storage_url
    own.study.set_user_attr("model_search", info)
    judged = simulation_line(load_output(copy))
    assert ("as the model strategy judged it: simulation error on the 3 measured configurations: median 0.0% "
            "(within search.model_error 15%); order: Spearman 1.00, 0 of 3 pairs") in judged
    assert "capacity within 10.0%" not in judged and f"agrees on {len(complete) - 1} of {len(complete)}" in judged


def test_a_simulation_csv_the_report_cannot_use_is_a_note(tmp_path_factory: pytest.TempPathFactory,
                                                         tmp_path: Path) -> None:
    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "bad")
    _simulated(copy).drop(columns=["capacity_rps"]).to_csv(copy / "simulation.csv", index=False)
    text = write_report(copy).read_text()
    assert "Simulated landscape" not in text
    assert "simulation.csv: no column &#x27;capacity_rps&#x27;" in text


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


# --- notebooks/analyze_study.ipynb runs top to bottom against the same study ---------------------------

NOTEBOOK = ROOT / "notebooks" / "analyze_study.ipynb"
PLOTLY = "application/vnd.plotly.v1+json"


@pytest.mark.slow
def test_analyze_study_notebook_runs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                                     tmp_path: Path, triton_install) -> None:
    output_dir = tuned_output(tmp_path_factory)  # the real `tuner tune` study the report tests read
    monkeypatch.setenv("TUNER_STUDY_DIR", str(output_dir))  # the kernel inherits the environment
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"study output: {output_dir.resolve()}" in text
    assert headline_start(json.loads((output_dir / "summary.json").read_text())) in text
    plots = [o for o in outputs if o.output_type == "display_data" and PLOTLY in o.get("data", {})]
    assert len(plots) >= 6
    tables = [o for o in outputs if "text/html" in o.get("data", {}) and "<table" in o["data"]["text/html"]]
    assert len(tables) >= 5


def test_a_generative_summarys_sla_is_its_token_limit_and_none_is_no_limit() -> None:
    from tuner.report._load import sla_of

    # a generative study's summary: its encoder latency limit is none, its TTFT limit the one drawn
    assert sla_of({"sla": {"latency_ms": None, "ttft_ms": 1000.0, "percentile": 99}})["latency_ms"] == 1000.0
    assert math.isnan(sla_of({"sla": {"latency_ms": None}})["latency_ms"])
    assert sla_of({"sla": {"latency_ms": 100.0}})["latency_ms"] == 100.0


# --- what the figures and the header quote agrees with what they draw (the figures audit) ----------------

def _summary_edit(out_dir: Path, edit) -> None:
    summary = json.loads((out_dir / "summary.json").read_text())
    edit(summary)
    (out_dir / "summary.json").write_text(json.dumps(summary))


def test_the_batch_chart_quotes_the_fill_rate_of_the_bars_it_draws(tmp_path_factory: pytest.TempPathFactory,
                                                                   tmp_path: Path) -> None:
    # as `tuner tune` writes it: the summary's fill rate is the re-measurement's median, whose repeats keep
    # no histogram, so the bars are the search trial's, measured once
    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    searched = load_output(copy)
    fills = {}
    for which in ("incumbent", "best"):
        number = searched.summary[which]["trial"]
        hist = {int(k): int(v) for k, v in searched.trial_attr(number, "batch_histogram").items()}
        mbs = searched.summary[which]["params"]["max_batch_size"]
        fills[which] = sum(s * c for s, c in hist.items()) / sum(hist.values()) / mbs

    def remeasured(summary: dict) -> None:
        for which in ("incumbent", "best"):
            del summary[which]["batch_histogram"]
            summary[which]["fill_rate"] = fills[which] + 0.05  # the re-measurement read another fill rate
            summary[which]["repeats"] = {"values": [1.0, 1.0]}

    _summary_edit(copy, remeasured)
    out = load_output(copy)
    fig = figures.batch_histograms(out)
    assert len(fig.data) == 2
    for trace, which in zip(fig.data, ("incumbent", "best"), strict=True):
        mbs = out.summary[which]["params"]["max_batch_size"]
        drawn = sum(x * y for x, y in zip(trace.x, trace.y, strict=True)) / mbs  # the bars' shares
        assert drawn == pytest.approx(fills[which])
        assert f"fill rate {fills[which]:.2f}" in trace.name, trace.name
        assert f"trial {out.summary[which]['trial']}" in trace.name  # which measurement the bars are
    # the title says the bars are the search's, not the re-measurement the table quotes
    assert "search" in fig.layout.title.text and "re-measurement" in fig.layout.title.text


def test_the_latency_cdfs_draw_each_configuration_once_and_say_the_repeats_are_pooled(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    top = [int(n) for n in load_output(copy).top_trials(3)["number"]]
    records = copy / "records"
    # as `tuner tune` writes them (export.write_latency_records): each file two repeats' requests, and the
    # incumbent, here among the top three, under its trial's name too
    for number in top:
        frame = pd.read_parquet(records / f"trial_{number}.parquet")
        frame["repeat"] = np.arange(len(frame)) % 2
        frame.to_parquet(records / f"trial_{number}.parquet")
    shutil.copy(records / f"trial_{top[1]}.parquet", records / "incumbent.parquet")
    _summary_edit(copy, lambda s: s["incumbent"].update(trial=top[1]))
    out = load_output(copy)
    assert sorted(out.latency_records) == sorted(["incumbent", f"trial {top[0]}", f"trial {top[2]}"])
    fig = figures.latency_cdfs(out)
    names = [trace.name for trace in fig.data]
    assert len(names) == 3 and names[0].startswith("incumbent") and not any(f"trial {top[1]}" in n for n in names)
    assert all("2 repeats pooled" in n for n in names), names
    assert "the table's p99 is the median of the repeats' p99" in fig.layout.title.text


def _audited(summary: dict) -> None:
    """The quick start's figures as the audit read them: the load at speed 4 (a mean of 10.25 req/s,
    a busiest second of 238), one server of either configuration enough."""
    summary["traffic"].update(speed=4, peak_rps=238.0, load_mean_rps=10.246, mean_rps=2.5615)
    summary["price_per_hour"] = 3.4
    for which, capacity, speed, busiest in (("incumbent", 18.0, 7.027, 418.0), ("best", 22.4, 8.745, 520.0)):
        summary[which].update(capacity_rps=capacity, capacity_speed=speed, servers_needed=1, monthly_cost=2482.0,
                              capacity_bracket={"lower_rps": capacity, "peak_rps": busiest})


def test_the_servers_line_says_which_rate_is_the_mean_and_which_the_busiest_second(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    from tuner.report import comparison_table
    from tuner.report._html import _facts
    from tuner.score import servers_needed

    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    _summary_edit(copy, _audited)
    out = load_output(copy)
    facts = _facts(out)
    assert "(mean 10.2 req/s, busiest second 238 req/s): 1 → 1 servers" in facts, facts
    table = comparison_table(out)
    assert table.loc["capacity: mean (req/s)", "recommended"] == "22.4"
    assert table.loc["capacity: busiest second (req/s)", "recommended"] == "520"
    title = figures.cost_bars(out).layout.title.text
    assert "mean 10.2 req/s" in title and "busiest second 238 req/s" in title

    # a summary without the tuner's own count: the load's mean rate over the capacity's, as the tuner
    # counts (tuner.score.servers_needed of the two speeds), never the busiest second over a mean rate
    _summary_edit(copy, lambda s: [s[w].pop("servers_needed") for w in ("incumbent", "best")])
    assert load_output(copy).servers_and_cost("best")[0] == servers_needed(10.246, 22.4) == 1


def test_the_report_writes_the_price_as_the_exported_config_does(tmp_path_factory: pytest.TempPathFactory,
                                                                 tmp_path: Path) -> None:
    from tuner.report._html import _facts

    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    _summary_edit(copy, _audited)
    facts = _facts(load_output(copy))
    assert "price $3.4/h ·" in facts and "server-hour" not in facts, facts


# --- a trial the measurement could not judge (unstable, unmeasured): no verdict, never infeasible --------

def _unstable(out_dir: Path, numbers: list[int], *, without_latency: int) -> None:
    """As `tuner tune` writes an unstable trial: stored as failed, outcome `unstable`, not feasible, no
    score, its latency at the load kept (trial `without_latency`: the server never settled, none)."""
    trials = pd.read_csv(out_dir / "trials.csv")
    trials["outcome"] = np.where(trials["state"] == "COMPLETE", "measured", "")
    rows = trials["number"].isin([*numbers, without_latency])
    trials.loc[rows, ["state", "outcome", "feasible"]] = ["FAIL", "unstable", False]
    trials.loc[rows, ["requests_per_dollar", "score_capacity", "score_utilization"]] = np.nan
    trials.loc[trials["number"] == without_latency, [c for c in trials if c.startswith("latency_")]] = np.nan
    trials.to_csv(out_dir / "trials.csv", index=False)
    _summary_edit(out_dir, lambda s: s["trials"].update(
        total=len(trials), complete=int((trials["state"] == "COMPLETE").sum()), unstable=int(rows.sum()),
        failed=int((trials["state"] == "FAIL").sum() - rows.sum())))


def test_unstable_trials_are_counted_and_drawn_as_no_verdict_not_as_infeasible(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    from tuner.report._html import _facts

    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    complete = pd.read_csv(copy / "trials.csv").query("state == 'COMPLETE' and feasible")["number"]
    summary = json.loads((copy / "summary.json").read_text())
    kept = {summary["best"]["trial"], summary["incumbent"]["trial"]}
    unstable = [int(n) for n in complete if n not in kept][:3]
    _unstable(copy, unstable[:2], without_latency=unstable[2])
    out = load_output(copy)

    facts = _facts(out)
    assert "3 unstable (no verdict)" in facts and f"trials: {len(out.trials)} (" in facts, facts
    # a trial an interruption stopped, measured again on resume: said as such, not as a failure
    out.summary["trials"]["interrupted"] = 1
    assert "1 interrupted (measured again)" in _facts(out)

    fig = figures.trials_scatter(out)
    drawn = {t.name: [int(re.match(r"trial (\d+)", h).group(1)) for h in t.text] for t in fig.data if t.text}
    assert sorted(drawn["no verdict (unstable), no score"]) == sorted(unstable[:2]), drawn
    assert not any(n in unstable for name, ns in drawn.items() if "infeasible" in name for n in ns)
    assert all("unstable: no verdict" in h and "capacity not measured" in h
               for t in fig.data if t.name.startswith("no verdict") for h in t.text)
    assert "1 of them with no verdict" in fig.layout.title.text, fig.layout.title.text

    fig = figures.param_map(out)
    marks = {t.name: [int(re.match(r"trial (\d+)", h).group(1)) for h in t.text] for t in fig.data}
    assert sorted(marks["no verdict (unstable)"]) == sorted(unstable), marks
    assert not set(unstable) & {n for name, ns in marks.items() if name != "no verdict (unstable)" for n in ns}
    assert "no verdict" in fig.layout.title.text

    assert "3 unstable (no verdict)" in write_report(copy).read_text()


def test_a_re_measurement_that_lost_a_repeat_says_how_many_were_measured_and_pooled(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    from tuner.report import comparison_table

    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    out = load_output(copy)
    best = out.summary["best"]["trial"]
    other = next(int(n) for n in out.top_trials(3, incumbent=False)["number"] if n != best)
    records = copy / "records"
    # as `tuner tune` writes them after a Ctrl-C'd, resumed re-measurement: the lost repeat (0) has no
    # records and no value; the other trial lost one of three
    for stem, kept in ((f"trial_{best}", [1]), ("incumbent", [0, 1]), (f"trial_{other}", [0, 2])):
        frame = pd.read_parquet(records / f"{stem}.parquet")
        frame["repeat"] = np.array(kept)[np.arange(len(frame)) % len(kept)]
        frame.to_parquet(records / f"{stem}.parquet")

    def lost(summary: dict) -> None:
        summary["best"]["repeats"] = {"values": [summary["best"]["requests_per_dollar"]], "unmeasured_runs": 1}
        summary["incumbent"]["repeats"] = {"values": [1.0, 1.0], "unmeasured_runs": 0}
        summary["top"] = [{"trial": other, "repeats": {"values": [1.0, 1.0], "unmeasured_runs": 1}}]

    _summary_edit(copy, lost)
    out = load_output(copy)
    names = [t.name for t in figures.latency_cdfs(out).data]
    assert f"trial {best} (1 of 2 repeats pooled)" in names, names
    assert f"trial {other} (2 of 3 repeats pooled)" in names and "incumbent (2 repeats pooled)" in names, names
    table = comparison_table(out)
    assert table.loc["repeats measured", "recommended"] == "1 of 2", table
    assert table.loc["repeats measured", "incumbent"] == "2 of 2"
    marks = [t.name for t in figures.trials_scatter(out).data]
    assert "recommended (re-measured: 1 of 2 repeats measured)" in marks and "incumbent (re-measured)" in marks
    assert "(the median of 1 of 2 repeats measured)" in recommendation_line(out)


def test_sla_percentile_100_draws_and_tabulates_the_max(tmp_path_factory: pytest.TempPathFactory,
                                                       tmp_path: Path) -> None:
    from tuner.report import simulation_table

    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    _summary_edit(copy, lambda s: s["sla"].update(percentile=100.0))
    _simulated(copy)  # a simulation keeps p50, p95 and p99: no max to compare with
    out = load_output(copy)
    trials = pd.read_csv(copy / "trials.csv").set_index("number")

    fig = figures.trials_scatter(out)
    assert "max" in fig.layout.xaxis.title.text, fig.layout.xaxis.title.text
    for trace in fig.data:
        for x, hover in zip(trace.x, trace.text or (), strict=False):
            number = int(re.match(r"trial (\d+)", hover).group(1))
            assert x == pytest.approx(trials.loc[number, "latency_max_ms"])  # the max, not the p99
    marks = {t.name: t.x[0] for t in fig.data if t.name in ("incumbent", "recommended")}
    assert marks == {"incumbent": out.summary["incumbent"]["latency_ms"]["max"],
                     "recommended": out.summary["best"]["latency_ms"]["max"]}

    table = simulation_table(out)
    number = table.index[0]
    assert table.loc[number, "max at load measured (ms)"] == f"{trials.loc[number, 'latency_max_ms']:,.1f}"
    assert (table["max at load simulated (ms)"] == "n/a").all() and (table["max error"] == "n/a").all()


def test_simulated_vs_measured_judges_capacity_as_the_model_strategy_did(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    from tuner.report import simulation_line, simulation_table
    from tuner.search import relative_error

    # as a model-strategy study writes them: each capacity a bracket (capacity_upper_rps 20 % above), the
    # simulation's finest estimate its ranking's (ranking_capacity_rps), the strategy's verdict 0 error
    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    trials = pd.read_csv(copy / "trials.csv")
    trials["capacity_upper_rps"] = trials["capacity_rps"] * 1.2
    trials.to_csv(copy / "trials.csv", index=False)
    sim = _simulated(copy, capacity=1.02)  # the coarse capacity 2 % above the bracket's lower edge
    measured = {(int(r.max_batch_size), int(r.max_queue_delay_microseconds)): r for r in trials.itertuples()
                if r.state == "COMPLETE" and r.feasible}
    above = next(iter(measured))  # one configuration the simulation puts above its bracket, by 10 %
    sim["ranking_capacity_rps"] = [
        measured[k].capacity_rps * (1.32 if k == above else 1.1) if k in measured else c
        for k, c in zip(zip(sim["max_batch_size"], sim["max_queue_delay_microseconds"], strict=True),
                        sim["capacity_rps"], strict=True)]
    sim.to_csv(copy / "simulation.csv", index=False)
    out = load_output(copy)
    table = simulation_table(out)
    feasible = table[table["feasible (measured / simulated)"] == "yes / yes"]
    outside = int(measured[above].number)
    inside = feasible.drop(index=outside)
    assert len(inside) and (inside["capacity error"] == "+0.0%").all(), table["capacity error"]
    assert table.loc[outside, "capacity error"] == f"{relative_error(1.32, 1.0, upper=1.2):+.1%}" == "+10.0%"
    number = int(inside.index[0])
    row = trials.set_index("number").loc[number]
    assert table.loc[number, "capacity simulated (req/s)"] == f"{row.capacity_rps * 1.1:,.1f}"  # the ranking's
    assert table.loc[number, "capacity measured (req/s)"] == f"{row.capacity_rps:,.1f}–{row.capacity_rps * 1.2:,.1f}"
    assert "capacity within 0.0% (median absolute error" in simulation_line(out)


def test_a_study_whose_best_is_the_incumbent_says_keep_it(tmp_path_factory: pytest.TempPathFactory,
                                                          tmp_path: Path) -> None:
    copy = shutil.copytree(fake_output(tmp_path_factory, 24), tmp_path / "out")
    _summary_edit(copy, lambda s: s.update(best=s["incumbent"], improvement=0.0))
    line = recommendation_line(load_output(copy))
    assert line.startswith("Keep the incumbent: ") and "best configuration measured" in line and "+0.0%" not in line


def test_a_trial_that_failed_before_any_capacity_says_so_when_hovered(tmp_path_factory: pytest.TempPathFactory) -> None:
    from tuner.report._figures import _hover

    out = load_output(fake_output(tmp_path_factory, 24))
    frame = out.trials[out.trials["capacity_rps"].notna() & ~out.trials["no_verdict"]].head(2).copy()
    frame.loc[frame.index[0], "capacity_rps"] = float("nan")
    first, second = _hover(frame, out.params)
    assert "capacity not measured" in first and "nan" not in first
    assert f"capacity {frame['capacity_rps'].iloc[1]:.1f} req/s" in second
