"""The policies' status and fleet gauges follow change, not fleet size (issue 29).

A timer pass recounts a policy's status only when something it counts moved; at rest a refresh
counts no node and only carries the GPU gauges forward. Held to what a recount from scratch says
after every pass of random histories (cordons by either policy, taints, labels that select or retire,
verdicts of every health and Unknown reason, nodes waiting for the budget, GPUs isolated, drains
running or failed, the DeviceTaintRule probe's answer), so a change the marks miss shows as a stale
status or gauge at once, not ten seconds later.
"""

import asyncio
import dataclasses
import datetime
import random
from typing import Any

import pytest

import gpunode_facts
import operator_context
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import drain, kube
from gpuhealth_operator.decisions import isolation, policies
from gpuhealth_operator.ladder.isolate import isolation_sweep
from gpuhealth_operator.runtime import reconciler, ticker
from gpuhealth_operator.shared import context, metrics
from gpuhealth_operator.verdict import judging

T0 = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
NODES = [f"n{i}" for i in range(6)]
POLICIES = ("a", "b")
A100 = "NVIDIA A100-SXM4-80GB"
GAUGES = (
    "gpuhealth_operator_nodes",
    "gpuhealth_operator_unknown_nodes",
    "gpuhealth_operator_budget_pending_nodes",
    "gpuhealth_operator_drain_failed_nodes",
    "gpuhealth_operator_nodes_retired",
    "gpuhealth_operator_isolated_gpus",
)
GPU_GAUGES = (
    "gpuhealth_operator_gpus",
    "gpuhealth_operator_gpus_healthy",
    "gpuhealth_operator_gpus_out_of_service",
)


class Client(kube.Kube):
    """Accepts every policy status apply (the client the recount writes through)."""

    def __init__(self) -> None:
        super().__init__(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
        self.applied: list[str] = []
        self.failing = 0

    async def apply(self, path: str, body: object, field_manager: str) -> kube.JsonObject:
        if self.failing:
            self.failing -= 1
            raise kube.ApiError(503, "ServiceUnavailable", "the API server is restarting")
        self.applied.append(path.split("/")[-2])
        return {}


def fleet(monkeypatch: pytest.MonkeyPatch) -> context.Context:
    """Two policies over six nodes; the timer's judging and acting left out (only its status part runs)."""

    async def not_acting(*args: Any) -> None:
        return None

    monkeypatch.setattr(reconciler, "reconcile_node", not_acting)
    monkeypatch.setattr(judging, "judge", lambda *args: None)
    monkeypatch.setattr(isolation_sweep, "sweep", not_acting)  # no DeviceTaintRule is served here
    ctx = operator_context.new_context(Client(), clock=lambda: T0)
    ctx.cache.put_policy(
        policies.parse_policy(
            "a",
            1,
            {
                "nodeSelector": {"matchLabels": {"pool": "gpu"}},
                "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Drain"}],
            },
        )
    )
    ctx.cache.put_policy(
        policies.parse_policy(
            "b", 1, {"rules": [{"name": "e", "condition": "EccUncorrectable", "action": "IsolateGPU"}]}
        )
    )
    return ctx


