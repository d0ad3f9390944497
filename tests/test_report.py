"""The study report: loading an output directory, the HTML, the CLI, and the page in a real browser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pandas as pd
import pytest

from tuner.report import load_output, recommendation_line, write_report
from tuner.report._figures import pareto_front

ROOT = Path(__file__).resolve().parents[1]
_OUTPUTS: dict[str, Path] = {}  # one study per test session, shared with test_notebook.py


def study_output(tmp_path_factory: pytest.TempPathFactory, trials: int = 24, journal: bool = True) -> Path:
    """A study output directory made once per session: a real Optuna study in a journal file (as
    `tuner tune` keeps it by default) or sqlite."""
    key = f"study{trials}{'j' if journal else 's'}"
    if key not in _OUTPUTS:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        try:
            from report_bench import build_output
        finally:
            sys.path.remove(str(ROOT / "benchmarks"))
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        _OUTPUTS[key] = build_output(tmp_path_factory.mktemp(key) / "out", trials, journal=journal)
    return _OUTPUTS[key]


@pytest.fixture(scope="session")
def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return study_output(tmp_path_factory)


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


def test_load_output_reads_trials_and_storage(output_dir: Path) -> None:
    out = load_output(output_dir)
    csv = pd.read_csv(output_dir / "trials.csv")
    assert len(out.trials) == len(csv)
    assert out.study is not None and len(out.study.trials) == len(csv)
    assert {"max_batch_size", "max_queue_delay_microseconds"} <= set(out.params)
    assert out.trials["feasible"].dtype == bool
    assert out.trials.loc[out.trials["feasible"], "latency_p99_ms"].max() <= out.sla["latency_ms"]
    best = out.top_trials(1).iloc[0]
    assert best["requests_per_dollar"] == out.trials.loc[out.trials["feasible"], "requests_per_dollar"].max()
    assert set(out.latency_records) >= {"incumbent"} and len(out.latency_records) == 4


def test_report_is_one_offline_file_with_the_recommendation(output_dir: Path, report: Path) -> None:
    assert report == output_dir / "report.html"
    text = report.read_text()
    summary = json.loads((output_dir / "summary.json").read_text())
    line = recommendation_line(load_output(output_dir))
    assert f"max_batch_size={summary['best']['params']['max_batch_size']}" in line
    assert f"{summary['improvement']:+.1%}" in line
    assert line.replace("—", "&mdash;") in text or line in text
    # plotly.js inlined exactly once; nothing fetched from the network
    assert text.count("plotly.js v") == 1
    assert '<script src="http' not in text and "cdn.plot.ly" not in text.split("plotly.js v")[0]
    assert text.count('class="plotly-graph-div"') >= 6
    assert "+max_batch_size" in text.replace("&quot;", "") or "max_batch_size:" in text  # the diff


def test_pareto_front_keeps_only_undominated_trials() -> None:
    frame = pd.DataFrame({"lat": [10, 20, 30, 15, 40], "requests_per_dollar": [5, 8, 7, 4, 9]})
    front = pareto_front(frame, "lat")
    assert front["lat"].tolist() == [10, 20, 40]


def test_report_of_a_few_trials_says_why_importance_is_missing(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out_dir = study_output(tmp_path_factory, trials=3, journal=False)
    text = write_report(out_dir).read_text()
    assert "parameter importance needs at least 4 complete trials" in text


def test_missing_extras_become_notes(output_dir: Path, tmp_path: Path) -> None:
    bare = _copy(output_dir, tmp_path / "bare", ("summary.json", "trials.csv"))
    summary = json.loads((bare / "summary.json").read_text())
    del summary["storage"], summary["traffic"]
    (bare / "summary.json").write_text(json.dumps(summary))
    text = write_report(bare).read_text()
    for note in (
        "no Optuna storage",
        "the traffic profile was not found",
        "recommended/config.pbtxt is missing",
        "drawn through the measured percentiles",
    ):
        assert note in text
    assert text.count('class="plotly-graph-div"') >= 4


def _tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=120)


def test_cli_writes_the_report_finding_the_storage_in_the_directory(output_dir: Path, tmp_path: Path) -> None:
    keep = ("summary.json", "trials.csv", "recommended", "incumbent", "study.journal", "records")
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


def test_report_of_a_study_where_nothing_met_the_sla(output_dir: Path, tmp_path: Path) -> None:
    copy = _copy(output_dir, tmp_path / "none", ("summary.json", "trials.csv", "study.journal"))
    summary = json.loads((copy / "summary.json").read_text())
    summary["best"], summary["improvement"] = None, None
    (copy / "summary.json").write_text(json.dumps(summary))
    text = write_report(copy).read_text()
    assert "No configuration met the SLA (latency p99 ≤ 100 ms)" in text


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: None, "not a study output directory: summary.json is missing"),
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
    assert result.returncode == 2 and "not a directory" in result.stderr


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
    assert line.startswith("Recommended: max_batch_size=") and "over the incumbent" in line
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
