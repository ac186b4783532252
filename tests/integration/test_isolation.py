"""IsolateGPU end to end: the operator quarantines one GPU, not its node, on the real control plane.

An 8-GPU DRA node (a ResourceSlice as the NVIDIA DRA driver publishes it,
one device per GPU with the UUID the agent reports) runs 8 one-GPU pods
placed by the real kube-scheduler. A double-bit ECC error on GPU 3 makes the
operator create one DeviceTaintRule (NoExecute) for that GPU's device: the
real kube-controller-manager evicts only the pod holding GPU 3, the other 7
keep running, the node stays schedulable, and a new claim never gets GPU 3.
`kubectl get gpunodes` says `Isolated`, an Event `GPUIsolated` names the GPU.
On recovery (the fault gone for healthyForSeconds) the rule is deleted
(`GPURestored`) and GPU 3 is allocatable again. A rule a human deletes is an
override: not recreated on the same evidence. A device-plugin node (no
ResourceSlice) with the same fault is cordoned and drained as before.
"""

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_api import keys, resources
from gpuhealth_operator.decisions import device_taints
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local
from gpuhealth_sim.fleet import dra

pytestmark = pytest.mark.integration

TIMEOUT = 30.0
GPUS = 8
FAULTY = 3
RULE_VERSION = "v1beta2"


operator = operator_fixtures.operator_fixture("isolation")


@pytest.fixture
def fleet(
    k8s: client.ApiClient, operator: operator_harness.OperatorProcess
) -> Iterator[operator_harness.Fleet]:
    nodes = operator_harness.Fleet(k8s, label=f"iso-{secrets.token_hex(3)}")
    try:
        yield nodes
    finally:
        for name in nodes.names:
            _delete_slice(nodes.custom, name)
        nodes.cleanup()


def _uuid(index: int) -> str:
    uuid: str = gpunode_facts.healthy_gpu(index)["uuid"]
    return uuid


def _publish_slice(fleet: operator_harness.Fleet, node: str) -> None:
    """The node's ResourceSlice and the DeviceClass, as the DRA driver publishes them."""
    for plural, body in (
        ("deviceclasses", dra.device_class()),
        ("resourceslices", gpunode_facts.resource_slice(node, GPUS)),
    ):
        fleet.custom.patch_cluster_custom_object(
            dra.GROUP,
            dra.VERSION,
            plural,
            body["metadata"]["name"],
            body,
            field_manager="gpu-health-tests",
            force=True,
            _content_type="application/apply-patch+yaml",
        )


def _delete_slice(objects: client.CustomObjectsApi, node: str) -> None:
    try:
        objects.delete_cluster_custom_object(dra.GROUP, dra.VERSION, "resourceslices", dra.slice_name(node))
    except client.ApiException as error:
        if error.status != 404:
            raise


def _policy(fleet: operator_harness.Fleet, **extra: Any) -> None:
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 1,
            "maxUnavailableGPUs": 2,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
            "isolation": {"maxGPUsPerNode": 2, "effect": "NoExecute"},
            "drain": {"timeoutSeconds": 30, "force": True},
            "recovery": {"uncordon": True, "healthyForSeconds": 2},
            **extra,
        },
    )


def _ecc(count: int) -> dict[str, Any]:
    return gpunode_facts.agent_status(gpus=GPUS, overrides={FAULTY: {"ecc": {"uncorrectedVolatile": count}}})


def _rules(fleet: operator_harness.Fleet) -> list[dict[str, Any]]:
    found = fleet.custom.list_cluster_custom_object(
        device_taints.GROUP,
        RULE_VERSION,
        device_taints.PLURAL,
        label_selector=f"{keys.POLICY_LABEL}={fleet.label}",
    )
    items: list[dict[str, Any]] = found["items"]
    return items


def _pod(node: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "train", "image": "trainer:1", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        },
    }


def _claim_template(objects: client.CustomObjectsApi, namespace: str) -> None:
    objects.create_namespaced_custom_object(
        dra.GROUP,
        "v1",
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": f"{dra.GROUP}/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.DEVICE_CLASS}}]
                    }
                }
            },
        },
    )


