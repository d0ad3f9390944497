"""Triton's binary-tensor HTTP infer request and its generate_stream request, prepared as bytes, and a
small keep-alive HTTP/1.1 client (whole answers, or Server-Sent Events handed over as they arrive).

The load generator sends the same few request shapes thousands of times a second, so each distinct
request is laid out once (`infer_request`) and sent as prepared bytes (`Connections.post`): no JSON,
header or tensor work per request. Tensor data is one flat buffer per input (`tensor_data`); a request
of any shape takes a prefix of it, so a buffer as large as the largest request serves them all.

Plain `socket` code: blocking in an ordinary process, cooperative in the load generator, where Locust
has monkey-patched `socket` with gevent's before this module is imported.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Sequence
from urllib.parse import quote

import numpy as np

# Bytes per element as the replay sends them; BYTES elements are one character behind a 4-byte length.
ITEMSIZE = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "BF16": 2,
            "INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8, "BYTES": 5}
_NUMPY = {"BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
          "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}
_BYTES_ELEMENT = (1).to_bytes(4, "little") + b"0"
RECV_BYTES = 65536


class HttpProtocolError(OSError):
    """The server's answer was not a well-formed HTTP/1.1 response."""


class _Stale(OSError):
    """A kept-alive connection the server had closed: nothing was answered, the request may be resent."""


def tensor_data(datatype: str, count: int, seed: int = 0) -> bytes:
    """`count` elements of `datatype` as raw bytes in Triton's binary layout (BYTES: length-prefixed).

    Integers look like token ids (1..100, varied along the buffer), floats are uniform in [0, 1),
    booleans false; any prefix of whole elements is itself valid data.
    """
    if datatype == "BYTES":
        return _BYTES_ELEMENT * count
    if datatype == "BOOL":
        return bytes(count)
    if datatype.startswith(("FP", "BF")):
        values = np.random.default_rng(seed).random(count)
        if datatype == "BF16":  # the top half of each float32
            return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
        return values.astype(_NUMPY[datatype]).tobytes()
    return (np.arange(count) % 100 + 1).astype(_NUMPY[datatype]).tobytes()


