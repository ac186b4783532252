"""A node at rest whose new report changes nothing a verdict reads is not judged again (`resting`, issue 29):
heartbeats of a healthy node cost no pass, and nothing a pass would do is lost. Through the operator's
own handlers and timer on the in-memory cluster; the last test replays random histories with and without
the shortcut and holds the cluster to the same state after every step."""

from __future__ import annotations

import asyncio
import copy
import datetime
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import gpunode_facts
import handling
from gpuhealth_api import keys
from gpuhealth_operator.runtime import handlers
from gpuhealth_operator.state import cache
from gpuhealth_operator.verdict import resting
from memory_fleet import MemoryFleet

RULES = [
    {"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"},
    {"name": "hot", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 30},
]


def report(
    fleet: MemoryFleet,
    *,
    temperature: int = 42,
    clock: int = 1980,
    overrides: dict[int, dict[str, Any]] | None = None,
    **agent: Any,
) -> dict[str, Any]:
    """The agent's report at the fleet's clock: GPU 0 at `temperature` and `clock` MHz, then `overrides`."""
    gpus = {0: {"temperatureCelsius": temperature, "smClockMHz": clock}} | (overrides or {})
    at = fleet.now.isoformat().replace("+00:00", "Z")
    status = gpunode_facts.agent_status(overrides=gpus, heartbeat=at, observed=at, heartbeat_seconds=60)
    status["agent"].update(agent)
    return status


async def heartbeat(fleet: MemoryFleet, name: str, seconds: float = 60, **kwargs: Any) -> None:
    fleet.now += datetime.timedelta(seconds=seconds)
    await fleet.deliver(name, report(fleet, **kwargs))


def status(fleet: MemoryFleet, name: str) -> dict[str, Any]:
    return fleet.cluster.gpunodes[name]["status"]


async def at_rest(name: str) -> MemoryFleet:
    """A fleet of one healthy node whose last pass left it at rest."""
    fleet = MemoryFleet(RULES)
    await fleet.start([name])
    await heartbeat(fleet, name, 0)
    await heartbeat(fleet, name)  # the first pass wrote the status; this one ends at rest
    assert name in fleet.ctx.judging.resting, "a healthy node with its status written rests"
    return fleet


def test_a_heartbeat_of_a_node_at_rest_is_not_judged_again_and_changes_nothing() -> None:
    async def scenario() -> None:
        fleet = await at_rest("n")
        verdict = fleet.ctx.verdicts["p", "n"]
        node, written = copy.deepcopy(fleet.cluster.nodes["n"]), copy.deepcopy(status(fleet, "n"))
        for temperature in (45, 51, 39):  # moving samples: no verdict reads them below slowdown
            await heartbeat(fleet, "n", temperature=temperature)
        assert fleet.ctx.verdicts["p", "n"] is verdict, "judged again"
        assert fleet.cluster.nodes["n"] == node
        ours = {k: v for k, v in status(fleet, "n").items() if k not in ("agent", "summary", "gpus", "nics")}
        assert ours == {k: v for k, v in written.items() if k not in ("agent", "summary", "gpus", "nics")}

    asyncio.run(scenario())


def kubelet_heartbeat(node: dict[str, Any]) -> None:
    """What a kubelet's (kwok's) Node status update changes: its Ready condition's heartbeat time, and
    the annotations and fields of other tools. No decision reads them."""
    annotations = node["metadata"].setdefault("annotations", {})
    beats = int(annotations.get("node.alpha.kubernetes.io/ttl", "0")) + 1
    annotations["node.alpha.kubernetes.io/ttl"] = str(beats)
    conditions = node.setdefault("status", {}).setdefault("conditions", [])
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady"}
        conditions.append(ready)
    ready["lastHeartbeatTime"] = f"2026-11-28T00:{beats // 60 % 60:02d}:{beats % 60:02d}Z"


def test_a_kubelet_heartbeat_on_the_node_leaves_it_at_rest() -> None:
    """A Node's status update every few seconds changes nothing a verdict reads: the GPUNode report after
    it is not judged again. At 5,000 live nodes nearly every report followed one, so none rested."""

    async def scenario() -> None:
        fleet = await at_rest("n")
        await fleet.edit_node("n", kubelet_heartbeat)  # Ready appears: a Node condition a rule may name
        await heartbeat(fleet, "n")
        verdict = fleet.ctx.verdicts["p", "n"]
        for temperature in (45, 51):
            await fleet.edit_node("n", kubelet_heartbeat)
            await heartbeat(fleet, "n", temperature=temperature)
        assert fleet.ctx.verdicts["p", "n"] is verdict, "judged again after a kubelet heartbeat"
        await fleet.edit_node("n", lambda node: node["metadata"]["labels"].update({"team": "b"}))
        await heartbeat(fleet, "n", temperature=47)
        assert fleet.ctx.verdicts["p", "n"] is not verdict, "a label a selector may read was not judged"

    asyncio.run(scenario())