def _devices_by_pod(objects: client.CustomObjectsApi, namespace: str) -> dict[str, str | None]:
    claims = objects.list_namespaced_custom_object(dra.GROUP, "v1", namespace, "resourceclaims")
    found: dict[str, str | None] = {}
    for claim in claims["items"]:
        owner = next(ref["name"] for ref in claim["metadata"]["ownerReferences"] if ref["kind"] == "Pod")
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        found[owner] = results[0]["device"] if results else None
    return found


def _phases(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    return {
        pod.metadata.name: pod.status.phase
        for pod in core.list_namespaced_pod(namespace).items
        if pod.metadata.deletion_timestamp is None
    }


def test_a_dbe_isolates_one_gpu_and_recovery_restores_it(
    fleet: operator_harness.Fleet, namespace: str
) -> None:
    node = f"{fleet.label}-dra"
    core, objects = fleet.core, fleet.custom
    fleet.add_node(node, gpus=GPUS)
    _publish_slice(fleet, node)
    _policy(fleet)
    _claim_template(objects, namespace)
    for i in range(GPUS):
        core.create_namespaced_pod(namespace, _pod(node, f"train-{i}"))

    def placed() -> dict[str, str] | None:
        phases, devices = _phases(core, namespace), _devices_by_pod(objects, namespace)
        running = {p: d for p, d in devices.items() if d is not None and phases.get(p) == "Running"}
        return running if len(running) == GPUS else None

    allocated = waiting.wait_until(placed, timeout_seconds=60, message=f"{GPUS} one-GPU pods running")
    (victim,) = [pod for pod, device in allocated.items() if device == dra.device_name(FAULTY)]
    survivors = {
        pod: core.read_namespaced_pod(pod, namespace).metadata.uid for pod in allocated if pod != victim
    }

    fleet.report(node, _ecc(1))
    reported_at = time.monotonic()

    def gone() -> bool:
        return victim not in _phases(core, namespace)

    waiting.wait_until(gone, timeout_seconds=60, message=f"{victim} (on GPU {FAULTY}) evicted")
    print(f"\nIsolateGPU: DBE reported -> pod on GPU {FAULTY} gone: {time.monotonic() - reported_at:.2f} s")
    (rule,) = _rules(fleet)
    assert rule["metadata"]["name"] == device_taints.rule_name(node, FAULTY)
    assert rule["spec"]["deviceSelector"] == {
        "driver": dra.DRIVER,
        "pool": node,
        "device": dra.device_name(FAULTY),
    }
    assert rule["spec"]["taint"]["effect"] == "NoExecute"
    assert rule["metadata"]["labels"][keys.NODE_LABEL] == node

    def shown() -> dict[str, Any] | None:
        status: dict[str, Any] = fleet.gpunode(node).get("status", {})
        return status if status.get("action") == "Isolated" and status.get("isolatedGPUs") else None

    status = waiting.wait_until(shown, timeout_seconds=TIMEOUT, message="GPUNode action Isolated")
    assert [(g["index"], g["uuid"], g["state"]) for g in status["isolatedGPUs"]] == [
        (FAULTY, _uuid(FAULTY), "Isolated")
    ]
    assert status["isolatedFraction"] == f"1/{GPUS}", "kubectl get gpunodes -o wide: ISOLATED 1/8"
    (event,) = fleet.events(node, "GPUIsolated")
    assert f"GPU {FAULTY}" in event["message"] and _uuid(FAULTY) in event["message"]

    core.create_namespaced_pod(namespace, _pod(node, "train-late"))

    def still_isolated() -> bool:
        phases, devices = _phases(core, namespace), _devices_by_pod(objects, namespace)
        uids = {pod: core.read_namespaced_pod(pod, namespace).metadata.uid for pod in survivors}
        return (
            uids == survivors
            and all(phases[pod] == "Running" for pod in survivors)
            and phases.get("train-late") == "Pending"
            and devices.get("train-late") is None
            and not fleet.node(node)["spec"].get("unschedulable")
        )

    waiting.holds(
        still_isolated, seconds=5, message="7 pods keep running, the node schedulable, GPU 3 unallocated"
    )
    assert fleet.events(node, "NodeCordoned") == []

    # Recovery: the fault cleared (a GPU reset) for healthyForSeconds: the rule goes, GPU 3 serves again.
    fleet.report(node, _ecc(0))
    waiting.wait_until(
        lambda: _rules(fleet) == [], timeout_seconds=TIMEOUT, message="the rule deleted on recovery"
    )
    waiting.wait_until(
        lambda: fleet.events(node, "GPURestored"), timeout_seconds=TIMEOUT, message="GPURestored Event"
    )
    waiting.wait_until(
        lambda: _devices_by_pod(objects, namespace).get("train-late") == dra.device_name(FAULTY),
        timeout_seconds=60,
        message=f"the waiting pod given GPU {FAULTY} again",
    )
    waiting.wait_until(
        lambda: not {"isolatedGPUs", "isolatedFraction"} & set(fleet.gpunode(node).get("status", {})),
        timeout_seconds=TIMEOUT,
        message="status.isolatedGPUs cleared",
    )


def test_a_deleted_rule_is_an_override(fleet: operator_harness.Fleet) -> None:
    node = f"{fleet.label}-dra"
    fleet.add_node(node, gpus=GPUS)
    _publish_slice(fleet, node)
    _policy(fleet)
    fleet.report(node, _ecc(1))
    name = device_taints.rule_name(node, FAULTY)
    waiting.wait_until(
        lambda: [r["metadata"]["name"] for r in _rules(fleet)] == [name],
        timeout_seconds=TIMEOUT,
        message="the rule created",
    )
    fleet.custom.delete_cluster_custom_object(device_taints.GROUP, RULE_VERSION, device_taints.PLURAL, name)
    waiting.wait_until(
        lambda: fleet.events(node, "OverriddenByUser"), timeout_seconds=TIMEOUT, message="OverriddenByUser"
    )
    waiting.holds(
        lambda: _rules(fleet) == [] and not fleet.node(node)["spec"].get("unschedulable"),
        seconds=3,
        message="not isolated again, nor drained, on the same evidence",
    )
    fleet.report(node, _ecc(2))  # more errors: still the same episode of the condition
    waiting.holds(lambda: _rules(fleet) == [], seconds=2, message="the same episode stays overridden")


def test_a_device_plugin_node_is_cordoned_and_drained(fleet: operator_harness.Fleet, namespace: str) -> None:
    node = f"{fleet.label}-plugin"
    fleet.add_node(node, gpus=GPUS)  # no ResourceSlice: its GPUs are no DRA devices
    _policy(fleet)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-plugin"},
        "spec": {"nodeName": node, "containers": [{"name": "train", "image": "trainer:1"}]},
    }
    fleet.core.create_namespaced_pod(namespace, pod)
    waiting.wait_until(
        lambda: _phases(fleet.core, namespace).get("train-plugin") == "Running",
        timeout_seconds=60,
        message="the pod running",
    )
    fleet.report(node, _ecc(1))
    reported_at = time.monotonic()
    waiting.wait_until(
        lambda: "train-plugin" not in _phases(fleet.core, namespace),
        timeout_seconds=TIMEOUT,
        message="the node's pod evicted by the drain",
    )
    print(f"\nnode ladder: DBE reported -> pod on the node gone: {time.monotonic() - reported_at:.2f} s")
    waiting.wait_until(
        lambda: fleet.gpunode(node).get("status", {}).get("action") == "Drained",
        timeout_seconds=TIMEOUT,
        message="the node ladder: cordoned and drained",
    )
    assert fleet.node(node)["spec"].get("unschedulable") is True
    assert _rules(fleet) == []


