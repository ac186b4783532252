"""`gpu-health-operator apply-crds`: bring the cluster's CRDs up to the chart's, never down.

Helm installs a chart's crds/ on `helm install` and never touches them again, so a `helm upgrade`
that adds a field leaves the old schema in the cluster. The chart therefore also ships its CRDs in a
ConfigMap (with the chart's version), and the operator pod's init container runs this step before the
operator starts: each CRD that exists and carries an older stamp (or none: Helm created it) is
server-side applied, field manager `gpu-health-operator`, and stamped with the chart's version. An
equal or newer stamp is left alone, so a rollback, or an older release beside a newer one, never takes
fields away. A missing CRD is Helm's to create: the operator may patch its two CRDs, not create one.
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any, Final

import yaml

from gpuhealth_api import keys

log = logging.getLogger(__name__)

VERSION_ANNOTATION: Final = keys.CRDS_VERSION_ANNOTATION
FIELD_MANAGER: Final = "gpu-health-operator"
VERSION_KEY: Final = "version"
"""The ConfigMap key holding the chart's version; every other `*.yaml` key is one CRD manifest."""
EXIT_USAGE: Final = 2

_VERSION: Final = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+.*)?$")


def _key(version: str) -> tuple[int, int, int, int, tuple[Any, ...]] | None:
    """A sortable SemVer key (a release sorts after its pre-releases), or None if not SemVer."""
    match = _VERSION.match(version.strip())
    if match is None:
        return None
    major, minor, patch, pre = match.groups()
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in (pre or "").split(".") if p)
    return int(major), int(minor), int(patch), 0 if pre else 1, parts


def should_apply(live: dict[str, Any] | None, bundled_version: str) -> bool:
    """Whether to apply the bundled manifest over `live` (the cluster's CRD, None if absent)."""
    if live is None:
        return False
    stamp = (live.get("metadata", {}).get("annotations") or {}).get(VERSION_ANNOTATION)
    if not stamp:
        return True  # Helm's crds/ copy, never applied by us: ours is at least as new
    new, old = _key(bundled_version), _key(stamp)
    if new is None or old is None:
        return False  # cannot tell which is newer: leave it (a human can `kubectl apply`)
    return new > old


def stamped(manifest: dict[str, Any], version: str) -> dict[str, Any]:
    """The manifest with the version stamp added (a copy)."""
    out = copy.deepcopy(manifest)
    out.setdefault("metadata", {}).setdefault("annotations", {})[VERSION_ANNOTATION] = version
    return out


def apply_from_configmap(api_client: Any, namespace: str, name: str) -> list[str]:
    """Apply every CRD of ConfigMap namespace/name that should be; the names applied."""
    from kubernetes import client  # noqa: PLC0415  (the operator's main loop imports no client)
    from kubernetes.client.exceptions import ApiException  # noqa: PLC0415

    core = client.CoreV1Api(api_client)
    extensions = client.ApiextensionsV1Api(api_client)
    data: dict[str, str] = core.read_namespaced_config_map(name, namespace).data or {}
    version = data.get(VERSION_KEY, "")
    applied = []
    for key in sorted(k for k in data if k.endswith(".yaml")):
        manifest = yaml.safe_load(data[key])
        crd = manifest["metadata"]["name"]
        try:
            live = api_client.sanitize_for_serialization(extensions.read_custom_resource_definition(crd))
        except ApiException as error:
            if error.status != 404:
                raise
            live = None
        if not should_apply(live, version):
            log.info("CRD %s: left as it is (cluster stamp %s, chart %s)", crd, _stamp(live), version)
            continue
        # Server-side apply: the chart's fields become ours (field manager), forced over Helm's create.
        extensions.patch_custom_resource_definition(
            crd,
            stamped(manifest, version),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        log.info("CRD %s: applied the chart %s manifest (cluster stamp was %s)", crd, version, _stamp(live))
        applied.append(crd)
    return applied


def _stamp(live: dict[str, Any] | None) -> str:
    if live is None:
        return "absent"
    return str((live.get("metadata", {}).get("annotations") or {}).get(VERSION_ANNOTATION, "none"))


def _api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client, config  # noqa: PLC0415

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu-health-operator apply-crds",
        description="Server-side apply the chart's CRDs (from a ConfigMap) over older ones; never downgrade.",
    )
    parser.add_argument("--configmap", required=True, help="NAMESPACE/NAME of the ConfigMap holding the CRDs")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespace, _, name = args.configmap.partition("/")
    if not namespace or not name:
        print("gpu-health-operator apply-crds: --configmap must be NAMESPACE/NAME", file=sys.stderr)
        return EXIT_USAGE
    with _api_client(args.kubeconfig) as api_client:
        apply_from_configmap(api_client, namespace, name)
    return 0
