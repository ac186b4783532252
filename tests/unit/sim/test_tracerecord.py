"""`record`'s compaction: what a recorded version becomes in the trace, and that the trace gives it back."""

import copy
import pathlib
from collections.abc import Callable

import pytest

from gpuhealth_sim.backtest import tracerecord, traces
from gpunode_facts import agent_status

START = 1_767_571_200.0


def gpunode(name: str, status: dict, **operator_fields: object) -> dict:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "status": {**status, "health": "Healthy", "conditions": [{"type": "Ready"}], **operator_fields},
    }


def k8s_node(name: str, *, unschedulable: bool = False, labels: dict | None = None) -> dict:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "7",
            "labels": {"nvidia.com/gpu.present": "true", **(labels or {})},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"unschedulable": unschedulable, "taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "32", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def versions() -> list[dict]:
    """Six agent reports of one node: heartbeat only, clocks, an ECC error, a GPU lost, one back, a null."""
    first = agent_status(gpus=4, heartbeat="2026-01-05T00:00:00Z", observed="2026-01-05T00:00:00Z")
    out = [first]
    second = copy.deepcopy(first)
    second["agent"]["lastHeartbeatTime"] = "2026-01-05T00:01:00Z"
    second["gpus"][1]["smClockMHz"] = 1860
    out.append(second)
    third = copy.deepcopy(second)
    third["gpus"][2]["ecc"]["uncorrectedVolatile"] = 1
    third["gpus"][2]["xids"] = [{"code": 48}]
    del third["gpus"][2]["pcie"]
    out.append(third)
    fourth = copy.deepcopy(third)
    fourth["gpus"] = fourth["gpus"][:3]
    fourth["summary"]["gpuCount"] = 3
    out.append(fourth)
    fifth = copy.deepcopy(third)
    out.append(fifth)
    sixth = copy.deepcopy(fifth)
    sixth["gpus"][0]["powerWatts"] = None  # NOT_SUPPORTED: a merge patch cannot say it
    out.append(sixth)
    return out


def test_a_gpunode_is_recorded_in_full_once_then_as_patches_of_the_agent_part_only() -> None:
    compactor = tracerecord.Compactor(START)
    statuses = versions()
    records = [compactor.gpunode(gpunode("n1", s), START + 10 * i) for i, s in enumerate(statuses)]
    assert all(r is not None for r in records)
    first, second = records[0], records[1]
    assert first is not None and second is not None
    assert first["status"] == statuses[0] and "health" not in first["status"]
    # The operator's conditions then, once: the replay goes on from them as a restarted operator.
    assert first["operator"] == {"conditions": [{"type": "Ready"}]}
    assert second["t"] == 10.0 and "operator" not in second
    assert second["patch"] == {
        "agent": {"lastHeartbeatTime": "2026-01-05T00:01:00Z"},
        "gpus": {"1": {"smClockMHz": 1860}},
    }
    last = records[-1]
    assert last is not None and "status" in last and "operator" not in last  # the null needs it whole
    # The operator's own status writes change nothing the agent reported: no record.
    assert compactor.gpunode(gpunode("n1", statuses[-1], health="Unhealthy"), START + 99) is None


def test_a_node_keeps_only_what_the_operator_reads_and_repeats_nothing() -> None:
    compactor = tracerecord.Compactor(START)
    record = compactor.node(k8s_node("n1"), START + 1.5)
    assert record == {
        "kind": "node",
        "t": 1.5,
        "object": {
            "metadata": {
                "name": "n1",
                "labels": {"nvidia.com/gpu.present": "true"},
                "annotations": {"kwok.x-k8s.io/node": "fake"},
            },
            "spec": {"unschedulable": False, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"capacity": {"nvidia.com/gpu": "8"}},
        },
    }
    heartbeat = k8s_node("n1")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "later"
    heartbeat["metadata"]["resourceVersion"] = "8"
    assert compactor.node(heartbeat, START + 2) is None
    cordoned = compactor.node(k8s_node("n1", unschedulable=True), START + 3)
    assert cordoned is not None and cordoned["object"]["spec"]["unschedulable"] is True


