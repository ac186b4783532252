"""How `trace import` authenticates to Prometheus: headers and TLS, from the standard library only.

Managed Prometheus services and authenticating proxies (Grafana Mimir, Thanos
behind oauth2-proxy, Amazon Managed Prometheus' gateways, Cortex) want one
or more of: a bearer token, basic auth, extra headers such as a tenant
(`X-Scope-OrgID`), a private CA, a client certificate. Secrets are read from
files (never command-line arguments, which `ps` shows to every user).
"""

from __future__ import annotations

import base64
import dataclasses
import pathlib
import ssl
from collections.abc import Mapping, Sequence


class AuthError(ValueError):
    """The authentication flags cannot be used (a missing file, a malformed header, two schemes)."""


@dataclasses.dataclass(frozen=True)
class Auth:
    bearer_token: str | None = None
    basic_user: str | None = None
    basic_password: str = ""
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ca_file: str | None = None
    """PEM CA bundle to verify Prometheus' certificate with (default: the system's)."""
    cert_file: str | None = None
    """PEM client certificate (with its key, or `key_file`) for mutual TLS."""
    key_file: str | None = None

    def request_headers(self) -> dict[str, str]:
        """Every request's headers: the extra ones, then Authorization (which they may not override)."""
        headers = dict(self.headers)
        if self.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        elif self.basic_user is not None:
            pair = f"{self.basic_user}:{self.basic_password}".encode()
            headers["Authorization"] = f"Basic {base64.b64encode(pair).decode('ascii')}"
        return headers

    def ssl_context(self) -> ssl.SSLContext | None:
        """A TLS context when a CA or client certificate is given; None: urllib's default (system CAs)."""
        if self.ca_file is None and self.cert_file is None:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise AuthError(f"cannot load the TLS files: {error}") from error
        return context


def header(text: str) -> tuple[str, str]:
    """`Name: value` (as curl -H takes it) as (name, value)."""
    name, colon, value = text.partition(":")
    name = name.strip()
    if not colon or not name or any(c.isspace() for c in name):
        raise AuthError(f"--header {text!r} is not NAME: VALUE")
    return name, value.strip()


def secret(path: str, what: str) -> str:
    """The first line of a secret file (a trailing newline is not part of a token)."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as error:
        raise AuthError(f"cannot read {what} {path}: {error.strerror or error}") from error
    return text.splitlines()[0].strip() if text.strip() else ""


def from_flags(
    *,
    bearer_token_file: str | None,
    basic_auth_user: str | None,
    basic_auth_password_file: str | None,
    headers: Sequence[str],
    ca_file: str | None,
    cert_file: str | None,
    key_file: str | None,
) -> Auth:
    if bearer_token_file and basic_auth_user:
        raise AuthError("--bearer-token-file and --basic-auth-user: one Authorization scheme, not two")
    if basic_auth_password_file and not basic_auth_user:
        raise AuthError("--basic-auth-password-file needs --basic-auth-user")
    if key_file and not cert_file:
        raise AuthError("--key-file needs --cert-file")
    extra = dict(header(h) for h in headers)
    if any(name.lower() == "authorization" for name in extra) and (bearer_token_file or basic_auth_user):
        raise AuthError("an Authorization --header and --bearer-token-file/--basic-auth-user: choose one")
    auth = Auth(
        bearer_token=secret(bearer_token_file, "--bearer-token-file") if bearer_token_file else None,
        basic_user=basic_auth_user,
        basic_password=(
            secret(basic_auth_password_file, "--basic-auth-password-file") if basic_auth_password_file else ""
        ),
        headers=extra,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )
    auth.ssl_context()  # a bad file is a usage error now, not a network error later
    return auth
