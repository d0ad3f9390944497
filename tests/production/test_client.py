"""The Prometheus client (tuner/production/_client.py): every failure one line naming the URL, against
small local servers that answer as other things do (or never answer); the command's exit 2."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.production_audit import write_study
from tuner.cli import main
from tuner.production import Prometheus, PrometheusError
from tuner.production._client import normalise_url


@contextlib.contextmanager
def answering(status: int, body: bytes, content_type: str = "application/json"):
    """An HTTP server on 127.0.0.1 answering every GET with `status` and `body`; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent():
    """A socket that accepts connections and never answers: a query API that hangs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    "url, normal",
    [
        ("prom:9090", "http://prom:9090"),
        ("http://prom:9090/", "http://prom:9090"),
        ("https://h/prefix/", "https://h/prefix"),
    ],
)
def test_a_url_is_taken_with_or_without_its_scheme(url, normal):
    assert normalise_url(url) == normal


@pytest.mark.parametrize(
    "url, why",
    [
        ("ftp://h:1", "not an http(s) URL"),
        ("http://h:x", "the port is not a number"),
        ("http://", "not an http(s) URL"),
    ],
)
def test_a_url_that_is_not_http_is_refused(url, why):
    with pytest.raises(PrometheusError, match=re.escape(f"--prometheus '{url}': {why}")):
        Prometheus(url)


def test_a_query_api_that_never_answers_is_a_timeout():
    with (
        silent() as url,
        pytest.raises(PrometheusError, match=rf"^--prometheus {url}: no answer within 0.5 s \(a timeout\)$"),
    ):
        Prometheus(url, timeout_s=0.5).check()


@pytest.mark.parametrize(
    "status, body, why",
    [
        (404, b"<html>not found</html>", "answered HTTP 404"),
        (200, b"<html>a web page</html>", "answered no"),
        (200, json.dumps({"error": "Not Found"}).encode(), "answered no"),
    ],
)
def test_another_server_is_not_a_prometheus_api(status, body, why):
    with answering(status, body) as url, pytest.raises(PrometheusError) as info:
        Prometheus(url).check()
    assert str(info.value).startswith(
        f"--prometheus {url}: not a Prometheus query API (GET /api/v1/query {why}"
    )


def test_a_refused_query_says_prometheus_reason():
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()
    with (
        answering(400, body) as url,
        pytest.raises(PrometheusError, match=r"the query was refused \(400\): parse error$"),
    ):
        Prometheus(url).query("sum(")


def test_a_store_without_prometheus_status_endpoint_has_no_retention_to_check():
    # a Prometheus-compatible store that answers queries but not /api/v1/status/runtimeinfo
    with answering(404, b"") as url:
        assert Prometheus(url).retention() is None


@pytest.mark.parametrize(
    "case, message",
    [
        ("unreachable", "--prometheus http://127.0.0.1:9: unreachable ("),
        ("web page", "not a Prometheus query API (GET /api/v1/query answered HTTP 404)"),
        ("bad window", "--window 'abc': not a duration"),
        ("part of an hour", "--window 90m: a whole number of 1h steps"),
        ("with --url", "--prometheus reads production's history: --url and --at-load-only"),
        ("bad until", "--until: cannot read 'tuesday' as a date and time"),
        ("until to come", "--until 2999-01-01: still to come; the window must have passed"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_else(tmp_path, capsys, case, message):
    study = str(write_study(tmp_path))
    with answering(404, b"<html></html>", "text/html") as page:
        args = {
            "unreachable": ["--prometheus", "127.0.0.1:9"],
            "web page": ["--prometheus", page],
            "bad window": ["--prometheus", page, "--window", "abc"],
            "part of an hour": ["--prometheus", page, "--window", "90m"],
            "with --url": ["--prometheus", page, "--url", "127.0.0.1:9"],
            "bad until": ["--prometheus", page, "--until", "tuesday"],
            "until to come": ["--prometheus", page, "--until", "2999-01-01"],
        }[case]
        code = main(["audit", study, *args, "--json", str(tmp_path / "a.json")])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, out + err
    assert not (tmp_path / "a.json").exists()


def test_a_query_api_that_times_out_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("tuner.production._client.TIMEOUT_S", 0.5)  # the command's own client, not 30 s
    with silent() as url:
        code = main(["audit", str(write_study(tmp_path)), "--prometheus", url])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, out + err
    assert f"--prometheus {url}: no answer within 0.5 s (a timeout)" in err, err


@pytest.mark.parametrize("flag, value", [("--window", "7d"), ("--until", "2026-11-30")])
def test_a_window_without_prometheus_is_refused(tmp_path, capsys, flag, value):
    code = main(["audit", str(write_study(tmp_path)), flag, value, "--url", "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{flag}: only with --prometheus" in err, err
