"""Where the API server is and how to authenticate: in-cluster, or a kubeconfig's current context.

Read here rather than with the Kubernetes client's loader: importing that
package loads its ~250 generated models, ~40 MiB of the operator's memory
for a few fields of YAML. What this reads: the ServiceAccount's token and CA
in a pod; in a kubeconfig, the current context's server, CA (file or data),
`insecure-skip-tls-verify`, and a token (or token file) or a client
certificate and key (files or data). A user authenticated any other way (an
`exec` plugin, an `auth-provider`) raises `NeedsClientLoader`, and `kube`
falls back to the client's loader for it.
"""

from __future__ import annotations

import atexit
import base64
import dataclasses
import functools
import hashlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

import yaml

from gpuhealth_api import kubeconfig_check

IN_CLUSTER_DIR = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(Exception):
    """No usable configuration: names what is missing or malformed."""


class NeedsClientLoader(Exception):
    """The kubeconfig's user authenticates in a way only the Kubernetes client implements."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    """Where the API server is and how to authenticate to it."""

    server: str
    ca_path: str | None
    insecure: bool
    certificate_path: str | None
    private_key_path: str | None
    token: str | None
    token_path: str | None = None
    """In-cluster: the projected ServiceAccount token file, which the kubelet rotates; re-read often."""


def in_cluster(
    directory: pathlib.Path = IN_CLUSTER_DIR, env: Mapping[str, str] = os.environ
) -> Credentials | None:
    """The pod's ServiceAccount, or None outside a pod (no service host in the environment)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    token_path = directory / "token"
    if not host or not port or not token_path.is_file():
        return None
    host = f"[{host}]" if ":" in host else host
    ca = directory / "ca.crt"
    return Credentials(
        server=f"https://{host}:{port}",
        ca_path=str(ca) if ca.is_file() else None,
        insecure=False,
        certificate_path=None,
        private_key_path=None,
        token=token_path.read_text().strip(),
        token_path=str(token_path),
    )


def default_path(env: Mapping[str, str] = os.environ) -> pathlib.Path:
    """$KUBECONFIG's first file, else ~/.kube/config."""
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    return pathlib.Path(listed[0]) if listed else pathlib.Path.home() / ".kube" / "config"


def from_file(path: pathlib.Path) -> Credentials:
    """The current context of the kubeconfig at `path`."""
    problem = kubeconfig_check.problem(path)  # the same one-line words as the agent's and the simulator's
    if problem is not None:
        raise ConfigError(problem)
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"kubeconfig {path}: {error}") from error
    if not isinstance(config, dict):
        raise ConfigError(f"kubeconfig {path}: not a mapping")
    name = config.get("current-context")
    context = _named(config, "contexts", "context", name, path)
    cluster = _named(config, "clusters", "cluster", context.get("cluster"), path)
    user = _named(config, "users", "user", context.get("user"), path) if context.get("user") else {}
    if any(k in user for k in ("exec", "auth-provider", "username")):
        raise NeedsClientLoader(f"kubeconfig {path}: user {context.get('user')!r} needs the client's loader")
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise ConfigError(f"kubeconfig {path}: cluster {context.get('cluster')!r} has no server")
    base = path.parent
    token = user.get("token")
    if token is None and user.get("tokenFile"):
        token = (base / str(user["tokenFile"])).read_text().strip()
    return Credentials(
        server=server.rstrip("/"),
        ca_path=_file(cluster, "certificate-authority", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        certificate_path=_file(user, "client-certificate", base),
        private_key_path=_file(user, "client-key", base),
        token=str(token) if token else None,
    )


def _named(
    config: Mapping[str, Any], section: str, field: str, name: object, path: pathlib.Path
) -> dict[str, Any]:
    for item in config.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name and isinstance(item.get(field), dict):
            found: dict[str, Any] = item[field]
            return found
    raise ConfigError(f"kubeconfig {path}: no {field} named {name!r} in {section}")


def _file(section: Mapping[str, Any], key: str, base: pathlib.Path) -> str | None:
    """A file holding `key`'s PEM: the named one (relative to the kubeconfig), or `<key>-data` written out
    (`_written`)."""
    data = section.get(f"{key}-data")
    if data:
        return _written(base64.b64decode(data))
    named = section.get(key)
    return str(base / str(named)) if named else None


def _written(pem: bytes) -> str:
    """`pem` in a file of a directory only this process uses (0700), removed when it exits: TLS reads
    a client key from a file only, and a copy left per start would pile up keys in the temp directory.
    Named by its content, so it is written once however often the kubeconfig is read (each leader term
    reads it)."""
    path = _directory() / f"{hashlib.sha256(pem).hexdigest()}.pem"
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(pem)
    return str(path)


@functools.cache
def _directory() -> pathlib.Path:
    directory = tempfile.mkdtemp(prefix="gpu-health-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return pathlib.Path(directory)
