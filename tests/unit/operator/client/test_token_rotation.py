"""In-cluster tokens are bound and expire: the operator must send the rotated token, not the first."""

import asyncio
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhealth_operator.client import auth, kube


@pytest.fixture
def server() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_rotated_service_account_token_is_sent(
    server: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = server
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    monkeypatch.setattr(auth, "TOKEN_REREAD_SECONDS", 0.0)
    credentials = kube.Credentials(url, None, True, None, None, "first", token_path=str(token_file))

    async def two_requests() -> None:
        client = kube.Kube(credentials)
        try:
            await client.get("/api")
            token_file.write_text("rotated\n")  # the kubelet refreshed the projected token
            await client.get("/api")
        finally:
            await client.close()

    asyncio.run(two_requests())
    assert seen == ["Bearer first", "Bearer rotated"]


def test_a_kubeconfig_token_is_used_as_given(server: tuple[str, list[str]]) -> None:
    url, seen = server
    credentials = kube.Credentials(url, None, True, None, None, "static")

    async def one_request() -> None:
        client = kube.Kube(credentials)
        try:
            await client.get("/api")
        finally:
            await client.close()

    asyncio.run(one_request())
    assert seen == ["Bearer static"]