def test_a_node_at_rest_holds_no_parsed_conditions_and_its_next_judgement_parses_them_again() -> None:
    """Only a judgement reads the parsed conditions: a node at rest drops them (memory per node, issue
    29), and a fault after rest is judged against the conditions it holds, parsed anew."""

    async def scenario() -> None:
        fleet = await at_rest("n")
        await heartbeat(fleet, "n", temperature=44)
        record = fleet.ctx.cache.gpunode("n")
        assert record is not None and "n" in fleet.ctx.judging.resting
        assert record.held("conditions") is cache.UNSET, "a node at rest kept its parsed conditions"
        hot = {0: {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}}
        await heartbeat(fleet, "n", overrides=hot)
        thermal = next(c for c in status(fleet, "n")["conditions"] if c["type"] == "ThermalThrottled")
        assert thermal.get("observedSince"), "the pending clock was not started from the parsed conditions"

    asyncio.run(scenario())


def test_a_fault_in_the_report_after_rest_is_cordoned_by_that_report() -> None:
    async def scenario() -> None:
        fleet = await at_rest("n")
        await heartbeat(fleet, "n", overrides={3: {"ecc": {"uncorrectedVolatile": 1}}})
        assert fleet.cordoned("n")
        assert "n" not in fleet.ctx.judging.resting
        assert status(fleet, "n")["health"] == "Unhealthy"

    asyncio.run(scenario())


def test_a_sustained_fault_after_rest_starts_its_clock_and_is_acted_on_after_for_seconds() -> None:
    async def scenario() -> None:
        fleet = await at_rest("n")
        hot = {0: {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}}
        await heartbeat(fleet, "n", overrides=hot)
        thermal = next(c for c in status(fleet, "n")["conditions"] if c["type"] == "ThermalThrottled")
        assert thermal.get("observedSince"), "the pending clock was written by the report's own pass"
        await heartbeat(fleet, "n", 31, overrides=hot)
        assert fleet.labels("n").get(keys.THERMAL_LABEL) == "true"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("change", "health"),
    [
        ({"error": {"reason": "NoGPUsVisible", "message": "the runtime hides them"}}, "Unknown"),
        ({"expectedGpuCount": 9}, "Unhealthy"),  # GPULost: one GPU fewer than the node has
    ],
    ids=["agent-error", "gpu-missing"],
)
def test_an_agent_field_a_verdict_reads_is_judged_at_once(change: dict[str, Any], health: str) -> None:
    async def scenario() -> None:
        fleet = await at_rest("n")
        await heartbeat(fleet, "n", **change)
        assert status(fleet, "n")["health"] == health

    asyncio.run(scenario())


def test_an_agent_repeating_its_last_heartbeat_turns_stale_as_if_silent() -> None:
    """A report whose heartbeat time did not move is no sign of life: the shortcut does not keep it fresh."""

    async def scenario() -> None:
        fleet = await at_rest("n")
        repeated = report(fleet)
        for _ in range(5):
            fleet.now += datetime.timedelta(seconds=60)
            repeated["gpus"][0]["temperatureCelsius"] += 1
            await fleet.deliver("n", repeated)
        await fleet.tick(1)
        assert status(fleet, "n")["health"] == "Unknown"

    asyncio.run(scenario())


def test_a_human_edit_of_our_label_is_undone_by_the_next_pass() -> None:
    async def scenario() -> None:
        fleet = await at_rest("n")
        await fleet.edit_node(
            "n", lambda node: node["metadata"]["labels"].update({keys.HEALTH_LABEL: "unhealthy"})
        )
        await heartbeat(fleet, "n")
        assert fleet.labels("n")[keys.HEALTH_LABEL] == "healthy"

    asyncio.run(scenario())


@contextmanager
def without_resting() -> Iterator[None]:
    """Every report judged (the operator before `resting`)."""
    original = resting.unchanged
    resting.unchanged = lambda *args, **kwargs: False  # type: ignore[assignment]
    try:
        yield
    finally:
        resting.unchanged = original  # type: ignore[assignment]


NODES = ["a", "b", "c", "d", "e", "f"]
"""A straggler cohort (at least `straggler_stats.MIN_PEERS` peers), `a` the one whose clock wanders."""


