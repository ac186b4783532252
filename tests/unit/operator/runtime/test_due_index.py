"""The timer's due-node index finds exactly the nodes a scan of every node would (issue 29).

`ticker.due_nodes` asks `is_due` only of the candidates `decisions.due` names;
the scan it replaced asked every node. A node the scan would have judged and
the index missed is a fault left unjudged until the slow full pass, so the
property is checked against the scan itself, over random histories of the
things that make a node due: reports (fresh, silent, without a heartbeat,
pending a condition), Nodes cordoned, labelled or deleted, verdicts stored
and forgotten, nodes waiting for the budget, drains, agent pods turning
NotReady, policies changing, and time passing the stale deadline.
"""

import datetime
import random
from typing import Any

import pytest

import gpunode_facts
import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import due, policies
from gpuhealth_operator.runtime import ticker
from gpuhealth_operator.shared import context

START = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
NODES = [f"n{i}" for i in range(10)]


def _context() -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    return operator_context.new_context(client)


def _policy(name: str, threshold: int = 1) -> policies.model.Policy:
    return policies.parse_policy(
        name,
        threshold,
        {"rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Cordon"}]},
    )


def _scan(ctx: context.Context, now: datetime.datetime) -> list[str]:
    """The timer's old question, asked of every node."""
    return [n for n in ctx.cache.gpunodes if n in ctx.cache.nodes and ticker.is_due(ctx, n, now)]


class History:
    """One random history of one small fleet."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.ctx = _context()
        self.now = START
        self.version = 0
        self.ctx.cache.put_policy(_policy("p"))

    def _version(self) -> str:
        self.version += 1
        return str(self.version)

    def node(self, name: str) -> None:
        pick = self.random.random
        labels = {keys.HEALTH_LABEL: self.random.choice(["healthy", "healthy", "unhealthy"])}
        if pick() < 0.1:
            labels[keys.THERMAL_LABEL] = "true"
        annotations = {keys.CORDONED_BY_ANNOTATION: "p"} if pick() < 0.15 else {}
        if pick() < 0.1:
            annotations[keys.REPAIR_ANNOTATION] = "{}"
        taints = [{"key": keys.UNVALIDATED_TAINT, "effect": "NoSchedule"}] if pick() < 0.1 else []
        self.ctx.cache.put_node(
            {
                "metadata": {
                    "name": name,
                    "resourceVersion": self._version(),
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": {"unschedulable": bool(annotations), "taints": taints},
            }
        )

    def report(self, name: str) -> None:
        pick = self.random.random
        heartbeat = self.random.choice([30, 60, 300])
        status: dict[str, Any] = gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(
                self.now - datetime.timedelta(seconds=self.random.choice([0, 5]))
            ),
            heartbeat_seconds=heartbeat,
        )
        if pick() < 0.1:
            status["agent"].pop("lastHeartbeatTime")  # stale at once: no valid heartbeat
        status.update({"health": "Healthy", "action": self.random.choice(["None"] * 6 + ["Pending"])})
        status["conditions"] = (
            [{"type": "ThermalThrottled", "status": "False", "observedSince": "2026-01-01T11:59:59Z"}]
            if pick() < 0.1
            else []
        )
        self.ctx.cache.put_gpunode(
            {"metadata": {"name": name, "resourceVersion": self._version()}, "status": status}, now=self.now
        )

    def agent_pod(self, name: str, ready: bool) -> None:
        self.ctx.agent_pods.observe(
            {
                "metadata": {"namespace": "gpu-health", "name": f"agent-{name}"},
                "spec": {"nodeName": name},
                "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            },
            self.now,
        )

    def step(self) -> None:
        """One random change to the fleet, the operator's memory, or the clock."""
        ctx, name = self.ctx, self.random.choice(NODES)
        roll = self.random.random()
        if roll < 0.2:
            self.report(name)
        elif roll < 0.3:
            self.node(name)
        elif roll < 0.35:
            ctx.cache.remove_node(name)
        elif roll < 0.38:
            ctx.cache.remove_gpunode(name)
        elif roll < 0.5:
            ctx.verdicts[("p", name)] = gpunode_facts.verdict(node=name)
        elif roll < 0.55:
            ctx.verdicts.pop(("p", name), None)
        elif roll < 0.58:
            ctx.verdicts.forget_node(name)
        elif roll < 0.62:
            if not ctx.admission.start_waiting("p", name):
                ctx.admission.stop_waiting("p", name)
        elif roll < 0.65:
            if ctx.steps.drain.tasks.pop(name, None) is None:
                ctx.steps.drain.tasks[name] = object()  # type: ignore[assignment]  # only its presence is read
        elif roll < 0.7:
            self.agent_pod(name, ready=self.random.random() < 0.5)
        elif roll < 0.72:
            ctx.agent_pods.forget_node(name)
        elif roll < 0.74:
            ctx.cache.put_policy(_policy(self.random.choice(["p", "q"]), self.random.randint(1, 5)))
        elif roll < 0.75:
            ctx.cache.remove_policy("q")
        else:
            self.now += datetime.timedelta(seconds=self.random.choice([0.5, 1, 1, 2, 30, 59, 170, 600]))