def _first_of_two_isolated(fleet: operator_harness.Fleet) -> tuple[str, str]:
    """Two DRA nodes under maxUnavailableGPUs 1; the first's GPU 3 isolated (the budget spent)."""
    first, second = f"{fleet.label}-a", f"{fleet.label}-b"
    for node in (first, second):
        fleet.add_node(node, gpus=GPUS)
        _publish_slice(fleet, node)
    _policy(fleet, maxUnavailableGPUs=1)
    fleet.report(first, _ecc(1))
    waiting.wait_until(
        lambda: [r["metadata"]["name"] for r in _rules(fleet)] == [device_taints.rule_name(first, FAULTY)],
        timeout_seconds=TIMEOUT,
        message="the first node's GPU isolated",
    )
    return first, second


def test_max_unavailable_gpus_makes_the_next_gpu_wait_not_drain(fleet: operator_harness.Fleet) -> None:
    first, second = _first_of_two_isolated(fleet)
    fleet.report(second, _ecc(1))
    waiting.wait_until(
        lambda: fleet.gpunode(second).get("status", {}).get("action") == "Pending",
        timeout_seconds=TIMEOUT,
        message="the second node's GPU waits for maxUnavailableGPUs",
    )
    waiting.holds(
        lambda: len(_rules(fleet)) == 1 and not fleet.node(second)["spec"].get("unschedulable"),
        seconds=2,
        message="one GPU isolated at most; the waiting node is not drained instead",
    )
    fleet.report(first, _ecc(0))  # the first GPU recovers: its place goes to the waiting one
    waiting.wait_until(
        lambda: [r["metadata"]["name"] for r in _rules(fleet)] == [device_taints.rule_name(second, FAULTY)],
        timeout_seconds=TIMEOUT,
        message="the waiting GPU isolated once the first is restored",
    )


