"""A human's uncordon of a node two acting policies want cordoned, through the operator's own handlers
on the in-memory cluster: the claim is dropped once, neither policy cordons the node again on the same
evidence (in the uncordon's own pass, nor in the timer's), and new evidence cordons it again."""

import asyncio
import copy
from typing import Any

import gpunode_facts
import handling
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.runtime import handlers
from memory_fleet import MemoryFleet

CORDON_ON_ECC = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}]


def ecc(count: int) -> dict[str, Any]:
    return gpunode_facts.agent_status(overrides={0: {"ecc": {"uncorrectedVolatile": count}}})


async def uncordon_by_hand(fleet: MemoryFleet, name: str) -> None:
    """`kubectl uncordon`: the flag goes, our annotations stay; the operator gets the Node's event."""
    node = copy.deepcopy(fleet.cluster.nodes[name])
    node["spec"].pop("unschedulable", None)
    stored = fleet.cluster.put_node(node)
    await handling.handle(handlers.on_node, {"type": "MODIFIED", "object": copy.deepcopy(stored)}, fleet.ctx)


def test_an_uncordon_under_two_acting_policies_holds_until_new_evidence() -> None:
    async def scenario() -> None:
        fleet = MemoryFleet(CORDON_ON_ECC, policies=("a", "b"))
        await fleet.start(["n"])
        await fleet.deliver("n", ecc(1))
        assert fleet.cordoned("n")
        annotations = fleet.cluster.nodes["n"]["metadata"]["annotations"]
        assert annotations[keys.CORDONED_BY_ANNOTATION] == "a"

        await uncordon_by_hand(fleet, "n")
        node = fleet.cluster.nodes["n"]
        assert not fleet.cordoned("n"), "the policy that did not claim the cordon must not cordon it again"
        assert keys.CORDONED_BY_ANNOTATION not in (node["metadata"].get("annotations") or {})
        assert keys.OVERRIDDEN_EVIDENCE_ANNOTATION in node["metadata"]["annotations"]
        for policy in ("a", "b"):
            verdict = fleet.ctx.verdicts[policy, "n"]
            assert verdict.overridden and verdict.wanted_action is None, policy
        assert not any(fleet.ctx.verdicts.wanting[p] for p in ("a", "b")), "no budget place asked for"

        await fleet.tick(30)
        await fleet.deliver("n", ecc(1))  # the same evidence, reported again
        assert not fleet.cordoned("n")
        assert fleet.cluster.gpunodes["n"]["status"]["action"] == vocabulary.NodeAction.OVERRIDDEN

        await fleet.deliver("n", ecc(2))  # new evidence: the count grew
        assert fleet.cordoned("n")

    asyncio.run(scenario())


def xids(**counts: int) -> dict[str, Any]:
    """GPU 0 reports these XIDs (`x79=1`: XID 79 seen once)."""
    seen = [{"code": int(code[1:]), "count": count} for code, count in counts.items()]
    return gpunode_facts.agent_status(overrides={0: {"xids": seen}})


def test_an_uncordon_holds_against_a_second_policy_with_more_critical_xids() -> None:
    """Policy `a` cordons on XID 79, `b` on XIDs 79 and 13; the node shows both. A human uncordons it:
    the evidence standing then is every selecting policy's, so `b` does not take XID 13 (which `a`
    does not count) for new evidence and cordon the node again; XID 13 seen again later is new."""

    async def scenario() -> None:
        fleet = MemoryFleet(
            [{"name": "xid", "condition": "XidCritical", "action": "Cordon", "xids": [79]}], ("a", "b")
        )
        fleet.policies[1]["spec"]["rules"][0]["xids"] = [79, 13]
        await fleet.start(["n"])
        await fleet.deliver("n", xids(x79=1, x13=2))
        assert fleet.cordoned("n")

        await uncordon_by_hand(fleet, "n")
        assert not fleet.cordoned("n"), "policy b cordoned the node again on the evidence the human overrode"
        await fleet.tick(30)
        await fleet.deliver("n", xids(x79=1, x13=2))
        assert not fleet.cordoned("n")

        await fleet.deliver("n", xids(x79=1, x13=3))  # XID 13 again: new evidence, for b
        assert fleet.cordoned("n")
        assert fleet.cluster.nodes["n"]["metadata"]["annotations"][keys.CORDONED_BY_ANNOTATION] == "b"

    asyncio.run(scenario())


def hot() -> dict[str, Any]:
    """GPU 0 thermally throttled (a sustained condition: rules wait `forSeconds` for it)."""
    return gpunode_facts.agent_status(
        overrides={0: {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}}
    )


def test_an_uncordon_holds_against_two_policies_that_wait_differently_for_one_condition() -> None:
    """Policy `a` cordons after 10 s of throttling, `b` after 60 s; a human uncordons the node once both
    want it cordoned. The condition's episode is one (its state is the node's, kept in the GPUNode
    status), so neither policy takes the other's wait for a new episode and cordons the node again."""

    async def scenario() -> None:
        rule = {"name": "hot", "condition": "ThermalThrottled", "action": "Cordon", "forSeconds": 10}
        fleet = MemoryFleet([rule], ("a", "b"))
        fleet.policies[1]["spec"]["rules"][0]["forSeconds"] = 60
        await fleet.start(["n"])
        await fleet.deliver("n", hot())
        await fleet.tick(15)
        assert fleet.cordoned("n")
        await fleet.tick(60)
        assert all(fleet.ctx.verdicts[p, "n"].wanted_action is vocabulary.Action.CORDON for p in ("a", "b"))

        await uncordon_by_hand(fleet, "n")
        assert not fleet.cordoned("n"), "cordoned again in the uncordon's own pass"
        await fleet.tick(30)
        await fleet.deliver("n", hot())
        assert not fleet.cordoned("n"), "cordoned again on the evidence the human overrode"
        assert all(fleet.ctx.verdicts[p, "n"].overridden for p in ("a", "b"))

    asyncio.run(scenario())