@pytest.mark.parametrize("seed", range(40))
def test_the_index_finds_every_node_the_scan_finds_in_the_same_order(seed: int) -> None:
    history = History(seed)
    for _ in range(400):
        history.step()
        if history.random.random() < 0.4:  # a timer pass
            expected = _scan(history.ctx, history.now)
            full = history.random.random() < 0.05
            assert ticker.due_nodes(history.ctx, history.now, full=full) == expected, (seed, history.now)


def test_a_quiet_node_becomes_due_by_time_alone_two_ticks_before_its_agent_turns_stale() -> None:
    history = History(0)
    history.node("n0")
    history.random = random.Random(7)
    ctx = history.ctx
    status = gpunode_facts.agent_status(heartbeat=gpunode_facts.rfc3339(history.now), heartbeat_seconds=60)
    status.update({"health": "Healthy", "action": "None", "conditions": []})
    ctx.cache.put_gpunode({"metadata": {"name": "n0", "resourceVersion": "99"}, "status": status}, now=START)
    ctx.verdicts[("p", "n0")] = gpunode_facts.verdict(node="n0")
    assert ticker.due_nodes(ctx, START, full=False) == []
    limit = ctx.cache.gpunode("n0").stale_limit  # type: ignore[union-attr]
    assert limit is not None
    early = START + datetime.timedelta(seconds=limit - 2 * ctx.config.tick_seconds - 1)
    assert ticker.due_nodes(ctx, early, full=False) == []
    on_time = START + datetime.timedelta(seconds=limit - 2 * ctx.config.tick_seconds)
    assert ticker.due_nodes(ctx, on_time, full=False) == ["n0"]
    later = on_time + datetime.timedelta(seconds=600)
    assert ticker.due_nodes(ctx, later, full=False) == ["n0"], "still due until it reports"


def test_a_pass_at_rest_asks_only_what_changed() -> None:
    """The point of the index: 1,000 quiet nodes, one report, one candidate."""
    ctx = _context()
    ctx.cache.put_policy(_policy("p"))
    status = gpunode_facts.agent_status(heartbeat=gpunode_facts.rfc3339(START), heartbeat_seconds=300)
    status.update({"health": "Healthy", "action": "None", "conditions": []})
    for i in range(1000):
        name = f"n{i}"
        ctx.cache.put_node({"metadata": {"name": name, "resourceVersion": str(i)}, "spec": {}})
        ctx.cache.put_gpunode(
            {"metadata": {"name": name, "resourceVersion": str(i)}, "status": status}, START
        )
        ctx.verdicts[("p", name)] = gpunode_facts.verdict(node=name)
    assert ticker.due_nodes(ctx, START, full=False) == []  # the first pass looks at all of them
    asked: list[str] = []
    real = ticker.is_due
    try:
        ticker.is_due = lambda c, n, now: asked.append(n) or real(c, n, now)  # type: ignore[assignment]
        ctx.cache.put_gpunode(
            {"metadata": {"name": "n7", "resourceVersion": "5000"}, "status": status}, START
        )
        assert ticker.due_nodes(ctx, START + datetime.timedelta(seconds=1), full=False) == []
    finally:
        ticker.is_due = real  # type: ignore[assignment]
    assert asked == ["n7"]


def test_index_deadlines() -> None:
    index = due.DueIndex()
    assert index.take(0.0, 0.0) is None, "a new index looks at everything once"
    index.expect("a", 100.0)
    index.expect("b", 50.0)
    assert index.take(10.0, 2.0) == set()
    index.expect("a", 200.0)  # it reported: later
    index.expect("b", 40.0)  # its heartbeat shortened: earlier
    assert index.take(39.0, 2.0) == {"b"}
    assert index.take(120.0, 2.0) == set(), "a's old deadline moved on"
    assert index.take(198.0, 2.0) == {"a"}
    assert index.take(10_000.0, 2.0) == set(), "a due node waits for `keep` or a new deadline"
    index.keep(["a"])
    index.touch("c")
    assert index.take(10_001.0, 2.0) == {"a", "c"}
    index.expect("d", 5.0)
    index.expect("d", None)
    index.touch_all()
    assert index.take(10_002.0, 2.0) is None