def _dry_run_said(fleet: operator_harness.Fleet, node: str) -> str:
    said = fleet.messages(node, "DryRun")
    return said[-1] if said else ""


def test_a_dry_run_says_it_would_isolate_the_gpu_and_changes_nothing(fleet: operator_harness.Fleet) -> None:
    """What a week in dry run tells the operator must be what the policy will do once it acts: one
    GPU isolated on a DRA node, the node ladder (with why) where the GPU is no DRA device."""
    dra_node, plugin_node = f"{fleet.label}-dra", f"{fleet.label}-plugin"
    for node in (dra_node, plugin_node):
        fleet.add_node(node, gpus=GPUS)
    _publish_slice(fleet, dra_node)
    _policy(fleet, dryRun=True)
    for node in (dra_node, plugin_node):
        fleet.report(node, _ecc(1))
    waiting.wait_until(
        lambda: f"isolate GPU {FAULTY} ({_uuid(FAULTY)})" in _dry_run_said(fleet, dra_node),
        timeout_seconds=TIMEOUT,
        message="the DRA node's dry run names the GPU it would isolate",
    )
    assert "cordon" not in _dry_run_said(fleet, dra_node)
    waiting.wait_until(
        lambda: (
            "cordon and drain" in _dry_run_said(fleet, plugin_node)
            and "no DRA device" in _dry_run_said(fleet, plugin_node)
        ),
        timeout_seconds=TIMEOUT,
        message="the plugin node's dry run says the node ladder and why",
    )
    waiting.holds(
        lambda: (
            _rules(fleet) == []
            and not any(fleet.node(n)["spec"].get("unschedulable") for n in (dra_node, plugin_node))
        ),
        seconds=2,
        message="a dry run isolates no GPU and cordons no node",
    )


def test_a_fire_drill_rehearses_isolating_one_gpu_and_changes_nothing(fleet: operator_harness.Fleet) -> None:
    """A drill of an IsolateGPU condition must rehearse what a real fault would get: on a DRA node one
    GPU isolated and the node left in service; where no GPU is a DRA device, the node ladder and why."""
    dra_node, plugin_node = f"{fleet.label}-dra", f"{fleet.label}-plugin"
    for node in (dra_node, plugin_node):
        fleet.add_node(node, gpus=GPUS)
    _publish_slice(fleet, dra_node)
    _policy(fleet)
    for node in (dra_node, plugin_node):
        fleet.report(node, gpunode_facts.agent_status(gpus=GPUS))
        fleet.annotate_gpunode(node, {keys.DRILL_ANNOTATION: "EccUncorrectable"})

    def said(node: str, *words: str) -> bool:
        return any(all(w in m for w in words) for m in fleet.messages(node, "Drill"))

    waiting.wait_until(
        lambda: said(dra_node, "would isolate the faulty GPU"),
        timeout_seconds=TIMEOUT,
        message="the DRA node's drill says one GPU would be isolated",
    )
    assert not said(dra_node, "cordon"), fleet.messages(dra_node, "Drill")
    waiting.wait_until(
        lambda: said(plugin_node, "cordon and drain", "no DRA device"),
        timeout_seconds=TIMEOUT,
        message="the plugin node's drill says the node ladder and why",
    )
    waiting.holds(
        lambda: (
            # The acting policy's probe rule (gpuhealth-probe-*) comes and goes; no GPU's rule may come.
            [r for r in _rules(fleet) if keys.NODE_LABEL in r["metadata"]["labels"]] == []
            and not any(fleet.node(n)["spec"].get("unschedulable") for n in (dra_node, plugin_node))
        ),
        seconds=2,
        message="a drill isolates no GPU and cordons no node",
    )


