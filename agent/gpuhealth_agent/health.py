"""The agent's HTTP endpoint: /metrics for Prometheus and /healthz for the kubelet.

/healthz fails (503) when no collection has completed for 3 intervals: a
hung NVML call must restart the agent rather than leave it "alive" while
its facts go stale (the heartbeat stops too, so the operator sees the node
as stale in the meantime).
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Callable
from typing import Final

import prometheus_client

MISSED_INTERVALS: Final = 3


@dataclasses.dataclass
class Liveness:
    interval_seconds: float
    clock: Callable[[], float] = time.time
    started_at: float = dataclasses.field(default_factory=time.time)
    last_completed_at: float | None = None

    def completed(self, when: float) -> None:
        self.last_completed_at = when

    def check(self) -> tuple[bool, str]:
        reference = self.last_completed_at if self.last_completed_at is not None else self.started_at
        age = self.clock() - reference
        limit = MISSED_INTERVALS * self.interval_seconds
        if age > limit:
            what = "last collection" if self.last_completed_at is not None else "start"
            return False, f"no completed GPU collection for {age:.1f}s since {what} (limit {limit:.1f}s)"
        return True, "ok"


def _handler(registry: prometheus_client.CollectorRegistry | None, liveness: Liveness) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok, message = liveness.check()
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


class HealthServer:
    """A small threaded HTTP server; port 0 picks a free port (see `.port`)."""

    def __init__(
        self,
        port: int,
        liveness: Liveness,
        registry: prometheus_client.CollectorRegistry | None,
        host: str = "0.0.0.0",
    ) -> None:
        self.server = http.server.ThreadingHTTPServer((host, port), _handler(registry, liveness))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="health-http", daemon=True)

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
