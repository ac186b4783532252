"""Where the API server is and how to authenticate to it, and the in-cluster token as it rotates.

Read by `kubeconfigs` (in-cluster, or a kubeconfig's token or client certificate: no Kubernetes client
imported, ~40 MiB); a kubeconfig user that authenticates through an exec plugin or an auth-provider
goes to the official client's own loader, imported only then.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib

from gpuhealth_operator.client import kubeconfigs
from gpuhealth_operator.client.kubeconfigs import Credentials

logger = logging.getLogger(__name__)

TOKEN_REREAD_SECONDS = 60.0
"""The kubelet refreshes a projected token at 80% of its life (at least an hour): a minute is ample."""


async def load_credentials(kubeconfig: pathlib.Path | None) -> Credentials:
    """Read credentials: the given kubeconfig, else in-cluster, else $KUBECONFIG/~/.kube/config."""
    try:
        if kubeconfig is not None:
            return kubeconfigs.from_file(kubeconfig)
        return kubeconfigs.in_cluster() or kubeconfigs.from_file(kubeconfigs.default_path())
    except kubeconfigs.NeedsClientLoader:
        return await _client_loader(kubeconfig)


async def _client_loader(kubeconfig: pathlib.Path | None) -> Credentials:
    """The Kubernetes client's kubeconfig loader, for what `kubeconfigs` does not read (exec plugins)."""
    from kubernetes.aio import config as kconfig  # noqa: PLC0415 - ~40 MiB, only when needed
    from kubernetes.aio.client import configuration as kconfiguration  # noqa: PLC0415

    cfg = kconfiguration.Configuration()
    await kconfig.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig) if kubeconfig is not None else None, client_configuration=cfg
    )
    header = await cfg.get_api_key_with_prefix("BearerToken") or await cfg.get_api_key_with_prefix(
        "authorization"
    )
    token = header.split(" ", 1)[-1] if header else None
    return Credentials(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        token=token,
    )


def reread_token(credentials: Credentials) -> Credentials:
    """The credentials with their token file read again (bound tokens expire); as they were where there
    is no file, it cannot be read (a warning) or it is empty."""
    path = credentials.token_path
    if not path:
        return credentials
    try:
        fresh = pathlib.Path(path).read_text().strip()
    except OSError as error:
        logger.warning("could not re-read the ServiceAccount token %s: %s", path, error)
        return credentials
    return dataclasses.replace(credentials, token=fresh) if fresh else credentials
