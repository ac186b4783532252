"""`trace import` through an authenticating proxy in front of a real Prometheus, as managed services are.

Debian's `prometheus` runs on the loopback and scrapes a /metrics page of the
agent's own series (one node, two GPUs, `AgentMetrics` of a status). In front
of it, a proxy written here with the standard library: TLS with a certificate
from a test CA (openssl, the control plane's `pki`), a client certificate
required, and every request must carry the tenant header and a bearer token
or basic auth; it forwards what passes to Prometheus. Then, as a user runs
it: `gpu-health-sim trace import --prometheus https://… --ca-file … --cert-file
… --key-file … --bearer-token-file … --header 'X-Scope-OrgID: …'`. What the
proxy refuses is said as the proxy said it, and a TLS refusal is not retried.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.server
import importlib.util
import json
import shutil
import ssl
import subprocess
import sys
import threading
import types
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import prometheus_client
import pytest

from gpuhealth_agent import metrics
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import pki, ports

pytestmark = pytest.mark.e2e

BIN: Final = Path(sys.executable).parent
TOKEN: Final = "s3cr3t-token"
USER, PASSWORD = "grafana", "pa55word"
TENANT_HEADER, TENANT = "X-Scope-OrgID", "team-a"
NODE: Final = "auth-node-0"


def _prometheus_module() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "e2e_prometheus", Path(__file__).with_name("test_prometheus.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def agent_page() -> bytes:
    """The agent's /metrics after one collection of a healthy two-GPU node."""
    registry = prometheus_client.CollectorRegistry()
    healthy = {"temperatureCelsius": 50, "smClockMHz": 1980, "maxSmClockMHz": 1980, "powerWatts": 400.0}
    gpus = [
        {"index": i, "uuid": f"GPU-{i}", **healthy, "utilizationPercent": 90, "clockEventReasons": [],
         "ecc": {"uncorrectedVolatile": 0, "correctedVolatile": 0}, "recoveryAction": "None"}
        for i in range(2)
    ]  # fmt: skip
    sample = types.SimpleNamespace(
        time=0.0,
        gpus=gpus,
        nics=None,
        expected_gpus=2,
        errors=Counter(),
        duration_seconds=0.01,
        driver_version=None,
    )
    metrics.AgentMetrics(registry).observe(sample)  # type: ignore[arg-type]  # the fields observe reads
    return bytes(prometheus_client.generate_latest(registry))


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler], tls: ssl.SSLContext | None) -> Iterator[str]:
    (port,) = ports.free_ports(1)
    server = http.server.ThreadingHTTPServer((ports.LOOPBACK, port), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://{ports.LOOPBACK}:{port}"
    finally:
        server.shutdown()
        server.server_close()


def proxy_handler(upstream: str, seen: list[dict[str, str]]) -> type[http.server.BaseHTTPRequestHandler]:
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})  # names are case-blind
            authorized = self.headers.get("Authorization") in {f"Bearer {TOKEN}", basic}
            if not authorized or self.headers.get(TENANT_HEADER) != TENANT:
                self._answer(401, json.dumps({"status": "error", "error": "unauthorized"}).encode())
                return
            with urllib.request.urlopen(upstream + self.path, timeout=30) as response:
                self._answer(response.status, response.read())

        def _answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    return Proxy


@dataclasses.dataclass(frozen=True)
class Setup:
    url: str
    ca: Path
    client: pki.CertKey
    token: Path
    password: Path
    seen: list[dict[str, str]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    workdir = tmp_path_factory.mktemp("prometheus-auth")
    page = agent_page()

    class Agent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *_: Any) -> None:
            pass

    authority = pki.create(workdir / "pki", service_ip="127.0.0.1")
    client = pki.client_cert(authority, "importer", user="importer")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(authority.ca.cert))
    tls.load_cert_chain(str(authority.serving.cert), str(authority.serving.key))
    tls.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: no client certificate, no handshake
    (workdir / "token").write_text(TOKEN + "\n")
    (workdir / "password").write_text(PASSWORD + "\n")
    seen: list[dict[str, str]] = []
    with serving(Agent, None) as agent:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "gpu-health-agent",
                    "static_configs": [
                        {"targets": [agent.removeprefix("http://")], "labels": {"node": NODE}}
                    ],
                }
            ],
        }
        prometheus = _prometheus_module().Prometheus(binary, workdir, config, {"groups": []})
        prometheus.process.start()
        try:
            waiting.wait_until(prometheus.ready, timeout_seconds=60, message="Prometheus ready")
            waiting.wait_until(
                lambda: prometheus.query("count_over_time(gpuhealth_agent_gpus[1m]) >= 5"),
                timeout_seconds=60,
                message="five scrapes of the agent stored",
            )
            with serving(proxy_handler(prometheus.url, seen), tls) as url:
                yield Setup(url, authority.ca.cert, client, workdir / "token", workdir / "password", seen)
        except BaseException:
            print(f"----- prometheus -----\n{prometheus.process.log_tail(30)}")
            raise
        finally:
            prometheus.process.stop(grace_seconds=10)


def trace_import(setup: Setup, out: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gpu-health-sim"), "trace", "import", "--prometheus", setup.url, "--since", "4s",
         "--step", "1s", "--quiet", "--out", str(out), *flags],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def tls_flags(setup: Setup) -> list[str]:
    return [
        "--ca-file",
        str(setup.ca),
        "--cert-file",
        str(setup.client.cert),
        "--key-file",
        str(setup.client.key),
    ]


def test_bearer_token_tenant_header_ca_and_client_certificate(setup: Setup, tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl.gz"
    done = trace_import(
        setup,
        out,
        *tls_flags(setup),
        "--bearer-token-file",
        str(setup.token),
        "--header",
        f"{TENANT_HEADER}: {TENANT}",
    )
    assert done.returncode == 0, done.stderr
    assert "1 nodes" in done.stdout, done.stdout
    last = setup.seen[-1]
    assert last["authorization"] == f"Bearer {TOKEN}" and last[TENANT_HEADER.lower()] == TENANT


def test_basic_auth(setup: Setup, tmp_path: Path) -> None:
    done = trace_import(
        setup, tmp_path / "trace.jsonl.gz", *tls_flags(setup),
        "--basic-auth-user", USER, "--basic-auth-password-file", str(setup.password),
        "--header", f"{TENANT_HEADER}: {TENANT}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "1 nodes" in done.stdout, done.stdout


def test_what_the_proxy_refuses_is_said(setup: Setup, tmp_path: Path) -> None:
    out = tmp_path / "trace.jsonl.gz"
    no_tenant = trace_import(setup, out, *tls_flags(setup), "--bearer-token-file", str(setup.token))
    assert no_tenant.returncode == 3 and "HTTP 401: unauthorized" in no_tenant.stderr, no_tenant.stderr

    untrusted = trace_import(setup, out, "--bearer-token-file", str(setup.token))  # the system CAs only
    assert untrusted.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr, untrusted.stderr

    anonymous = trace_import(setup, out, "--ca-file", str(setup.ca), "--header", f"{TENANT_HEADER}: {TENANT}")
    assert anonymous.returncode == 3 and "cannot read Prometheus" in anonymous.stderr, anonymous.stderr

    both = trace_import(setup, out, "--bearer-token-file", str(setup.token), "--basic-auth-user", USER)
    assert both.returncode == 2 and "one Authorization scheme" in both.stderr, both.stderr
