"""`trace import`'s authentication flags: the headers every request carries, and what is refused."""

import base64
import pathlib
from typing import Any

import pytest

from gpuhealth_sim.backtest import http_auth


def flags(**given: object) -> dict[str, Any]:
    none = dict.fromkeys(
        (
            "bearer_token_file",
            "basic_auth_user",
            "basic_auth_password_file",
            "ca_file",
            "cert_file",
            "key_file",
        )
    )
    return {**none, "headers": [], **given}


def test_bearer_token_from_a_file_and_extra_headers(tmp_path: pathlib.Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    auth = http_auth.from_flags(
        **flags(bearer_token_file=str(tmp_path / "token"), headers=["X-Scope-OrgID: t1"])
    )
    assert auth.request_headers() == {"X-Scope-OrgID": "t1", "Authorization": "Bearer abc"}
    assert auth.ssl_context() is None  # urllib's default: the system's CAs


def test_basic_auth(tmp_path: pathlib.Path) -> None:
    (tmp_path / "pw").write_text("p:w\n")
    auth = http_auth.from_flags(**flags(basic_auth_user="u", basic_auth_password_file=str(tmp_path / "pw")))
    assert auth.request_headers()["Authorization"] == "Basic " + base64.b64encode(b"u:p:w").decode()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"bearer_token_file": "/t", "basic_auth_user": "u"}, "one Authorization scheme"),
        ({"basic_auth_password_file": "/p"}, "needs --basic-auth-user"),
        ({"key_file": "/k"}, "needs --cert-file"),
        ({"headers": ["no colon"]}, "is not NAME: VALUE"),
        ({"bearer_token_file": "/nonexistent/token"}, "cannot read --bearer-token-file"),
        ({"ca_file": "/nonexistent/ca.pem"}, "cannot load the TLS files"),
    ],
)
def test_unusable_flags_are_refused(given: dict[str, object], said: str) -> None:
    with pytest.raises(http_auth.AuthError, match=said):
        http_auth.from_flags(**flags(**given))