def _api_lists(plane: local.ControlPlane, resource: str) -> float:
    """LIST requests the API server has answered for `resource`, from its own /metrics."""
    total = 0.0
    for line in plane.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        labels = line.partition("}")[0]
        if (
            line.startswith("apiserver_request_total{")
            and 'verb="LIST"' in labels
            and (f'resource="{resource}"' in labels)
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_held_isolation_costs_no_api_read_per_timer_pass(
    fleet: operator_harness.Fleet, crds: local.ControlPlane
) -> None:
    """An isolated GPU stays faulty for hours (until it is repaired): the timer passes over its node
    every tick meanwhile, and must not LIST the cluster's DeviceTaintRules and the node's ResourceSlices
    each time (two LISTs per node per tick: with 50 isolated GPUs, 200 requests/s at rest)."""
    node = f"{fleet.label}-dra"
    fleet.add_node(node, gpus=GPUS)
    _publish_slice(fleet, node)
    _policy(fleet)
    fleet.report(node, _ecc(1))
    waiting.wait_until(
        lambda: fleet.gpunode(node).get("status", {}).get("action") == "Isolated",
        timeout_seconds=TIMEOUT,
        message="GPU 3 isolated",
    )
    rule = device_taints.rule_name(node, FAULTY)

    def held() -> bool:  # GETs only: the LISTs counted are the operator's
        fleet.custom.get_cluster_custom_object(device_taints.GROUP, RULE_VERSION, device_taints.PLURAL, rule)
        return bool(fleet.gpunode(node)["status"].get("action") == "Isolated")

    before = {plural: _api_lists(crds, plural) for plural in ("resourceslices", device_taints.PLURAL)}
    waiting.holds(held, seconds=6, message="GPU 3 stays isolated")  # 12 timer passes (--tick-seconds=0.5)
    lists = {plural: _api_lists(crds, plural) - count for plural, count in before.items()}
    assert lists["resourceslices"] <= 2, lists
    assert lists[device_taints.PLURAL] <= 2, lists


def test_a_deleted_node_takes_its_rule_with_it_and_frees_the_gpu_budget(
    fleet: operator_harness.Fleet,
) -> None:
    """A node with an isolated GPU is often replaced, not repaired: its Node is deleted. Its rule must
    not outlive it, or it counts against maxUnavailableGPUs for good and no GPU is isolated again."""
    first, second = _first_of_two_isolated(fleet)
    fleet.core.delete_node(first)
    _delete_slice(fleet.custom, first)  # as the DRA driver's kubelet plugin does for a gone node
    waiting.wait_until(
        lambda: _rules(fleet) == [], timeout_seconds=TIMEOUT, message="the rule gone with its Node"
    )
    fleet.report(second, _ecc(1))
    waiting.wait_until(
        lambda: [r["metadata"]["name"] for r in _rules(fleet)] == [device_taints.rule_name(second, FAULTY)],
        timeout_seconds=TIMEOUT,
        message="the second node's GPU isolated: the budget is free again",
    )


def _rules_of(fleet: operator_harness.Fleet, node: str) -> dict[str, str]:
    """The node's rules (any policy's): name → its gpuhealth.io/policy label."""
    found = fleet.custom.list_cluster_custom_object(
        device_taints.GROUP,
        RULE_VERSION,
        device_taints.PLURAL,
        label_selector=f"{keys.NODE_LABEL}={device_taints.label_value(node)}",
    )
    return {r["metadata"]["name"]: r["metadata"]["labels"][keys.POLICY_LABEL] for r in found["items"]}


def test_a_deleted_policys_rule_is_adopted_by_another_policy_of_the_node_then_restored(
    fleet: operator_harness.Fleet,
) -> None:
    """Renamed (a copy created, the original deleted): the copy adopts the rule (its label relabelled
    on the real API server) and the GPU stays isolated; the copy deleted too, no isolating policy
    selects the node and the rule is deleted: the GPU is not kept out of service for good."""
    node = f"{fleet.label}-dra"
    fleet.add_node(node, gpus=GPUS)
    _publish_slice(fleet, node)
    _policy(fleet)
    fleet.report(node, _ecc(1))
    rule = device_taints.rule_name(node, FAULTY)
    waiting.wait_until(
        lambda: _rules_of(fleet, node) == {rule: fleet.label}, timeout_seconds=TIMEOUT, message="isolated"
    )
    renamed = f"{fleet.label}-renamed"
    fleet.policy(
        renamed,
        {
            "maxUnavailableGPUs": 2,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
            "recovery": {"uncordon": True, "healthyForSeconds": 2},
        },
    )
    fleet.custom.delete_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, fleet.label
    )
    waiting.wait_until(
        lambda: _rules_of(fleet, node) == {rule: renamed},
        timeout_seconds=TIMEOUT,
        message="the renamed policy adopts the rule",
    )
    assert not fleet.node(node)["spec"].get("unschedulable"), "still isolated, not drained"
    fleet.custom.delete_cluster_custom_object(
        resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, renamed
    )
    waiting.wait_until(
        lambda: _rules_of(fleet, node) == {}, timeout_seconds=TIMEOUT, message="restored: no policy is left"
    )
    fleet.said(node, "GPURestored", "was deleted", timeout_seconds=TIMEOUT)