def _steps(seed: int) -> list[tuple[str, str, dict[str, Any]]]:
    rng = random.Random(seed)
    steps: list[tuple[str, str, dict[str, Any]]] = []
    for _ in range(80):
        name = rng.choice(NODES)
        kind = rng.choices(
            ["heartbeat", "hot", "ecc", "tick", "uncordon", "repeat", "kubelet"], [14, 2, 1, 4, 1, 1, 4]
        )[0]
        args = {"seconds": rng.choice([1, 10, 29, 31, 60, 200]), "t": rng.randint(30, 80)}
        args["clock"] = (
            rng.choice([1980, 1960, 1900, 1700, 1400]) if name == "a" else rng.choice([1980, 1960])
        )
        steps.append((kind, name, args))
    return steps


async def _play(steps: list[tuple[str, str, dict[str, Any]]]) -> list[Any]:
    fleet = MemoryFleet(RULES, policies=("p", "q"))
    fleet.policies[1]["spec"]["rules"] = [
        {"name": "hot", "condition": "ThermalThrottled", "action": "Taint"},
        {"name": "slow", "condition": "Straggler", "action": "Label", "forSeconds": 60},
    ]
    await fleet.start(NODES)
    last: dict[str, dict[str, Any]] = {}
    for name in NODES:
        last[name] = report(fleet)
        await fleet.deliver(name, last[name])
    seen = []
    for kind, name, args in steps:
        if kind == "tick":
            await fleet.tick(args["seconds"])
        elif kind == "uncordon":
            await fleet.edit_node(name, lambda node: node["spec"].pop("unschedulable", None))
        elif kind == "kubelet":
            await fleet.edit_node(name, kubelet_heartbeat)
        elif kind == "repeat":
            fleet.now += datetime.timedelta(seconds=args["seconds"])
            await fleet.deliver(name, last[name])
        else:
            fleet.now += datetime.timedelta(seconds=args["seconds"])
            overrides: dict[int, dict[str, Any]] = {}
            if kind == "hot":
                overrides = {1: {"temperatureCelsius": 95, "clockEventReasons": ["HwThermalSlowdown"]}}
            elif kind == "ecc":
                overrides = {2: {"ecc": {"uncorrectedVolatile": 1}}}
            last[name] = report(fleet, temperature=args["t"], clock=args["clock"], overrides=overrides)
            await fleet.deliver(name, last[name])
        seen.append(
            (
                copy.deepcopy(fleet.cluster.nodes),
                {n: copy.deepcopy(g["status"]) for n, g in fleet.cluster.gpunodes.items()},
                [(e["reason"], e["message"]) for e in fleet.cluster.event_log],
            )
        )
    return seen


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_leave_the_cluster_as_judging_every_report_does(seed: int) -> None:
    steps = _steps(seed)
    shortcut = asyncio.run(_play(steps))
    with without_resting():
        judged = asyncio.run(_play(steps))
    for i, (got, want) in enumerate(zip(shortcut, judged, strict=True)):
        assert got == want, f"step {i} ({steps[i]}) left the cluster otherwise"


def test_a_pass_cut_by_an_api_outage_leaves_nothing_kept_and_the_next_report_is_judged() -> None:
    """A human mislabels the node during an API outage: that pass fails half-way (nothing written). The
    first report after the outage must not be taken for one the last pass at rest judged."""

    async def scenario() -> None:
        fleet = await at_rest("n")
        serve = fleet.cluster.request

        async def down(*args: Any, **kwargs: Any) -> Any:
            raise OSError("connection refused")

        fleet.cluster.request = down
        mislabel = {keys.HEALTH_LABEL: "unhealthy"}
        await fleet.edit_node("n", lambda node: node["metadata"]["labels"].update(mislabel))
        assert "n" not in fleet.ctx.judging.resting, "a pass that did not finish keeps nothing"
        fleet.cluster.request = serve
        await heartbeat(fleet, "n")
        assert fleet.labels("n")[keys.HEALTH_LABEL] == "healthy"

    asyncio.run(scenario())


def test_a_deleted_and_recreated_node_is_judged_afresh() -> None:
    async def scenario() -> None:
        fleet = await at_rest("n")
        fleet.cluster.delete_gpunode("n")
        gone = {"metadata": {"name": "n", "uid": "uid-gpunode-n", "resourceVersion": "99"}}
        await handling.handle(handlers.on_gpunode, {"type": "DELETED", "object": gone}, fleet.ctx)
        assert "n" not in fleet.ctx.judging.resting
        await heartbeat(fleet, "n", overrides={5: {"ecc": {"uncorrectedVolatile": 1}}})  # its new GPUNode
        assert fleet.cordoned("n")

    asyncio.run(scenario())