def infer_request(host: str, model: str, inputs: Sequence[tuple[str, str, Sequence[int]]],
                  *,
                  outputs: Sequence[str], data: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """The parts of one HTTP infer request in Triton's binary-tensor extension, to send in order.

    `inputs` gives (name, datatype, shape) and `data` each input's raw bytes (`tensor_data`, cut to
    the shape); every output is asked for as binary data. The JSON header goes first, its length in
    `Inference-Header-Content-Length`, then the tensors' bytes back to back.
    """
    header = json.dumps({
        "inputs": [{"name": name, "shape": [int(d) for d in shape], "datatype": datatype,
                    "parameters": {"binary_data_size": len(raw)}}
                   for (name, datatype, shape), raw in zip(inputs, data, strict=True)],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }, separators=(",", ":")).encode()
    length = len(header) + sum(len(raw) for raw in data)
    head = (f"POST /v2/models/{quote(model)}/infer HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode("latin-1")
    return [head + header, *data]


def generate_request(host: str, model: str, prompt: str, *, tokens: int) -> bytes:
    """One streaming generate request (`POST /v2/models/<model>/generate_stream`, the vLLM backend's
    inputs): the prompt, and exactly `tokens` tokens to generate (max_tokens = min_tokens,
    ignore_eos, greedy); each response is to carry its token count (`num_output_tokens`)."""
    sampling = json.dumps({"max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "temperature": 0},
                          separators=(",", ":"))
    body = json.dumps({"text_input": prompt, "stream": True, "exclude_input_in_output": True,
                       "return_num_output_tokens": True, "sampling_parameters": sampling},
                      separators=(",", ":")).encode()
    head = (f"POST /v2/models/{quote(model)}/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
    return head + body


def error_text(status: int, body: bytes) -> str:
    """The error Triton gave for a failed request (its JSON `error`), else the status and the body."""
    try:
        message = json.loads(body).get("error")
    except (ValueError, AttributeError):
        message = None
    if isinstance(message, str) and message:
        return message
    text = bytes(body[:200]).decode("utf-8", "replace").strip()
    return f"HTTP {status}" + (f": {text}" if text else "")


class Connections:
    """Kept-alive HTTP/1.1 connections to one server: one per request in flight, reused afterwards."""

    def __init__(self, address: str, *, timeout_s: float):
        self.address = _address(address)
        self.timeout_s = timeout_s
        self.opened = 0
        self._idle: list[socket.socket] = []
        self._busy: set[socket.socket] = set()  # carrying a request now: what `cut` ends
        self.was_cut = False  # `cut` was called: a request it ended is not sent again

    def open(self, count: int) -> None:
        """Connect `count` more idle connections now, so the first sends need no handshake."""
        self._idle.extend(self._connect() for _ in range(count))

    def close(self) -> None:
        """Close every idle connection."""
        while self._idle:
            self._idle.pop().close()

    def cut(self) -> int:
        """End every exchange in flight: each connection carrying a request is shut down, so its reader
        gets an error at once and the server sees the client gone (at its next write). Returns how many."""
        self.was_cut = True
        busy = list(self._busy)
        for sock in busy:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return len(busy)

    def post(self, parts: Sequence[bytes | memoryview]) -> tuple[int, bytes]:
        """Send one request (its parts in order) and return the response's status and body."""
        return self._send(parts)

    def stream(self, request: bytes, on_event: Callable[[bytes], None]) -> tuple[int, bytes]:
        """Send one request and hand each Server-Sent Event's data to `on_event` as soon as it arrives;
        returns the status, and the body when it was not an event stream (an error before the start)."""
        status, body = self._send((request,), on_event)
        if status == 200 and body:  # the events sent as one whole body, not chunked
            _Events(on_event).feed(body)
            body = b""
        return status, body

    def _send(self, parts: Sequence[bytes | memoryview],
              on_event: Callable[[bytes], None] | None = None) -> tuple[int, bytes]:
        """One exchange on an idle connection, or a new one; a reused connection the server had closed
        while idle is dropped and the request sent again (it never reached the server)."""
        while True:
            reused = bool(self._idle)
            sock = self._idle.pop() if reused else self._connect()
            self._busy.add(sock)
            try:
                status, body, keep = _exchange(sock, parts, on_event)
            except _Stale:
                sock.close()
                if reused and not self.was_cut:
                    continue  # closed by the server while idle: the request never reached it
                raise HttpProtocolError("the server closed the connection without answering") from None
            except BaseException:
                sock.close()
                raise
            finally:
                self._busy.discard(sock)
            if keep:
                self._idle.append(sock)
            else:
                sock.close()
            return status, body

    def _connect(self) -> socket.socket:
        self.opened += 1
        return _connect(self.address, self.timeout_s)


def _address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def exchange_together(address: str, requests: Sequence[Sequence[bytes | memoryview]], *, timeout_s: float,
                      first_alone_s: float | None = None) -> tuple[list[tuple[int, bytes]], float]:
    """Each request on a connection of its own, every connection opened before any request is sent;
    the requests written one after another from this thread (the first alone, `first_alone_s` before
    the others), then every answer read. Returns the (status, body) of each, status 0 and the OS's
    words where it failed, and the seconds from the first write to the last answer. Written from one
    thread, N requests leave within microseconds, where N threads released together took longer than
    a 20-ms execution to all send on a loaded 2-core machine (Python's threads take turns)."""
    socks: list[socket.socket] = []
    answers: list[tuple[int, bytes]] = [(0, b"")] * len(requests)
    written = [False] * len(requests)
    try:
        socks.extend(_connect(_address(address), timeout_s) for _ in requests)
        started = time.monotonic()
        for k, (sock, parts) in enumerate(zip(socks, requests, strict=True)):
            if k == 1 and first_alone_s is not None:
                time.sleep(first_alone_s)
            try:
                _write(sock, parts)
                written[k] = True
            except OSError as exc:  # _Stale too
                answers[k] = (0, (str(exc) or "the server closed the connection").encode())
        for k, sock in enumerate(socks):
            if written[k]:
                try:
                    status, body, _keep = _response(sock)
                    answers[k] = (status, body)
                except OSError as exc:  # _Stale and HttpProtocolError too
                    answers[k] = (0, (str(exc) or "the server closed the connection without answering").encode())
        return answers, time.monotonic() - started
    finally:
        for sock in socks:
            sock.close()


def _exchange(sock: socket.socket, parts: Sequence[bytes | memoryview],
              on_event: Callable[[bytes], None] | None = None) -> tuple[int, bytes, bool]:
    """Write a request on `sock` and read one response: (status, body, whether the connection stays
    open). Reads a Content-Length or chunked body, or a body up to the end of the connection. With
    `on_event`, a 200 answer's chunked body is read as Server-Sent Events, each handed over on arrival
    (the body returned is then empty)."""
    _write(sock, parts)
    return _response(sock, on_event)


def _write(sock: socket.socket, parts: Sequence[bytes | memoryview]) -> None:
    try:
        for part in parts:
            sock.sendall(part)
    except (ConnectionResetError, BrokenPipeError):
        raise _Stale() from None


def _response(sock: socket.socket, on_event: Callable[[bytes], None] | None = None) -> tuple[int, bytes, bool]:
    """Read one response from `sock` (see `_exchange`)."""
    try:
        buf = sock.recv(RECV_BYTES)
    except (ConnectionResetError, BrokenPipeError):
        raise _Stale() from None
    if not buf:
        raise _Stale()
    while (end := buf.find(b"\r\n\r\n")) < 0:
        buf += _recv(sock, "the end of the response headers")
    lines = buf[:end].split(b"\r\n")
    status_line = lines[0].split(None, 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1.") or not status_line[1].isdigit():
        raise HttpProtocolError(f"not an HTTP/1.x response: {bytes(lines[0][:80])!r}")
    status = int(status_line[1])
    keep = status_line[0] == b"HTTP/1.1"
    length, chunked = None, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            token = value.strip().lower()
            keep = True if token == b"keep-alive" else False if token == b"close" else keep
    rest = buf[end + 4:]
    if chunked and on_event is not None and status == 200:
        _read_chunked(sock, rest, _Events(on_event))
        return status, b"", keep
    if chunked:
        return status, _read_chunked(sock, rest), keep
    if length is None:  # the body runs to the end of the connection
        chunks = [rest]
        while data := sock.recv(RECV_BYTES):
            chunks.append(data)
        return status, b"".join(chunks), False
    if len(rest) >= length:
        return status, rest[:length], keep
    body = bytearray(length)
    body[:len(rest)] = rest
    view, got = memoryview(body), len(rest)
    while got < length:
        n = sock.recv_into(view[got:])
        if not n:
            raise HttpProtocolError(f"the connection closed after {got} of {length} body bytes")
        got += n
    return status, bytes(body), keep


def _recv(sock: socket.socket, what: str) -> bytes:
    data = sock.recv(RECV_BYTES)
    if not data:
        raise HttpProtocolError(f"the connection closed before {what}")
    return data


class _Events:
    """Server-Sent Events from a body's pieces as they come: each `data:` field to `on_event`."""

    def __init__(self, on_event: Callable[[bytes], None]):
        self.on_event = on_event
        self.buf = b""

    def feed(self, data: bytes) -> None:
        """Take the next piece of the body; hand over every event it completes."""
        buf = self.buf + data
        while (end := buf.find(b"\n\n")) >= 0:
            for line in buf[:end].split(b"\n"):
                if line.startswith(b"data:"):
                    self.on_event(line[5:].strip())
            buf = buf[end + 2:]
        self.buf = buf


def _read_chunked(sock: socket.socket, buf: bytes, events: _Events | None = None) -> bytes:
    """A chunked body; with `events`, each chunk goes to it as soon as it is whole (nothing kept)."""
    body = bytearray()
    while True:
        while (eol := buf.find(b"\r\n")) < 0:
            buf += _recv(sock, "the next chunk")
        size = int(buf[:eol].split(b";")[0], 16)
        buf = buf[eol + 2:]
        if size == 0:  # the last chunk, then optional trailers up to an empty line
            while not (buf.startswith(b"\r\n") or b"\r\n\r\n" in buf):
                buf += _recv(sock, "the end of the chunked body")
            return bytes(body)
        while len(buf) < size + 2:
            buf += _recv(sock, "the end of a chunk")
        if events is None:
            body += buf[:size]
        else:
            events.feed(buf[:size])
        buf = buf[size + 2:]
