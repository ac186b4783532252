"""`--dcgm-exporter auto` against a real kube-apiserver: the exporter pod on the agent's node, scraped.

Exporter pods carry kwok's status annotation, so the test writes their status
as the kubelet would, with pod IP 127.0.0.1 (or another loopback address): a
local HTTP server serving a canned dcgm-exporter payload stands in for the
exporter behind the pod IP the agent looks up.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpuhealth_agent import dcgm, dcgm_discovery
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

PAYLOAD = (
    Path(__file__).resolve().parents[1] / "unit" / "agent" / "fixtures" / "dcgm-exporter-metrics.txt"
).read_text()
UUID0 = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
LABELS = {"app": "nvidia-dcgm-exporter"}


def kwok_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"}, "labels": {"type": "kwok"}},
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
    }


@pytest.fixture
def nodes(crds: local.ControlPlane, k8s: client.ApiClient) -> Iterator[tuple[str, str]]:
    core = client.CoreV1Api(k8s)
    names = ("itdcgm-ours", "itdcgm-other")
    for name in names:
        core.create_node(body=kwok_node(name))
    try:
        yield names
    finally:
        for name in names:
            core.delete_node(name)


@pytest.fixture
def exporter() -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = PAYLOAD.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def exporter_pod(
    core: client.CoreV1Api, namespace: str, name: str, node: str, labels: dict[str, str]
) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {local.KWOK_STATUS_ANNOTATION: "custom"},
            },
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "exporter", "image": "registry.k8s.io/pause:3.10"}],
                "terminationGracePeriodSeconds": 0,
            },
        },
    )


def set_status(core: client.CoreV1Api, namespace: str, name: str, ip: str, ready: bool) -> None:
    value = "True" if ready else "False"
    core.patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "conditions": [
                    {"type": "Ready", "status": value},
                    {"type": "ContainersReady", "status": value},
                ],
            }
        },
    )


def test_the_agent_scrapes_the_exporter_pod_on_its_own_node(
    k8s: client.ApiClient, namespace: str, nodes: tuple[str, str], exporter: int
) -> None:
    ours, other = nodes
    core = client.CoreV1Api(k8s)
    exporter_pod(core, namespace, "exporter-other-node", other, LABELS)
    exporter_pod(core, namespace, "not-an-exporter", ours, {"app": "something-else"})
    exporter_pod(core, namespace, "exporter", ours, LABELS)
    set_status(core, namespace, "exporter-other-node", "127.0.0.2", ready=True)
    set_status(core, namespace, "not-an-exporter", "127.0.0.3", ready=True)
    set_status(core, namespace, "exporter", "127.0.0.1", ready=True)

    # A tenant's look-alike on our node, in the tenant's own namespace, sorting first by name.
    tenant = f"{namespace}-tenant"
    core.create_namespace({"metadata": {"name": tenant}})
    try:
        exporter_pod(core, tenant, "a-lookalike", ours, LABELS)
        set_status(core, tenant, "a-lookalike", "127.0.0.9", ready=True)
        scrapes_the_exporter_not_the_lookalike(k8s, core, namespace, ours, exporter)
    finally:
        core.delete_namespace(tenant)


def scrapes_the_exporter_not_the_lookalike(
    k8s: client.ApiClient, core: client.CoreV1Api, namespace: str, ours: str, exporter: int
) -> None:
    # In all namespaces, the look-alike would be the node's exporter: why the agent's default is the
    # GPU Operator's namespace (`dcgm_discovery.DEFAULT_NAMESPACE`).
    anywhere = dcgm_discovery.Locator(dcgm_discovery.ApiPodLister(k8s), ours, port=exporter)
    waiting.wait_until(
        lambda: "127.0.0.9" in (anywhere.forget() or anywhere.url()),
        timeout_seconds=30,
        message="the look-alike listed in all namespaces",
    )

    # The exporter's namespace, as the agent's default names the GPU Operator's: the look-alike is not asked.
    lister = dcgm_discovery.ApiPodLister(k8s)
    locator = dcgm_discovery.Locator(lister, ours, namespace=namespace, port=exporter)
    source = dcgm.DcgmSource(locator=locator)
    facts: list[dict[str, dcgm.GpuFacts] | None] = []

    def scraped() -> bool:
        locator.forget()  # the status write may not be visible to the first list yet
        facts[:] = [source.scrape()]
        return facts[0] is not None

    waiting.wait_until(scraped, timeout_seconds=30, message=f"a scrape of the exporter pod on {ours}")
    assert source.url == f"http://127.0.0.1:{exporter}/metrics"
    got = facts[0]
    assert got is not None and got[UUID0].dbe_volatile == 3

    # The exporter pod turns unready (being replaced): nothing to scrape, said with where it looked.
    set_status(core, namespace, "exporter", "127.0.0.1", ready=False)
    locator.forget()
    waiting.wait_until(
        lambda: source.scrape() is None, timeout_seconds=30, message="the unready exporter pod left out"
    )
    assert source.last_error is not None
    assert "no Running, Ready pod" in source.last_error and ours in source.last_error

    # In another namespace than the one given: not found either.
    set_status(core, namespace, "exporter", "127.0.0.1", ready=True)
    elsewhere = dcgm_discovery.Locator(
        dcgm_discovery.ApiPodLister(k8s), ours, namespace="default", port=exporter
    )
    with pytest.raises(dcgm_discovery.NotFoundError):
        elsewhere.url()


def test_an_agent_without_list_pods_is_told_what_rbac_is_missing(
    crds: local.ControlPlane, namespace: str, nodes: tuple[str, str]
) -> None:
    # A chart installed without agent.dcgmExporterDiscovery.enabled, an agent run with
    # --dcgm-exporter auto: its ServiceAccount may not list pods (impersonated here).
    api = crds.api_client()
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:default")
    try:
        source = dcgm.DcgmSource(locator=dcgm_discovery.Locator(dcgm_discovery.ApiPodLister(api), nodes[0]))
        assert source.scrape() is None
    finally:
        api.close()
    assert source.last_error is not None
    assert "HTTP 403 Forbidden" in source.last_error
    assert 'cannot list resource "pods"' in source.last_error
    assert "\n" not in source.last_error
