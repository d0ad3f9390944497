"""What the launchers ask of this machine's loopback: a port is taken only while something listens on it."""

from __future__ import annotations

import socket

import pytest

from tuner.errors import ServerSetupError
from tuner.localhost import check_port_free, free_ports


def test_a_listening_port_is_taken():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(ServerSetupError, match=f"^port {port} on 127.0.0.1 is already in use"):
            check_port_free(port)


def test_a_port_whose_server_stopped_is_free_while_its_last_connection_lingers():
    # the server closes first (as tritonserver does when it stops): its side of the connection stays in
    # TIME_WAIT for a minute, which a plain bind refuses and tritonserver does not
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()
    client.close()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:
        with pytest.raises(OSError):
            plain.bind(("127.0.0.1", port))  # what the check did before: refused
    check_port_free(port)


def test_free_ports_are_distinct_and_free():
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        check_port_free(port)