class History:
    """Random changes to what a policy's status counts, each as the operator's own code would store it."""

    def __init__(self, ctx: context.Context, rng: random.Random) -> None:
        self.ctx, self.rng, self.version = ctx, rng, 0
        for name in NODES:
            self.node(name)
            self.gpunode(name)

    def step(self) -> None:
        change = self.rng.choice(
            [self.node, self.gpunode, self.verdict, self.verdict, self.waiting, self.isolated, self.drain]
        )
        change(self.rng.choice(NODES))
        if self.rng.random() < 0.1:
            self.probed()

    def _rv(self) -> str:
        self.version += 1
        return str(self.version)

    def node(self, name: str) -> None:
        rng = self.rng
        labels = {"pool": "gpu"} if rng.random() < 0.8 else {}
        if rng.random() < 0.2:
            labels[keys.NEEDS_REPAIR_LABEL] = keys.NEEDS_REPAIR_MANUAL
        by = rng.choice([None, "a", "b"])
        taints = [{"key": keys.UNHEALTHY_TAINT, "effect": "NoSchedule"}] if rng.random() < 0.3 else []
        self.ctx.cache.put_node(
            {
                "metadata": {
                    "name": name,
                    "resourceVersion": self._rv(),
                    "labels": labels,
                    "annotations": {keys.CORDONED_BY_ANNOTATION: by} if by else {},
                },
                "spec": {"unschedulable": by is not None or rng.random() < 0.1, "taints": taints},
                "status": {"capacity": {keys.GPU_RESOURCE: str(rng.choice([4, 8]))}},
            }
        )

    def gpunode(self, name: str) -> None:
        rng = self.rng
        status = gpunode_facts.agent_status(
            gpus=rng.choice([4, 8]), model=rng.choice([gpunode_facts.MODEL, A100])
        )
        status["summary"]["maxTemperatureCelsius"] = rng.randint(30, 90)  # moves with every report
        if rng.random() < 0.5:
            status["action"] = rng.choice([a.value for a in vocabulary.NodeAction])
        self.ctx.cache.put_gpunode(
            {"metadata": {"name": name, "resourceVersion": self._rv()}, "status": status}, T0
        )

    def verdict(self, name: str) -> None:
        rng, key = self.rng, (rng_policy := self.rng.choice(POLICIES), name)
        if rng.random() < 0.15:
            if key in self.ctx.verdicts:
                del self.ctx.verdicts[key]
            return
        health = rng.choice(list(vocabulary.Health))
        unknown = (vocabulary.Condition.AGENT_STALE, vocabulary.Condition.GPU_OPERATOR_MAINTENANCE)
        issues = (rng.choice(unknown),) if health is vocabulary.Health.UNKNOWN else ()
        self.ctx.verdicts[key] = dataclasses.replace(
            gpunode_facts.verdict(node=name),
            health=health,
            issues=issues,
            wanted_action=rng.choice([None, vocabulary.Action.TAINT, vocabulary.Action.DRAIN]),
            wanted_taint=rng.choice([None, "EccUncorrectable"]),
        )
        assert rng_policy in POLICIES

    def waiting(self, name: str) -> None:
        key = (self.rng.choice(POLICIES), name)
        notified = self.ctx.admission.notified
        notified.discard(key) if key in notified else notified.add(key)

    def isolated(self, name: str) -> None:
        key = (self.rng.choice(POLICIES), name)
        if self.rng.random() < 0.3:
            self.ctx.steps.isolate.isolations.pop(key, None)
            return
        gpus = self.rng.sample(range(8), self.rng.randint(0, 3))
        held = tuple(isolation.Isolated(i, f"GPU-{i}", f"rule-{i}") for i in sorted(gpus))
        self.ctx.steps.isolate.isolations[key] = isolation.NodeState(None, held)

    def drain(self, name: str) -> None:
        drains = self.ctx.steps.drain
        what = self.rng.choice(["none", "failed", "completed", "running"])
        drains.results.pop(name, None)
        drains.tasks.pop(name, None)
        if what in ("failed", "completed"):
            drains.results[name] = drain.Result(what == "completed", (), 0, ())
        elif what == "running":
            drains.tasks[name] = asyncio.get_running_loop().create_future()  # type: ignore[assignment]
            drains.policies[name] = "a"

    def probed(self) -> None:
        found = self.rng.choice([None, "v1alpha3", "v1beta2"])
        self.ctx.steps.isolate.support["b"] = isolation.Support(
            1, found, "probed", definite=self.rng.random() < 0.7
        )


def written(ctx: context.Context) -> dict[str, Any]:
    return {name: _without_times(status) for name, status in ctx.status.written.items()}


def recounted(ctx: context.Context, now: datetime.datetime) -> tuple[dict[str, Any], metrics.Metrics]:
    """Every policy's status counted from scratch, with gauges of their own (GPUs counted)."""
    meters = metrics.Metrics.create()
    fresh = dataclasses.replace(ctx, meters=meters)
    statuses = {
        name: _without_times(ticker.policy_status(fresh, name, now)) for name in sorted(ctx.cache.policies)
    }
    return statuses, meters


def _without_times(status: dict[str, Any]) -> dict[str, Any]:
    return {
        **status,
        "conditions": [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status["conditions"]
        ],
    }