def _dra_nodes(fleet: operator_harness.Fleet, count: int) -> list[str]:
    names = [f"{fleet.label}-{i}" for i in range(count)]
    for node in names:
        fleet.add_node(node, gpus=GPUS)
        _publish_slice(fleet, node)
    return names


def _all_rules(fleet: operator_harness.Fleet, nodes: list[str]) -> list[str]:
    return sorted(name for node in nodes for name in _rules_of(fleet, node))


def test_overlapping_policies_isolate_no_more_gpus_than_each_allows(fleet: operator_harness.Fleet) -> None:
    """Two IsolateGPU policies over the same two nodes, each with maxUnavailableGPUs 1: one GPU is
    isolated between them; the other waits (Pending), neither isolated nor drained."""
    first, second = _dra_nodes(fleet, 2)
    _policy(fleet, maxUnavailableGPUs=1)
    fleet.policy(
        f"{fleet.label}-too",
        {
            "maxUnavailableGPUs": 1,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
            "recovery": {"uncordon": True, "healthyForSeconds": 2},
        },
    )
    fleet.report(first, _ecc(1))
    waiting.wait_until(
        lambda: _all_rules(fleet, [first, second]) == [device_taints.rule_name(first, FAULTY)],
        timeout_seconds=TIMEOUT,
        message="the first GPU isolated",
    )
    fleet.report(second, _ecc(1))
    waiting.wait_until(
        lambda: fleet.gpunode(second).get("status", {}).get("action") == "Pending",
        timeout_seconds=TIMEOUT,
        message="the second GPU waits for the budget both policies share",
    )
    waiting.holds(
        lambda: (
            len(_all_rules(fleet, [first, second])) == 1
            and not fleet.node(second)["spec"].get("unschedulable")
        ),
        seconds=3,
        message="one GPU isolated in all, and the waiting node not drained",
    )


def test_an_open_breaker_holds_new_isolations_back(fleet: operator_harness.Fleet) -> None:
    """A storm on 4 DRA nodes under a breaker that allows 1 new Unhealthy node: at most 1 rule."""
    nodes = _dra_nodes(fleet, 4)
    _policy(fleet, maxUnavailableGPUs="100%", breaker={"maxNewUnhealthy": 1})
    for node in nodes:
        fleet.report(node, _ecc(1))
    waiting.wait_until(
        lambda: sum(fleet.gpunode(n).get("status", {}).get("action") == "Pending" for n in nodes) >= 3,
        timeout_seconds=TIMEOUT,
        message="the storm's later GPUs wait for the breaker",
    )
    assert len(_all_rules(fleet, nodes)) <= 1
    assert not any(fleet.node(n)["spec"].get("unschedulable") for n in nodes)


