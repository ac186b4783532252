"""The resync's list of names, from a real API server: every name across pages, of every kind it lists."""

import asyncio
import secrets
from collections.abc import Iterator

import pytest
from kubernetes import client

import operator_harness
from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import resync
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"names-{secrets.token_hex(3)}") as nodes:
        yield nodes


async def names_page_by_page(
    plane: local.ControlPlane, path: str, selector: str
) -> tuple[list[str], list[str]]:
    """Every name of `path` matching `selector`, two per page; and each page's list resourceVersion."""
    kube_client = kube.Kube(await kube.load_credentials(plane.kubeconfig))
    names: list[str] = []
    versions: list[str] = []
    query = {"limit": "2", "labelSelector": selector}
    try:
        while True:
            page = await kube_client.list_names(path, query)
            names += [item["metadata"]["name"] for item in page["items"]]
            versions.append(str(page["metadata"].get("resourceVersion", "")))
            token = page["metadata"].get("continue")
            if not token:
                return names, versions
            query["continue"] = str(token)
    finally:
        await kube_client.close()


def test_names_of_nodes_and_gpunodes_come_across_pages_with_the_lists_version(
    crds: local.ControlPlane, fleet: operator_harness.Fleet
) -> None:
    created = [f"{fleet.label}-{i}" for i in range(5)]
    for name in created:
        fleet.add_node(name, gpus=2)
    names, versions = asyncio.run(
        names_page_by_page(crds, resync.NODES_PATH, f"{fleet.LABEL_KEY}={fleet.label}")
    )
    assert sorted(names) == created
    assert len(versions) == 3
    assert all(versions)
    # GPUNodes carry no fleet label: ours are among every GPUNode, each once.
    names, _ = asyncio.run(names_page_by_page(crds, resync.GPUNODES_PATH, ""))
    assert set(created) <= set(names)
    assert len(names) == len(set(names))