def gauges(meters: metrics.Metrics, names: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    return {
        (s.name, *sorted(s.labels.items())): s.value  # type: ignore[arg-type]
        for family in meters.registry.collect()
        for s in family.samples
        if s.name in names
    }


@pytest.mark.parametrize("seed", range(12))
def test_after_every_pass_the_status_and_gauges_are_what_a_recount_says(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    ctx = fleet(monkeypatch)

    async def scenario() -> None:
        rng = random.Random(seed)
        history = History(ctx, rng)
        now = T0
        await ticker.tick(ctx, full=True)
        for step in range(60):
            history.step()
            refresh = step % 5 == 4
            now += datetime.timedelta(seconds=10 if refresh else 1)
            ctx.clock = lambda now=now: now
            await ticker.tick(ctx, refresh=refresh)
            statuses, meters = recounted(ctx, now)
            assert written(ctx) == statuses, f"seed {seed}, step {step}: a stale policy status"
            assert gauges(ctx.meters, GAUGES) == gauges(meters, GAUGES), f"seed {seed}, step {step}"
            if refresh:
                assert gauges(ctx.meters, GPU_GAUGES) == gauges(meters, GPU_GAUGES), (
                    f"seed {seed}, step {step}"
                )

    asyncio.run(scenario())


def test_a_refresh_at_rest_counts_no_node_and_the_gpu_hours_lost_still_grow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An hour at rest: one count at the start, then only the carried tally; the hours lost are those
    of the GPUs out of service for the hour, as counted every 10 s before."""
    ctx = fleet(monkeypatch)
    counted: list[str] = []
    policy_status = ticker.policy_status

    def counting(ctx: context.Context, name: str, now: datetime.datetime, **kwargs: Any) -> dict[str, Any]:
        counted.append(name)
        return policy_status(ctx, name, now, **kwargs)

    monkeypatch.setattr(ticker, "policy_status", counting)

    async def scenario() -> None:
        for name in NODES:
            ctx.cache.put_node(
                {
                    "metadata": {"name": name, "resourceVersion": "1", "labels": {"pool": "gpu"}},
                    "spec": {"unschedulable": name == "n0"},
                }
            )
            ctx.cache.put_gpunode(
                {"metadata": {"name": name, "resourceVersion": "1"}, "status": gpunode_facts.agent_status()},
                T0,
            )
            for policy in POLICIES:
                ctx.verdicts[(policy, name)] = gpunode_facts.verdict(node=name)
        ctx.cache.put_node(
            {
                "metadata": {
                    "name": "n0",
                    "resourceVersion": "2",
                    "labels": {"pool": "gpu"},
                    "annotations": {keys.CORDONED_BY_ANNOTATION: "a"},
                },
                "spec": {"unschedulable": True},
            }
        )
        await ticker.tick(ctx, refresh=True)
        assert counted == ["a", "b"]
        for seconds in range(10, 3601, 10):
            now = T0 + datetime.timedelta(seconds=seconds)
            ctx.clock = lambda now=now: now
            await ticker.tick(ctx, refresh=True)
        assert counted == ["a", "b"], "a refresh at rest counted the nodes again"
        lost = gauges(ctx.meters, ("gpuhealth_operator_gpu_hours_lost_total",))
        by_policy = {dict(key[1:])["policy"]: round(value, 6) for key, value in lost.items()}
        assert by_policy == {"a": 8.0, "b": 0.0}, "one cordoned node's 8 GPUs for an hour, in policy a only"

        now += datetime.timedelta(seconds=1)
        ctx.clock = lambda: now
        await ticker.tick(ctx, full=True)
        assert counted == ["a", "b", "a", "b"], "a full pass recounts: the safety net"

    asyncio.run(scenario())


def test_a_status_write_that_failed_is_tried_again_at_the_next_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server refuses the write of a moved status: the next 1 s pass writes it, although
    nothing moved since (not the next refresh, nor the next full pass)."""
    ctx = fleet(monkeypatch)
    client = ctx.client
    assert isinstance(client, Client)

    async def scenario() -> None:
        ctx.cache.put_node({"metadata": {"name": "n0", "resourceVersion": "1", "labels": {"pool": "gpu"}}})
        status = gpunode_facts.agent_status()
        ctx.cache.put_gpunode({"metadata": {"name": "n0", "resourceVersion": "1"}, "status": status}, T0)
        await ticker.tick(ctx, full=True)
        assert client.applied == ["a", "b"]
        ctx.admission.notified.add(("a", "n0"))  # the node waits for policy a's budget
        client.failing = 1
        with pytest.raises(kube.ApiError):
            await ticker.tick(ctx)
        await ticker.tick(ctx)
        assert client.applied == ["a", "b", "a"]
        assert ctx.status.written["a"]["pendingNodes"] == 1

    asyncio.run(scenario())
