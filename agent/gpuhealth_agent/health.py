"""The agent's HTTP endpoint: /metrics for Prometheus, /healthz and /readyz for the kubelet.

/healthz (liveness) fails (503) when no collection has completed for 3
intervals: a hung NVML call must restart the agent rather than leave it
"alive" while its facts go stale.

/readyz (readiness) fails as well while the agent's last contact with the API
server failed (a status write, or reading its Node and GPUNode at start), until
one succeeds again. The operator reads the agent pod's Ready condition as the
agent's liveness (its `decisions.liveness`): so a node whose agent cannot
collect, or cannot report what it collected, turns Unknown within about a
minute, without the agent writing its GPUNode more often than its long
heartbeat. An outage of the API server alone does not restart the agent:
that is /healthz's job, and it looks at the NVML loop only.
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import prometheus_client

MISSED_INTERVALS: Final = 3
IDLE_TIMEOUT_SECONDS: Final = 10.0
"""How long a connection may send nothing before the server hangs up (a probe sends at once)."""
MAX_CONNECTIONS: Final = 16
"""Connections served at once; more are closed unanswered. The kubelet and Prometheus need a few."""


@dataclasses.dataclass
class Liveness:
    interval_seconds: float
    clock: Callable[[], float] = time.time
    started_at: float = dataclasses.field(default_factory=time.time)
    last_completed_at: float | None = None
    api_failing_since: float | None = None
    """When the API contacts started failing (None: the last one worked, or none was made yet)."""

    def completed(self, when: float) -> None:
        self.last_completed_at = when

    def api_contact(self, ok: bool, when: float) -> None:
        """Record whether the agent's latest API contact (a write, or reading its objects) worked."""
        if ok:
            self.api_failing_since = None
        elif self.api_failing_since is None:
            self.api_failing_since = when

    def ready(self) -> tuple[bool, str]:
        """Alive (`check`) and able to report: the last API contact did not fail."""
        alive, message = self.check()
        if not alive:
            return alive, message
        if self.api_failing_since is not None:
            age = self.clock() - self.api_failing_since
            return False, f"cannot write to the API server for {age:.1f}s (retrying)"
        return True, "ok"

    def check(self) -> tuple[bool, str]:
        reference = self.last_completed_at if self.last_completed_at is not None else self.started_at
        age = self.clock() - reference
        limit = MISSED_INTERVALS * self.interval_seconds
        if age > limit:
            what = "last collection" if self.last_completed_at is not None else "start"
            return False, f"no completed GPU collection for {age:.1f}s since {what} (limit {limit:.1f}s)"
        return True, "ok"


def _handler(
    registry: prometheus_client.CollectorRegistry | None, liveness: Liveness, idle_timeout_seconds: float
) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = idle_timeout_seconds  # socket timeout of every read and write: an idle client is dropped

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/healthz", "/readyz"):
                ok, message = liveness.check() if path == "/healthz" else liveness.ready()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", (message + "\n").encode())
            elif path == "/metrics" and registry is not None:
                self._send(
                    200, prometheus_client.CONTENT_TYPE_LATEST, prometheus_client.generate_latest(registry)
                )
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the agent's own log

    return Handler


class _BoundedServer(http.server.ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once; others are closed at once.

    With the handler's socket timeout, a client that connects and sends nothing (or trickles)
    holds a thread for at most the idle timeout per read, and never more than the bound in all:
    the agent's memory and its probes' answers do not depend on who connects to it.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class HealthServer:
    """A small threaded HTTP server, bounded (`_BoundedServer`); port 0 picks a free port (see `.port`)."""

    def __init__(
        self,
        port: int,
        liveness: Liveness,
        registry: prometheus_client.CollectorRegistry | None,
        host: str = "0.0.0.0",
        *,
        idle_timeout_seconds: float = IDLE_TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.server = _BoundedServer(
            (host, port), _handler(registry, liveness, idle_timeout_seconds), max_connections
        )
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="health-http", daemon=True)

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