def test_times_never_go_back_when_two_followers_hand_over_out_of_order() -> None:
    compactor = tracerecord.Compactor(START)
    late = compactor.node(k8s_node("n1"), START + 5)
    early = compactor.gpunode(gpunode("n1", versions()[0]), START + 4.9)
    assert late is not None and early is not None and early["t"] == late["t"] == 5.0


def test_recorded_versions_come_back_from_the_trace_reader(tmp_path: pathlib.Path) -> None:
    """Round trip: versions → compactor → trace file (gzip) → reader → the same statuses."""
    path = tmp_path / "rec.jsonl.gz"
    compactor = tracerecord.Compactor(START)
    statuses = versions()
    other = agent_status(gpus=2, heartbeat="2026-01-05T00:00:00Z", observed="2026-01-05T00:00:00Z")
    with traces.Writer(path, {"start": START}) as writer:
        writer.write(compactor.gpunode({"metadata": {"name": "n2"}}, START) or {})  # before any report
        writer.write(compactor.node(k8s_node("n1"), START) or {})
        for i, status in enumerate(statuses):
            record = compactor.gpunode(gpunode("n1", status), START + i)
            assert record is not None
            writer.write(record)
            writer.flush()
        writer.write(compactor.gpunode(gpunode("n2", other), START + 7) or {})
    seen: dict[str, list[dict]] = {}
    current: dict[str, dict] = {}
    with traces.open_trace(path) as (header, records):
        assert header["start"] == START
        for record in records:
            if record["kind"] != "gpunode":
                continue
            name = record["name"]
            if "status" in record:
                current[name] = record["status"]
            else:
                current[name] = traces.apply_status_patch(current[name], record["patch"])
            seen.setdefault(name, []).append(current[name])
    assert seen["n1"] == statuses
    assert seen["n2"] == [{}, other]


