"""Servers on 127.0.0.1 that answer every infer request at once with a fixed small answer, as Triton
answers a tiny model: what the load generator's calibration sends to, so that it measures the load
generator's own cost per request and nothing of a model. Parent side, threads, unpatched."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

_HEADER = json.dumps({"model_name": "calibration", "model_version": "1", "outputs": [
    {"name": "OUT", "datatype": "INT32", "shape": [1, 1], "parameters": {"binary_data_size": 4}}]}).encode()
HTTP_ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
               b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
               % (len(_HEADER), len(_HEADER) + 4)) + _HEADER + b"\x04\x00\x00\x00"


@contextmanager
def sink(protocol: str) -> Iterator[str]:
    """A running sink for `protocol` ("http" or "grpc"); yields its HOST:PORT, stops on exit."""
    if protocol == "grpc":
        with _grpc_sink() as address:
            yield address
        return
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _HttpHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _HttpHandler(socketserver.BaseRequestHandler):
    """One kept-alive connection: read each request (head and Content-Length body), answer at once."""

    def handle(self) -> None:
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            while (end := buf.find(b"\r\n\r\n")) < 0:
                if not (data := sock.recv(65536)):
                    return
                buf += data
            length = 0
            for line in buf[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buf) < end + 4 + length:
                if not (data := sock.recv(65536)):
                    return
                buf += data
            buf = buf[end + 4 + length:]
            sock.sendall(HTTP_ANSWER)


@contextmanager
def _grpc_sink() -> Iterator[str]:
    import grpc
    from tritonclient.grpc import service_pb2

    answer = service_pb2.ModelInferResponse(model_name="calibration", model_version="1")
    out = answer.outputs.add()
    out.name, out.datatype = "OUT", "INT32"
    out.shape.extend([1, 1])
    answer.raw_output_contents.append(b"\x04\x00\x00\x00")
    payload = answer.SerializeToString()
    # Raw bytes in and out (no serializers): the answer is the same whatever was asked.
    handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(lambda _request, _context: payload)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
