"""HTTP health probes of the control-plane components.

http.client rather than urllib: no proxy settings apply, and the socket is
closed even when the request fails (urllib leaks it, a ResourceWarning that
pytest turns into an error).
"""

from __future__ import annotations

import http.client
import ssl
import urllib.parse
from pathlib import Path

from gpuhealth_sim.controlplane import pki, ports

TLS = ssl.SSLContext


def client_tls(ca_cert: Path, client: pki.CertKey) -> TLS:
    """Verify the server against `ca_cert` and authenticate with `client`'s certificate."""
    context = ssl.create_default_context(cafile=str(ca_cert))
    context.load_cert_chain(str(client.cert), str(client.key))
    return context


def get_ok(url: str, tls: TLS | None) -> bool:
    """True if GET `url` answers 200; connection errors propagate (wait_until retries them)."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or ports.LOOPBACK, parts.port
    connection = (
        http.client.HTTPSConnection(host, port, timeout=2, context=tls)
        if parts.scheme == "https"
        else http.client.HTTPConnection(host, port, timeout=2)
    )
    try:
        connection.request("GET", parts.path or "/")
        response = connection.getresponse()
        response.read()
        return response.status == 200
    finally:
        connection.close()


def insecure_tls() -> TLS:
    """For the controller manager's and scheduler's self-signed health endpoints on loopback."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
