"""A URL that answers but is not Triton's HTTP endpoint (its metrics or gRPC port, something else):
`check_triton`, the remote launcher's start and the HTTP client refuse it in one line that names the
URL and what answered. Real listeners on 127.0.0.1: the session's tritonserver, and a plain socket
server that answers what each case scripts."""

from __future__ import annotations

import socket
import struct
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tuner.errors import ServerError, ServerSetupError
from tuner.server.client import NotTritonError, TritonHttp
from tuner.server.remote import RemoteLauncher, check_triton

NOT_TRITON = "answers but is not Triton's HTTP endpoint"
# the first frame Triton's gRPC port sends to a client: SETTINGS, on stream 0
HTTP2_SETTINGS = struct.pack(">I", 6)[1:] + b"\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00\x00\x00\x64"


@contextmanager
def scripted(answer: bytes, *, reset: bool = False) -> Iterator[tuple[str, list[bytes]]]:
    """A plain socket server: on each connection, reads the request head, records its first line,
    writes `answer`, then closes (with a TCP reset when `reset`). Yields its address and the lines."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head and (data := conn.recv(65536)):
                head += data
            seen.append(head.split(b"\r\n", 1)[0])
            conn.sendall(answer)
            if reset:  # linger 0: the close sends RST, not FIN
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        # a close alone leaves a blocked accept() listening on the port, which the next listener may be given
        # (SO_REUSEADDR): its connections would reach this script. A shutdown wakes the accept
        listener.shutdown(socket.SHUT_RDWR)
        acceptor.join(timeout=5)
        listener.close()


def _ok(body: bytes, status: str = "200 OK", content_type: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


GARBAGE = [
    ("a line that is not HTTP", b"hello, this is not HTTP\r\n", False, "not an HTTP status line: 'hello"),
    ("an HTTP/2 frame", HTTP2_SETTINGS, False, "an HTTP/2 frame"),
    ("an HTTP/2 status line", b"HTTP/2 200 OK\r\n\r\n", False, "an answer in HTTP/2, not HTTP/1.1"),
    ("nothing, then a close", b"", False, "closed without an answer"),
    ("nothing, then a reset", b"", True, "the connection was"),
    ("an HTML page", _ok(b"<html>hi</html>", content_type="text/html"), False, "not JSON: '<html>hi</html>'"),
    ("an empty 200", _ok(b"", content_type="text/plain"), False, "an empty answer, not JSON"),
    ("a JSON list", _ok(b"[1, 2]"), False, "JSON but not an object"),
    ("someone else's JSON", _ok(b'{"status": "ok"}'), False, "a JSON object without 'name' or 'version'"),
    ("a 404 page", _ok(b"<h1>Not Found</h1>", status="404 Not Found", content_type="text/html"), False,
     "GET /v2: HTTP 404: <h1>Not Found</h1>"),
]


@pytest.mark.parametrize("answer,reset,what", [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
def test_something_else_answering_is_refused_in_one_line_naming_the_url(answer, reset, what):
    with scripted(answer, reset=reset) as (address, seen):
        with pytest.raises(ServerSetupError) as err:
            check_triton(address)
    message = str(err.value)
    assert message.startswith(f"{address} {NOT_TRITON} (GET /v2") and what in message, message
    assert "\n" not in message
    assert seen[0] == b"GET /v2 HTTP/1.1"


def test_the_remote_launcher_checks_the_server_metadata_before_anything_else():
    with scripted(_ok(b"", content_type="text/plain")) as (address, seen):
        launcher = RemoteLauncher(address, models=["encoder_sim"])
        with pytest.raises(ServerSetupError, match=rf"^{address} {NOT_TRITON} \(GET /v2: an empty answer"):
            launcher.start()
    assert seen == [b"GET /v2 HTTP/1.1"]  # not the model's readiness, not an unload probe


@pytest.mark.parametrize("answer,reset,what", [
    (b"\x00garbage\r\n", False, "not an HTTP status line"),
    (HTTP2_SETTINGS, False, "an HTTP/2 frame"),
    (b"", True, "the connection was"),
    (_ok(b"not json"), False, "not JSON: 'not json'"),
])
def test_the_client_turns_a_broken_answer_into_its_own_error(answer, reset, what):
    with scripted(answer, reset=reset) as (address, _):
        with pytest.raises(NotTritonError) as err:
            TritonHttp(address, timeout_s=5).get_json("v2/models/m/config")
    assert isinstance(err.value, ServerError)  # what a launcher already handles as a misbehaving server
    assert err.value.call == "GET /v2/models/m/config" and what in err.value.what, err.value


def test_an_empty_answer_to_a_load_is_still_fine():
    with scripted(_ok(b"")) as (address, _):
        assert TritonHttp(address).post_json("v2/repository/models/m/load", {}) == {}


def test_nothing_listening_is_unreachable_not_someone_else():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerSetupError, match=f"^cannot reach a Triton server at 127.0.0.1:{port}: "):
        check_triton(f"127.0.0.1:{port}")


def test_a_malformed_url_names_the_key_or_flag():
    with pytest.raises(ServerSetupError, match=r"^--url: expected host:port"):
        check_triton("127.0.0.1:abc", where="--url")


# --- the real tritonserver's other ports ---------------------------------------------------------


def _metrics_address(local_server) -> str:
    return urllib.parse.urlsplit(local_server.endpoints.metrics).netloc


@pytest.mark.slow
def test_triton_s_own_http_endpoint_passes(local_server):
    check_triton(local_server.endpoints.http)
    check_triton(f"http://{local_server.endpoints.http}/")


@pytest.mark.slow
@pytest.mark.parametrize("port,what", [("metrics", "GET /v2: an empty answer, not JSON"),
                                       ("grpc", "GET /v2: an HTTP/2 frame")])
def test_triton_s_metrics_and_grpc_ports_are_refused(local_server, port, what):
    address = _metrics_address(local_server) if port == "metrics" else local_server.endpoints.grpc
    with pytest.raises(ServerSetupError) as err:
        check_triton(address)
    assert str(err.value).startswith(f"{address} {NOT_TRITON} ({what}"), err.value
    with pytest.raises(ServerSetupError, match=f"^{address} {NOT_TRITON}"):
        RemoteLauncher(address, models=["encoder_sim"], read_only=True).start()
