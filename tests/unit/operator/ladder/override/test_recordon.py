"""A human's uncordon and re-cordon that the operator never saw as two versions is theirs (issue 24, item 12).

The operator restarted (or another replica took the lead) between a human's
`kubectl uncordon` and `kubectl cordon` of a node gpu-health had cordoned: the
Node it finds is unschedulable and still carries our `cordoned-by` and
`cordoned-at` annotations (kubectl touches neither). The flag alone says "ours";
the Node's managedFields say who last set `spec.unschedulable`: if not the
writer of our cordon's identity, the cordon is the human's. Their uncordon
overrode us (OverriddenByUser, claim dropped) and their cordon is never lifted.
"""

import asyncio
import copy
from typing import Any

import pytest

import drain_cluster
import handling
from gpuhealth_api import keys
from gpuhealth_operator.client import nodes
from gpuhealth_operator.decisions import overrides
from gpuhealth_operator.runtime import handlers

OURS = "gpu-health-operator"
CORDONED_AT = "2026-11-26T07:00:00.000000Z"


def managed(entries: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {"manager": m, "operation": "Update", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": f}
        for m, f in entries
    ]


CLAIM = {
    "f:metadata": {
        "f:annotations": {
            ".": {},
            f"f:{keys.CORDONED_BY_ANNOTATION}": {},
            f"f:{nodes.CORDONED_AT_ANNOTATION}": {},
            f"f:{nodes.DRAIN_STARTED_ANNOTATION}": {},
        }
    }
}
FLAG = {"f:spec": {"f:unschedulable": {}}}
OUR_CORDON = managed([("kwok", {"f:status": {}}), (OURS, {**CLAIM, **FLAG})])
RECORDONED = managed([("kwok", {"f:status": {}}), (OURS, CLAIM), ("kubectl-cordon", FLAG)])


def metadata(fields: list[dict[str, Any]] | None, **annotations: str) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "n", "annotations": annotations}
    if fields is not None:
        body["managedFields"] = fields
    return body


CLAIMED = {keys.CORDONED_BY_ANNOTATION: "p", nodes.CORDONED_AT_ANNOTATION: CORDONED_AT}


def test_the_cordon_is_ours_while_its_writer_owns_the_flag() -> None:
    assert not overrides.cordon_taken_over(metadata(OUR_CORDON, **CLAIMED))
    assert overrides.cordon_taken_over(metadata(RECORDONED, **CLAIMED))
    # A cordon from before cordons had a cordoned-at: the cordoned-by annotation's writer.
    old = managed(
        [(OURS, {"f:metadata": {"f:annotations": {f"f:{keys.CORDONED_BY_ANNOTATION}": {}}}}), ("k", FLAG)]
    )
    assert overrides.cordon_taken_over(metadata(old, **{keys.CORDONED_BY_ANNOTATION: "p"}))
    # Nothing to tell from: no managedFields, no claim, or nobody known to own either: the flag alone.
    assert not overrides.cordon_taken_over(metadata(None, **CLAIMED))
    assert not overrides.cordon_taken_over(metadata(RECORDONED))
    assert not overrides.cordon_taken_over(metadata(managed([("k", FLAG)]), **CLAIMED))


def cordoned_node(fields: list[dict[str, Any]]) -> dict[str, Any]:
    body = drain_cluster.node_body("n", {"pool": "gpu"})
    body["metadata"]["annotations"] = {**CLAIMED, nodes.DRAIN_STARTED_ANNOTATION: CORDONED_AT}
    body["metadata"]["managedFields"] = fields
    body["spec"]["unschedulable"] = True
    return body


@pytest.mark.parametrize("recordoned", [False, True])
def test_a_restarted_operator_never_lifts_a_cordon_a_human_made_again(recordoned: bool) -> None:
    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        spec = drain_cluster.drain_spec("gpu", recovery={"uncordon": True, "healthyForSeconds": 0})
        ctx = drain_cluster.make_context(cluster)  # a new term: it saw none of the versions in between
        await handlers.on_policy(drain_cluster.event("ADDED", drain_cluster.policy_body("p", spec)), memo=ctx)
        cluster.put_node(cordoned_node(RECORDONED if recordoned else OUR_CORDON))
        await handling.handle(
            handlers.on_node, drain_cluster.event("ADDED", copy.deepcopy(cluster.nodes["n"])), ctx
        )
        await drain_cluster.report(
            cluster, ctx, "n", ecc=0
        )  # healthy: the recovery rules would lift our cordon
        await drain_cluster.report(cluster, ctx, "n", ecc=0)
        node = cluster.nodes["n"]
        said = [e["reason"] for e in cluster.event_log]
        if not recordoned:  # the control: our own cordon is lifted on recovery
            assert node["spec"]["unschedulable"] is False
            assert "NodeUncordoned" in said
            return
        assert node["spec"]["unschedulable"] is True, "the operator lifted a cordon a human made"
        annotations = node["metadata"].get("annotations") or {}
        assert keys.CORDONED_BY_ANNOTATION not in annotations, "the claim is dropped"
        assert (
            nodes.CORDONED_AT_ANNOTATION not in annotations
            and nodes.DRAIN_STARTED_ANNOTATION not in annotations
        )
        assert said.count("OverriddenByUser") == 1 and "NodeUncordoned" not in said
        (event,) = [e for e in cluster.event_log if e["reason"] == "OverriddenByUser"]
        assert "cordoned again" in event["message"], event["message"]

    asyncio.run(scenario())
