"""Overlapping acting policies give the Node one combined wish, so labels never flap between them."""

import asyncio
import copy
import dataclasses
import datetime
from typing import Any

import drain_cluster
import gpunode_facts
import handling
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import model, overlap
from gpuhealth_operator.runtime import handlers, ticker
from gpunode_facts import verdict

NOW = datetime.datetime(2026, 11, 22, tzinfo=datetime.UTC)


def test_a_label_one_policy_sets_is_not_removed_by_another() -> None:
    straggler_rule = verdict({keys.HEALTH_LABEL: "degraded", keys.STRAGGLER_LABEL: "true"})
    no_straggler_rule = verdict({keys.HEALTH_LABEL: "healthy", keys.STRAGGLER_LABEL: None})
    for order in ([straggler_rule, no_straggler_rule], [no_straggler_rule, straggler_rule]):
        combined = overlap.combine(order)
        assert {v.wanted_labels[keys.STRAGGLER_LABEL] for v in combined} == {"true"}
        assert {v.wanted_labels[keys.HEALTH_LABEL] for v in combined} == {"degraded"}


def test_a_label_is_removed_only_when_every_policy_wants_it_gone() -> None:
    combined = overlap.combined_labels(
        [verdict({keys.THERMAL_LABEL: None}), verdict({keys.THERMAL_LABEL: None})]
    )
    assert combined == {keys.THERMAL_LABEL: None}


def test_a_label_a_policy_leaves_alone_is_taken_from_the_others() -> None:
    stale = verdict({})  # a stale agent: the policy leaves the health label as it is
    combined = overlap.combined_labels([stale, verdict({keys.HEALTH_LABEL: "unhealthy"})])
    assert combined == {keys.HEALTH_LABEL: "unhealthy"}


def test_the_most_severe_taint_wins_and_none_only_when_no_policy_taints() -> None:
    taints = [verdict({}, "ThermalThrottled"), verdict({}, None), verdict({}, "EccUncorrectable")]
    assert overlap.combined_taint(taints) == "EccUncorrectable"
    assert overlap.combined_taint([verdict({}), verdict({})]) is None


# --- what the GPUNode status and GPUHealthy report under several policies (issue 24, item 7) ----------

Health = vocabulary.Health
Action = vocabulary.NodeAction


def test_the_reported_verdict_is_the_acting_policies_strongest() -> None:
    reported = overlap.reported
    # A dry run shows only where no acting policy selects the node, however strong its verdict.
    assert reported([(True, Health.UNHEALTHY, Action.DRY_RUN), (False, Health.HEALTHY, Action.NONE)]) == 1
    assert reported([(True, Health.HEALTHY, Action.NONE), (True, Health.UNHEALTHY, Action.DRY_RUN)]) == 1
    # Health first (GPUHealthy follows it), then the action; the first by name on a tie.
    assert (
        reported([(False, Health.DEGRADED, Action.CORDONED), (False, Health.UNHEALTHY, Action.LABELED)]) == 1
    )
    assert (
        reported([(False, Health.UNHEALTHY, Action.LABELED), (False, Health.UNHEALTHY, Action.PENDING)]) == 1
    )
    assert (
        reported([(False, Health.UNHEALTHY, Action.PENDING), (False, Health.UNHEALTHY, Action.DRAINED)]) == 1
    )
    assert (
        reported([(False, Health.UNHEALTHY, Action.DRAINED), (False, Health.UNHEALTHY, Action.DRAINED)]) == 0
    )
    assert reported([(False, Health.UNKNOWN, Action.NONE)]) == 0
    assert set(overlap.ACTION_STRENGTH) == set(vocabulary.NodeAction), "every action has a strength"


def state(condition: vocabulary.Condition, status: str) -> model.ConditionState:
    return model.ConditionState(condition, status, "r", "", NOW)


def test_the_status_holds_the_conditions_only_other_policies_judge() -> None:
    Condition = vocabulary.Condition
    ecc, heat = Condition.ECC_UNCORRECTABLE, Condition.THERMAL_THROTTLED
    shown = dataclasses.replace(verdict(), conditions={ecc: state(ecc, "True")})
    other = dataclasses.replace(verdict(), conditions={ecc: state(ecc, "False"), heat: state(heat, "True")})
    assert overlap.shown_conditions(shown, [other]) == {ecc: state(ecc, "True"), heat: state(heat, "True")}
    assert overlap.shown_conditions(shown, []) == {ecc: state(ecc, "True")}


