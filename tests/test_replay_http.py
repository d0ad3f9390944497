"""The load generator's prepared HTTP requests (`tuner.replay._http`): read by a real tritonserver
exactly as laid out, and answers of every framing read back from a real socket server."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from tuner.replay._http import Connections, error_text, infer_request, tensor_data
from tuner.replay._sink import sink
from tuner.server.local import LocalLauncher

MODELS = Path(__file__).resolve().parent / "data" / "replay_models"
# dtypes model inputs, batch 2: (name, datatype, shape)
SHAPES = [("F16", "FP16", [2, 5]), ("F32", "FP32", [2, 2, 3]), ("I64", "INT64", [2, 7]), ("U8", "UINT8", [2, 3]),
          ("FLAG", "BOOL", [2, 4]), ("TEXT", "BYTES", [2, 6])]
NUMPY = {"FP16": np.float16, "FP32": np.float32, "INT64": np.int64, "UINT8": np.uint8, "BOOL": np.bool_}


@pytest.fixture(scope="module")
def server(triton_install):
    with LocalLauncher(MODELS, models=["echo", "dtypes"], install=triton_install) as launcher:
        yield launcher


def post(address: str, model: str, inputs: list, data: list, outputs: list[str]) -> tuple[int, bytes]:
    connections = Connections(address, timeout_s=10.0)
    try:
        return connections.post(infer_request(address, model, inputs, outputs=outputs, data=data))
    finally:
        connections.close()


def decode(body: bytes, dtype, shape) -> np.ndarray:
    """The one binary output of a Triton answer: its JSON header, then the raw tensor."""
    header, end = json.JSONDecoder().raw_decode(body.decode("latin-1"))
    assert header["outputs"][0]["parameters"]["binary_data_size"] == len(body) - end
    return np.frombuffer(body[end:], dtype=dtype).reshape(shape)


def strings(elements: list[bytes]) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


def row_sums(datatype: str, raw: bytes, shape: list[int]) -> np.ndarray:
    """What the dtypes model answers for one input: per batch row, the sum (BYTES: total length)."""
    if datatype == "BYTES":
        lengths, pos = [], 0
        while pos < len(raw):
            n = int.from_bytes(raw[pos:pos + 4], "little")
            lengths.append(n)
            pos += 4 + n
        return np.asarray(lengths, dtype=float).reshape(shape[0], -1).sum(axis=1)
    return np.frombuffer(raw, dtype=NUMPY[datatype]).astype(float).reshape(shape[0], -1).sum(axis=1)


@pytest.mark.slow
def test_a_prepared_request_carries_every_datatype_as_triton_reads_it(server):
    rng = np.random.default_rng(7)
    data = []
    for _, datatype, shape in SHAPES:
        count = int(np.prod(shape))
        if datatype == "BYTES":
            data.append(strings([b"x" * int(n) for n in rng.integers(0, 9, count)]))
        elif datatype == "BOOL":
            data.append(rng.random(count).__lt__(0.5).tobytes())
        elif datatype.startswith("FP"):
            data.append(rng.random(count).astype(NUMPY[datatype]).tobytes())
        else:
            data.append(rng.integers(0, 100, count).astype(NUMPY[datatype]).tobytes())
    status, body = post(server.endpoints.http, "dtypes", [(n, d, s) for n, d, s in SHAPES], data, ["SUMS"])
    assert status == 200, body
    sums = decode(body, np.float64, (2, 6))
    for k, ((_, datatype, shape), raw) in enumerate(zip(SHAPES, data, strict=True)):
        assert sums[:, k] == pytest.approx(row_sums(datatype, raw, shape), rel=1e-3), datatype


@pytest.mark.slow
def test_tensor_data_of_any_length_is_a_valid_tensor(server):
    """The load generator sends prefixes of one buffer per input: each prefix must be whole elements."""
    data = [tensor_data(datatype, int(np.prod(shape)), seed=k) for k, (_, datatype, shape) in enumerate(SHAPES)]
    status, body = post(server.endpoints.http, "dtypes", [(n, d, s) for n, d, s in SHAPES], data, ["SUMS"])
    assert status == 200, body
    sums = decode(body, np.float64, (2, 6))
    expected = [row_sums(datatype, raw, shape) for (_, datatype, shape), raw in zip(SHAPES, data, strict=True)]
    assert sums == pytest.approx(np.stack(expected, axis=1), rel=1e-3)
    assert (sums[:, 2] > 0).all() and (sums[:, 5] == 6).all()  # token-like ids; one-byte strings
    # the echo model answers each row with its sequence length
    status, body = post(server.endpoints.http, "echo", [("INPUT_IDS", "INT32", [3, 11])],
                        [tensor_data("INT32", 33)], ["LENGTH"])
    assert status == 200 and decode(body, np.int32, (3, 1)).ravel().tolist() == [11, 11, 11]


@pytest.mark.slow
def test_the_error_of_a_failed_request_is_triton_s_own(server):
    status, body = post(server.endpoints.http, "nope", [("INPUT_IDS", "INT32", [1, 4])], [tensor_data("INT32", 4)],
                        ["LENGTH"])
    assert status >= 400 and "nope" in error_text(status, body)
    status, body = post(server.endpoints.http, "echo", [("INPUT_IDS", "FP32", [1, 4])], [tensor_data("FP32", 4)],
                        ["LENGTH"])
    assert status == 400 and "FP32" in error_text(status, body) and "INT32" in error_text(status, body)


def test_error_text_without_a_json_error():
    assert error_text(502, b"<html>bad gateway</html>") == "HTTP 502: <html>bad gateway</html>"
    assert error_text(500, b"") == "HTTP 500"


@contextmanager
def scripted_server(answers: list[list[bytes]], *, close_after: int | None = None) -> Iterator[str]:
    """A real socket server: on each connection, reads requests (head + Content-Length body) and writes
    the next scripted answer, piece by piece; closes the connection after `close_after` answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    script = iter(answers)

    def serve(conn: socket.socket) -> None:
        with conn:
            buf, served = b"", 0
            while close_after is None or served < close_after:
                while (end := buf.find(b"\r\n\r\n")) < 0:
                    if not (data := conn.recv(65536)):
                        return
                    buf += data
                length = int(buf[:end].lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(buf) < end + 4 + length:
                    buf += conn.recv(65536)
                buf = buf[end + 4 + length:]
                for piece in next(script):
                    conn.sendall(piece)
                served += 1

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
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        # a close alone leaves a blocked accept() listening on the port, which the next listener may be given
        # (SO_REUSEADDR): its connections would reach this script. A shutdown wakes the accept
        listener.shutdown(socket.SHUT_RDWR)
        acceptor.join(timeout=5)
        listener.close()


REQUEST = [b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"]


def test_answers_in_every_framing_are_read_whole():
    answers = [
        # chunked, with a chunk extension and a trailer
        [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n6\r\n worl", b"d\r\n0\r\nT: 1\r\n\r\n"],
        # one byte at a time
        [bytes([b]) for b in b"HTTP/1.1 400 Bad Request\r\nContent-Length: 17\r\n\r\n{\"error\":\"nope\"}!"],
        # a large body in pieces
        [b"HTTP/1.1 200 OK\r\ncontent-length: 300000\r\n\r\n" + b"a" * 100000, b"b" * 200000],
        # no length: the body runs to the end of the connection
        [b"HTTP/1.0 200 OK\r\n\r\nuntil the end"],
    ]
    with scripted_server(answers, close_after=4) as address:
        connections = Connections(address, timeout_s=5.0)
        assert connections.post(REQUEST) == (200, b"hello world")
        status, body = connections.post(REQUEST)
        assert status == 400 and body == b'{"error":"nope"}!'
        status, body = connections.post(REQUEST)
        assert status == 200 and body == b"a" * 100000 + b"b" * 200000
        assert connections.post(REQUEST) == (200, b"until the end")
        assert connections.opened == 1  # kept alive for the first three, closed by the last


def test_a_connection_the_server_closed_while_idle_is_replaced_not_reported():
    ok = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
    with scripted_server([ok, ok, ok], close_after=1) as address:
        connections = Connections(address, timeout_s=5.0)
        assert connections.post(REQUEST) == (200, b"ok")
        assert connections.post(REQUEST) == (200, b"ok")  # the kept connection was closed: a new one
        assert connections.post(REQUEST) == (200, b"ok")
        assert connections.opened == 3


def test_a_server_that_answers_nothing_is_an_error():
    with scripted_server([], close_after=0) as address:
        connections = Connections(address, timeout_s=5.0)
        with pytest.raises(OSError, match="closed the connection without answering"):
            connections.post(REQUEST)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_calibration_sink_answers_like_triton(protocol):
    with sink(protocol) as address:
        if protocol == "http":
            status, body = post(address, "calibration", [("INPUT_IDS", "INT32", [1, 64])],
                                [tensor_data("INT32", 64)], ["OUT"])
            assert status == 200 and decode(body, np.int32, (1, 1)).tolist() == [[4]]
        else:
            import tritonclient.grpc as tc

            client = tc.InferenceServerClient(address)
            tensor = tc.InferInput("INPUT_IDS", [1, 64], "INT32")
            tensor.set_data_from_numpy(np.zeros((1, 64), np.int32))
            assert client.infer("calibration", [tensor]).as_numpy("OUT").tolist() == [[4]]
            client.close()


def test_server_sent_events_are_handed_over_whatever_their_framing():
    from tuner.replay._http import generate_request

    first, second = b'data: {"text_output":" w0","num_output_tokens":1}\n\n', b'data: {"error":"late failure"}\n\n'
    answers = [
        # an event split across two chunks, each chunk written in two pieces
        [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
         + b"%x\r\n" % 20 + first[:10], first[10:20] + b"\r\n",
         b"%x\r\n" % (len(first) - 20) + first[20:] + b"\r\n", b"%x\r\n" % len(second) + second + b"\r\n0\r\n\r\n"],
        # an error before the stream starts: a whole JSON answer
        [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 22\r\n\r\n{\"error\":\"bad prompt\"}"],
        # the events as one whole body
        [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(first) * 2) + first + first],
    ]
    got: list[bytes] = []
    with scripted_server(answers) as address:
        connections = Connections(address, timeout_s=5.0)
        request = generate_request(address, "llm", "w1 w2", tokens=4)
        assert request.startswith(b"POST /v2/models/llm/generate_stream HTTP/1.1\r\n")
        body = json.loads(request.split(b"\r\n\r\n", 1)[1])
        assert body["stream"] is True and body["exclude_input_in_output"] and body["return_num_output_tokens"]
        assert json.loads(body["sampling_parameters"]) == {"max_tokens": 4, "min_tokens": 4, "ignore_eos": True,
                                                           "temperature": 0}
        assert connections.stream(request, got.append) == (200, b"")
        assert got == [first[6:-2], second[6:-2]]
        assert connections.stream(request, got.append) == (400, b'{"error":"bad prompt"}')
        got.clear()
        assert connections.stream(request, got.append) == (200, b"") and got == [first[6:-2]] * 2
        assert connections.opened == 1