def full_slice(node: str) -> dict:
    """A ResourceSlice as the NVIDIA DRA driver publishes it (more than the operator reads)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com", "resourceVersion": "3", "uid": "u"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "uuid": {"string": f"GPU-{i:08d}-0000-0000-0000-000000000000"},
                        "index": {"int": i},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    },
                }
                for i in range(8)
            ],
        },
    }


def test_a_deleted_node_and_gpunode_are_recorded_and_one_created_again_is_written_in_full() -> None:
    compactor = tracerecord.Compactor(START)
    status = versions()[0]
    assert compactor.node(k8s_node("n1"), START + 1) is not None
    assert compactor.gpunode(gpunode("n1", status), START + 2) is not None
    assert compactor.deleted("node", "n1", START + 3) == [
        {"kind": "node", "t": 3.0, "name": "n1", "deleted": True}
    ]
    assert compactor.deleted("gpunode", "n1", START + 4) == [
        {"kind": "gpunode", "t": 4.0, "name": "n1", "deleted": True}
    ]
    assert compactor.deleted("node", "n1", START + 5) == [], "a deletion is recorded once"
    assert compactor.deleted("node", "n2", START + 5) == [], "a node never recorded: nothing to delete"
    node_again = compactor.node(k8s_node("n1"), START + 6)
    assert node_again is not None and node_again["object"]["metadata"]["name"] == "n1"
    again = compactor.gpunode(gpunode("n1", status), START + 7)
    assert again is not None and again["status"] == status, "in full: the replay forgot the old one"


def test_resource_slices_keep_what_the_operator_reads_and_their_deletion() -> None:
    compactor = tracerecord.Compactor(START)
    [record] = compactor.resource("resourceslice", full_slice("n1"), START + 1)
    assert record["kind"] == "resourceslice" and record["t"] == 1.0
    obj = record["object"]
    assert obj["spec"]["pool"] == {"name": "n1"} and obj["spec"]["nodeName"] == "n1"
    assert obj["spec"]["devices"][3] == {
        "name": "gpu-3",
        "attributes": {"uuid": {"string": "GPU-00000003-0000-0000-0000-000000000000"}},
    }
    assert compactor.resource("resourceslice", full_slice("n1"), START + 2) == [], "nothing read changed"
    assert compactor.deleted("resourceslice", "n1-gpu.nvidia.com", START + 3) == [
        {"kind": "resourceslice", "t": 3.0, "name": "n1-gpu.nvidia.com", "deleted": True}
    ]
    other = {"metadata": {"name": "nic"}, "spec": {"driver": "nic", "devices": [{"name": "eth0"}]}}
    assert compactor.resource("resourceslice", other, START + 4) == [], "no device with a uuid"


def test_an_acknowledged_rule_says_the_cluster_acts_on_rules_and_ours_are_recorded() -> None:
    compactor = tracerecord.Compactor(START)
    assert compactor.cluster("v1beta2", None, START)["deviceTaintRules"] == {
        "version": "v1beta2",
        "actedOn": None,
    }
    probe = {
        "metadata": {"name": "gpuhealth-probe-p", "generation": 1, "labels": {"gpuhealth.io/policy": "p"}}
    }
    assert compactor.resource("devicetaintrule", probe, START + 1) == [], "unacknowledged: nothing known yet"
    acked = {**probe, "status": {"conditions": [{"type": "EvictionInProgress", "observedGeneration": 1}]}}
    [said] = compactor.resource("devicetaintrule", acked, START + 2)
    assert said == {"kind": "cluster", "t": 2.0, "deviceTaintRules": {"version": "v1beta2", "actedOn": True}}
    labels = {"gpuhealth.io/policy": "p", "gpuhealth.io/node": "n1", "gpuhealth.io/gpu-index": "3"}
    rule = {"metadata": {"name": "gpuhealth-n1-gpu-3", "labels": labels}, "spec": {"taint": {}}}
    [ours] = compactor.resource("devicetaintrule", rule, START + 3)
    assert ours["object"]["metadata"] == {"name": "gpuhealth-n1-gpu-3", "labels": labels}
    assert "existing" not in ours, "created while recording: the recorded operator's decision"
    owner = [{"apiVersion": "v1", "kind": "Node", "name": "n2", "uid": "u2"}]
    there = {
        "metadata": {"name": "gpuhealth-n2-gpu-0", "labels": labels, "ownerReferences": owner},
        "spec": {},
    }
    [found] = compactor.resource("devicetaintrule", there, START + 4, existing=True)
    assert found["existing"] is True, "in place when the recording began: the replay starts with it"
    assert found["object"]["metadata"]["ownerReferences"] == owner, "its Node's: collected with it"


def agent_pod(node: str | None, ready: str, changed: str = "2026-01-05T00:00:00Z", **status: object) -> dict:
    return {
        "metadata": {
            "namespace": "gpu-health",
            "name": "agent-abcde",
            "resourceVersion": "9",
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "a", "controller": True}
            ],
        },
        "spec": {"nodeName": node} if node else {},
        "status": {
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": changed}],
            **status,
        },
    }


def test_an_agent_pod_keeps_its_node_and_readiness_and_repeats_nothing() -> None:
    compactor = tracerecord.Compactor(START)
    assert compactor.agent_pod(agent_pod(None, "False"), START + 1) is None, "not scheduled: nothing to read"
    ready = {"node": "n1", "ready": True, "since": "2026-01-05T00:00:00.000000Z"}
    assert compactor.agent_pod(agent_pod("n1", "True"), START + 2) == {
        "kind": "agentpod",
        "t": 2.0,
        "name": "gpu-health/agent-abcde",
        **ready,
    }
    restarted = agent_pod("n1", "True", containerStatuses=[{"restartCount": 1}])
    assert compactor.agent_pod(restarted, START + 3) is None, "nothing the operator reads changed"
    hung = compactor.agent_pod(agent_pod("n1", "False", "2026-01-05T00:00:04Z"), START + 4)
    assert hung is not None and (hung["ready"], hung["since"]) == (False, "2026-01-05T00:00:04.000000Z")
    assert compactor.deleted("agentpod", "gpu-health/agent-abcde", START + 5) == [
        {"kind": "agentpod", "t": 5.0, "name": "gpu-health/agent-abcde", "deleted": True}
    ]
    bare = agent_pod("n2", "True")
    bare["metadata"]["ownerReferences"] = []
    assert compactor.agent_pod(bare, START + 6) is None, "the agent's labels on a pod no DaemonSet controls"


def test_a_cluster_that_cannot_be_recorded_says_why_before_any_file() -> None:
    from kubernetes import client  # noqa: PLC0415 - its error type only

    def refused(status: int, reason: str) -> Callable[..., object]:
        def lister(**_: object) -> object:
            raise client.ApiException(status=status, reason=reason)

        return lister

    def listed(**_: object) -> object:
        return {"items": []}

    tracerecord.preflight({"Nodes": listed, "GPUNodes": listed})
    for status, said in ((404, "is gpu-health installed?"), (403, "may not list them")):
        with pytest.raises(tracerecord.RecordError, match=rf"cannot list GPUNodes: {status} .*{said}"):
            tracerecord.preflight({"Nodes": listed, "GPUNodes": refused(status, "x")})


def test_a_tenant_daemonset_pod_with_the_agents_labels_is_not_recorded() -> None:
    # Labels are anyone's to copy: as the operator (`agent_pods.is_agent`), only a DaemonSet pod in
    # the agent's namespace (record --agent-pod-namespace, the chart's release namespace) is the agent.
    compactor = tracerecord.Compactor(START)
    tenant = agent_pod("n1", "False")
    tenant["metadata"]["namespace"] = "tenant"
    assert compactor.agent_pod(tenant, START + 1) is None, "a tenant's DaemonSet is not the agent"
    assert compactor.deleted("agentpod", "tenant/agent-abcde", START + 2) == []
    assert compactor.agent_pod(agent_pod("n1", "True"), START + 3) is not None

    elsewhere = tracerecord.Compactor(START, agent_pod_namespace="gpu-system")
    assert elsewhere.agent_pod(agent_pod("n1", "True"), START + 1) is None
    moved = agent_pod("n1", "True")
    moved["metadata"]["namespace"] = "gpu-system"
    assert elsewhere.agent_pod(moved, START + 1) is not None


def test_record_defaults_to_the_readmes_namespace() -> None:
    from gpuhealth_sim import cli  # noqa: PLC0415

    parser = cli.parser()
    assert parser.parse_args(["record", "--out", "t.jsonl"]).agent_pod_namespace == "gpu-health"
    given = ["record", "--out", "t.jsonl", "--agent-pod-namespace", "gpu-system"]
    assert parser.parse_args(given).agent_pod_namespace == "gpu-system"


def test_a_replay_judges_agent_pods_by_the_recorded_namespace() -> None:
    # A trace says where its agents ran (header agentPodNamespace): the replay judges pods by the
    # operator's own rule, so a tenant pod in an older trace cannot make a node Unknown or live.
    import asyncio  # noqa: PLC0415

    from gpuhealth_sim.backtest import replayer  # noqa: PLC0415

    policy = replayer.load_policy(pathlib.Path(__file__).parents[3] / "examples" / "default-policy.yaml")
    replay = replayer.Replay(policy, START, 30.0, agent_pod_namespace="gpu-health")
    since = "2026-01-05T00:00:00Z"
    tenant = {"name": "tenant/agent-x", "node": "n1", "ready": False, "since": since}
    asyncio.run(replay._agent_pod(tenant, gone=False))
    assert replay.operator.agent_ready("n1") is None
    agent = {"name": "gpu-health/agent-y", "node": "n1", "ready": True, "since": since}
    asyncio.run(replay._agent_pod(agent, gone=False))
    assert replay.operator.agent_ready("n1") is True

    header = tracerecord.trace_header(START, {"version": "x"}, "gpu-health")
    assert header["agentPodNamespace"] == "gpu-health"