ECC_CORDON = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}]
ECC_LABEL = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Label"}]
BREAKER_OFF = {"maxNewUnhealthy": "100%"}


def spec(rules: list[dict[str, str]], *, dry_run: bool = False, max_unavailable: int = 1) -> dict[str, Any]:
    return drain_cluster.drain_spec(
        "gpu", rules=rules, dryRun=dry_run, maxUnavailable=max_unavailable, breaker=BREAKER_OFF
    )


def gpu_healthy(cluster: drain_cluster.DrainCluster, name: str) -> dict[str, Any] | None:
    conditions = cluster.nodes[name].get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == keys.NODE_CONDITION_TYPE), None)


def test_a_dry_run_preview_sorting_first_does_not_hide_what_the_acting_policy_did() -> None:
    """The documented preview: a dry-run policy over the fleet beside the acting one, named before it."""

    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        policies_ = {"a-preview": spec(ECC_CORDON, dry_run=True), "fleet": spec(ECC_CORDON)}
        ctx = await drain_cluster.start(cluster, policies_, {"n1": {"pool": "gpu"}})
        await drain_cluster.report(cluster, ctx, "n1", ecc=1)
        assert cluster.nodes["n1"]["spec"].get("unschedulable")
        status = cluster.gpunodes["n1"]["status"]
        assert (status["health"], status["action"]) == ("Unhealthy", "Cordoned")
        condition = gpu_healthy(cluster, "n1")
        assert condition is not None, "GPUHealthy never written: MachineHealthCheck / NHC are blind"
        assert (condition["status"], condition["reason"]) == ("False", "EccUncorrectable")
        assert by_policy(status) == {
            "a-preview": {
                "dryRun": True,
                "health": "Unhealthy",
                "issues": "EccUncorrectable",
                "action": "DryRun",
            },
            "fleet": {
                "dryRun": False,
                "health": "Unhealthy",
                "issues": "EccUncorrectable",
                "action": "Cordoned",
            },
        }

    asyncio.run(scenario())


def test_a_node_held_back_by_the_shared_budget_shows_pending_whichever_policy_sorts_first() -> None:
    """Two acting policies: `a-fleet` only labels ECC faults, `b-pool` cordons them (one at a time)."""

    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        policies_ = {"a-fleet": spec(ECC_LABEL), "b-pool": spec(ECC_CORDON)}
        ctx = await drain_cluster.start(cluster, policies_, {"x": {"pool": "gpu"}, "y": {"pool": "gpu"}})
        await drain_cluster.report(cluster, ctx, "x", ecc=1)
        await drain_cluster.report(cluster, ctx, "y", ecc=1)
        assert cluster.nodes["x"]["spec"].get("unschedulable")
        assert not cluster.nodes["y"]["spec"].get("unschedulable")
        assert cluster.gpunodes["x"]["status"]["action"] == "Cordoned"
        status = cluster.gpunodes["y"]["status"]
        assert status["action"] == "Pending", (
            "held back by the budget, yet reported as the labelling policy's"
        )
        assert by_policy(status)["a-fleet"]["action"] == "Labeled"
        assert by_policy(status)["b-pool"]["action"] == "Pending"

    asyncio.run(scenario())


def test_a_dry_run_policy_is_reported_where_no_acting_policy_selects_the_node() -> None:
    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        ctx = await drain_cluster.start(
            cluster, {"preview": spec(ECC_CORDON, dry_run=True)}, {"n1": {"pool": "gpu"}}
        )
        await drain_cluster.report(cluster, ctx, "n1", ecc=1)
        status = cluster.gpunodes["n1"]["status"]
        assert (status["health"], status["action"]) == ("Unhealthy", "DryRun")
        assert "policies" not in status, "one policy: its verdict is the status"
        assert gpu_healthy(cluster, "n1") is None, "a dry run changes no Node"

    asyncio.run(scenario())


def by_policy(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        entry["policy"]: {k: v for k, v in entry.items() if k != "policy"}
        for entry in status.get("policies") or []
    }


