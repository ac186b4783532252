"""Write self-contained kubeconfig files (certificates embedded, nothing else referenced)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from gpuhealth_api import kubeconfig_check
from gpuhealth_sim.controlplane import pki

CLUSTER_NAME = "gpu-health-local"


def write(
    path: Path,
    *,
    server: str,
    ca_cert: Path,
    user: str,
    client: pki.CertKey | None = None,
    token: str | None = None,
) -> Path:
    """Write a kubeconfig for `user` at `server`, trusting `ca_cert`, authenticated by `client` or `token`."""
    credentials: dict[str, str] = {}
    if client is not None:
        credentials["client-certificate-data"] = _b64(client.cert)
        credentials["client-key-data"] = _b64(client.key)
    if token is not None:
        credentials["token"] = token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": _b64(ca_cert)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": user,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def unusable(kubeconfig: str | Path | None, context: str | None = None) -> str | None:
    """What is wrong with the kubeconfig the client's loader would read (`kubeconfig`, else $KUBECONFIG,
    else ~/.kube/config) for `context`, in one line naming the file; None when it looks usable."""
    return kubeconfig_check.problem(kubeconfig or kubeconfig_check.default_path(), context)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")