def test_an_isolated_gpu_stays_listed_and_held_beside_a_drain_policy_across_an_operator_restart(
    fleet: operator_harness.Fleet, operator: operator_harness.OperatorProcess
) -> None:
    """IsolateGPU and a second acting policy (Drain on Xid 79) over one DRA node (issue 24 item 7): GPU
    3's DBE is isolated; an Xid on GPU 5 drains the node, so the drain's verdict is the one shown;
    the GPUNode still lists GPU 3 isolated. The operator restarts: it neither isolates GPU 3 again nor
    loses it. The GPUs recover: the rule goes (GPURestored) and the list with it."""
    node = f"{fleet.label}-dra"
    fleet.add_node(node, gpus=GPUS)
    _publish_slice(fleet, node)
    _policy(fleet)
    fleet.policy(
        f"{fleet.label}-drain",
        {
            "maxUnavailable": 1,
            "rules": [{"name": "xid", "condition": "XidCritical", "action": "Drain", "xids": [79]}],
            "drain": {"timeoutSeconds": 30, "force": True},
            "recovery": {"uncordon": True, "healthyForSeconds": 2},
        },
    )
    rule = device_taints.rule_name(node, FAULTY)
    listed = [(FAULTY, rule, "Isolated")]

    def isolated() -> list[tuple[int, str, str]]:
        status = fleet.gpunode(node).get("status", {})
        return [(g.get("index"), g["rule"], g["state"]) for g in status.get("isolatedGPUs") or []]

    fleet.report(node, _ecc(1))
    waiting.wait_until(
        lambda: fleet.gpunode(node).get("status", {}).get("action") == "Isolated" and isolated() == listed,
        timeout_seconds=TIMEOUT,
        message="GPU 3 isolated",
    )
    xid = {"xids": [{"code": 79, "count": 1, "lastSeen": gpunode_facts.rfc3339()}]}
    fleet.report(
        node,
        gpunode_facts.agent_status(
            gpus=GPUS, overrides={FAULTY: {"ecc": {"uncorrectedVolatile": 1}}, 5: xid}
        ),
    )
    waiting.wait_until(
        lambda: fleet.gpunode(node).get("status", {}).get("action") == "Drained",
        timeout_seconds=TIMEOUT,
        message="the Xid drains the node: the drain policy's verdict is shown",
    )
    status = fleet.gpunode(node)["status"]
    assert isolated() == listed, status
    assert status.get("isolatedFraction") == f"1/{GPUS}", "kubectl get gpunodes -o wide: ISOLATED 1/8"

    operator.stop()
    operator.start()
    waiting.wait_until(operator.is_leading, timeout_seconds=30, message="the restarted operator leads")
    waiting.holds(
        lambda: _rules_of(fleet, node) == {rule: fleet.label} and isolated() == listed,
        seconds=3,
        message="the restarted operator keeps GPU 3 isolated and listed",
    )
    (event,) = fleet.events(node, "GPUIsolated")
    assert event.get("count", 1) == 1, "GPU 3 isolated again after the restart"
    assert fleet.events(node, "GPURestored") == [] and fleet.events(node, "OverriddenByUser") == []

    fleet.report(node, _ecc(0))  # both GPUs repaired (a reboot)
    waiting.wait_until(
        lambda: _rules_of(fleet, node) == {}, timeout_seconds=TIMEOUT, message="the rule deleted on recovery"
    )
    waiting.wait_until(
        lambda: fleet.events(node, "GPURestored"), timeout_seconds=TIMEOUT, message="GPURestored Event"
    )
    waiting.wait_until(
        lambda: not {"isolatedGPUs", "isolatedFraction"} & set(fleet.gpunode(node).get("status", {})),
        timeout_seconds=TIMEOUT,
        message="status.isolatedGPUs cleared",
    )