class Clocked:
    """One GPU node on the in-memory cluster under `policies`, on a clock the test moves."""

    def __init__(self, policies_: dict[str, dict[str, Any]]) -> None:
        self.cluster = drain_cluster.DrainCluster()
        self.now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
        self.ctx = drain_cluster.make_context(self.cluster)
        self.ctx.clock = lambda: self.now
        self.policies = policies_

    async def start(self) -> None:
        for name, spec_ in self.policies.items():
            body = drain_cluster.policy_body(name, spec_)
            await handlers.on_policy(drain_cluster.event("ADDED", body), memo=self.ctx)
        self.cluster.put_node(drain_cluster.node_body("n1", {"pool": "gpu"}))
        body = copy.deepcopy(self.cluster.nodes["n1"])
        await handling.handle(handlers.on_node, drain_cluster.event("ADDED", body), self.ctx)
        await self.report(hot=False, ecc=0)

    async def report(self, *, hot: bool, ecc: int, after: float = 0) -> None:
        """`after` seconds later, the agent reports GPU 0 hot (at its slowdown temperature) or not."""
        self.now += datetime.timedelta(seconds=after)
        stamp = gpunode_facts.rfc3339(self.now)
        gpu0: dict[str, Any] = {"ecc": {"uncorrectedVolatile": ecc}}
        if hot:
            gpu0.update(temperatureCelsius=95, slowdownTemperatureCelsius=90)
        facts = gpunode_facts.agent_status(overrides={0: gpu0}, heartbeat=stamp, observed=stamp)
        stored = self.cluster.put_gpunode("n1", facts)
        await handling.handle(
            handlers.on_gpunode, drain_cluster.event("MODIFIED", copy.deepcopy(stored)), self.ctx
        )

    def status(self) -> dict[str, Any]:
        return dict(self.cluster.gpunodes["n1"]["status"])

    def labels(self) -> dict[str, str]:
        return dict(self.cluster.nodes["n1"]["metadata"].get("labels") or {})


THERMAL_LABEL = [{"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60}]


def test_a_policy_that_is_not_reported_keeps_its_hysteresis_clocks() -> None:
    """The status holds each condition only one policy judges, so that policy's forSeconds runs on
    whichever verdict is reported: the dry-run preview of a thermal rule fires beside an acting
    ECC policy."""

    async def scenario() -> None:
        thermal_preview = [{**THERMAL_LABEL[0], "action": "Cordon"}]
        fleet = Clocked({"fleet": spec(ECC_CORDON), "preview": spec(thermal_preview, dry_run=True)})
        await fleet.start()
        for _ in range(4):
            await fleet.report(hot=True, ecc=0, after=30)
        status = fleet.status()
        assert by_policy(status)["preview"]["action"] == "DryRun"
        assert by_policy(status)["preview"]["health"] == "Degraded"
        assert (status["health"], status["action"]) == ("Healthy", "None")  # the acting policy's

    asyncio.run(scenario())


def test_a_label_stays_when_another_policy_becomes_the_reported_one() -> None:
    """`fleet` labels a hot GPU; an ECC fault then makes `pool`'s cordon the strongest verdict: the
    thermal label must not flap because `pool` does not judge heat."""

    async def scenario() -> None:
        fleet = Clocked({"fleet": spec(THERMAL_LABEL), "pool": spec(ECC_CORDON)})
        await fleet.start()
        for _ in range(3):
            await fleet.report(hot=True, ecc=0, after=30)
        assert fleet.labels().get(keys.THERMAL_LABEL) == "true"
        for _ in range(3):
            await fleet.report(hot=True, ecc=1, after=10)
            assert fleet.labels().get(keys.THERMAL_LABEL) == "true", "the thermal label flapped"
        status = fleet.status()
        assert (status["health"], status["action"]) == ("Unhealthy", "Cordoned")
        assert {c["type"]: c["status"] for c in status["conditions"]}["ThermalThrottled"] == "True"

    asyncio.run(scenario())


def test_the_per_policy_list_goes_when_one_policy_is_left() -> None:
    async def scenario() -> None:
        cluster = drain_cluster.DrainCluster()
        policies_ = {"a-preview": spec(ECC_CORDON, dry_run=True), "fleet": spec(ECC_CORDON)}
        ctx = await drain_cluster.start(cluster, policies_, {"n1": {"pool": "gpu"}})
        await drain_cluster.report(cluster, ctx, "n1", ecc=1)
        assert set(by_policy(cluster.gpunodes["n1"]["status"])) == {"a-preview", "fleet"}
        body = drain_cluster.policy_body("a-preview", policies_["a-preview"])
        await handlers.on_policy(drain_cluster.event("DELETED", body), memo=ctx)
        await ticker.tick(ctx, full=True)
        status = cluster.gpunodes["n1"]["status"]
        assert "policies" not in status
        assert (status["health"], status["action"]) == ("Unhealthy", "Cordoned")

    asyncio.run(scenario())
