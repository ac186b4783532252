"""Certificates and keys for the local control plane, made with the openssl CLI.

One throwaway CA signs the API server's serving certificate and one client
certificate per identity, so the admin kubeconfig verifies TLS and each
component authenticates as the user RBAC expects (system:kube-scheduler, ...).
The service-account key pair signs TokenRequest tokens. The openssl CLI is
used instead of a Python crypto package to keep test dependencies at zero;
EC keys make generation take milliseconds.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path
from typing import Final

_CONFIG: Final = "[req]\ndistinguished_name = dn\n[dn]\n"
_EC_KEY: Final = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-noenc")
_DAYS: Final = "3650"


class PkiError(RuntimeError):
    """openssl is missing or failed."""


@dataclasses.dataclass(frozen=True)
class CertKey:
    """A PEM certificate and its PEM private key on disk."""

    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class Pki:
    """Everything the control plane needs to authenticate its parts."""

    ca: CertKey
    """Signs every certificate below; the kubeconfigs trust it."""
    serving: CertKey
    """The API server's serving certificate (127.0.0.1, localhost, kubernetes.default...)."""
    service_account_key: Path
    """RSA private key that signs service-account tokens."""
    service_account_public_key: Path
    """Its public half, which the API server uses to verify them."""


def create(directory: Path, *, service_ip: str) -> Pki:
    """Generate a fresh CA, serving certificate and service-account key pair in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "openssl.cnf"
    config.write_text(_CONFIG)
    ca = CertKey(directory / "ca.crt", directory / "ca.key")
    _openssl(
        "req", "-config", str(config), "-x509", *_EC_KEY, "-days", _DAYS,
        "-keyout", str(ca.key), "-out", str(ca.cert), "-subj", "/CN=gpu-health-local-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
    )  # fmt: skip
    names = [
        "IP:127.0.0.1",
        f"IP:{service_ip}",
        "DNS:localhost",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
    serving = _issue(
        directory, config, ca, "apiserver", subject="/CN=kube-apiserver", usage="serverAuth", names=names
    )
    sa_key, sa_pub = directory / "service-account.key", directory / "service-account.pub"
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(sa_key))
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub))
    return Pki(ca=ca, serving=serving, service_account_key=sa_key, service_account_public_key=sa_pub)


def client_cert(pki: Pki, name: str, *, user: str, groups: tuple[str, ...] = ()) -> CertKey:
    """Issue a client certificate for `user` in `groups`, stored next to the CA as `name`.crt/.key."""
    directory = pki.ca.cert.parent
    subject = "".join(f"/O={group}" for group in groups) + f"/CN={user}"
    return _issue(
        directory, directory / "openssl.cnf", pki.ca, name, subject=subject, usage="clientAuth", names=[]
    )


def _issue(
    directory: Path, config: Path, ca: CertKey, name: str, *, subject: str, usage: str, names: list[str]
) -> CertKey:
    issued = CertKey(directory / f"{name}.crt", directory / f"{name}.key")
    extensions = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature",
        f"extendedKeyUsage={usage}",
    ]
    if names:
        extensions.append("subjectAltName=" + ",".join(names))
    _openssl(
        "req", "-config", str(config), "-x509", *_EC_KEY, "-days", _DAYS,
        "-keyout", str(issued.key), "-out", str(issued.cert), "-subj", subject,
        "-CA", str(ca.cert), "-CAkey", str(ca.key),
        *[arg for extension in extensions for arg in ("-addext", extension)],
    )  # fmt: skip
    return issued


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PkiError("the openssl command is required to create the control plane's certificates")
    result = subprocess.run([openssl, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise PkiError(f"openssl {args[0]} failed (exit {result.returncode}): {result.stderr.strip()}")
