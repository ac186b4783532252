"""The agent's HTTP endpoint must not hold a thread for ever per idle or slow connection."""

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import prometheus_client
import pytest

from gpuhealth_agent import health
from gpuhealth_sim.waiting import wait_until


@pytest.fixture
def server() -> Iterator[health.HealthServer]:
    liveness = health.Liveness(interval_seconds=5.0)
    liveness.completed(time.time())
    running = health.HealthServer(
        0,
        liveness,
        prometheus_client.CollectorRegistry(),
        host="127.0.0.1",
        idle_timeout_seconds=0.5,
        max_connections=4,
    ).start()
    try:
        yield running
    finally:
        running.stop()


def _idle(port: int) -> socket.socket:
    """A client that connects and never sends a request (a scanner, a stuck proxy, a slowloris)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(10.0)
    return sock


def _hung_up(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _connection_threads() -> int:
    """Threads serving a connection (socketserver names them after process_request_thread)."""
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def _healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        return int(response.status)


def test_an_idle_connection_is_closed_after_the_idle_timeout(server: health.HealthServer) -> None:
    sock = _idle(server.port)
    try:
        started = time.monotonic()
        assert sock.recv(1024) == b""  # the server hung up on its own
        assert time.monotonic() - started < 5.0
    finally:
        sock.close()


def test_idle_connections_hold_no_more_threads_than_the_bound(server: health.HealthServer) -> None:
    idle = [_idle(server.port) for _ in range(20)]
    try:
        # The connections past the bound are hung up on at once; the first 4 wait for their timeout.
        closed = wait_until(
            lambda: sum(map(_hung_up, idle)) >= 16 or None,
            timeout_seconds=5,
            interval_seconds=0.02,
            message="the server hangs up on the connections past its bound",
        )
        assert closed
        assert _connection_threads() <= 4
    finally:
        for sock in idle:
            sock.close()
    assert _healthz(server.port) == 200  # and the probes are answered again


def test_probes_are_answered_beside_idle_connections(server: health.HealthServer) -> None:
    idle = [_idle(server.port) for _ in range(2)]
    try:
        assert _healthz(server.port) == 200
    finally:
        for sock in idle:
            sock.close()
