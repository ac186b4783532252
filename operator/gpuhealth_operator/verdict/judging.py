"""A node's verdict under each policy that selects it: the one place a verdict is made.

A verdict is judged from the cached Node and GPUNode, the node's straggler
score, its agent pod, the isolation decided for its GPUs and the instant, and
stored (`context.Verdicts`), and with those inputs in judging's memory
(`ctx.judging.judged`, checked by `_known`): asked again from the same
objects, the stored verdict is the answer, so the timer judges its due nodes
for the budget's ranking and the reconcile that follows reuses those verdicts.

A pass changes some of its own inputs as it acts (a human's uncordon answered
by dropping our claim, GPUs isolated or taken to the node ladder, a cordon
adopted from a deleted policy). It then asks again here, and what moved is
judged again with every part folded in: the human override
(`decisions.overrides`, inside `verdicts.judge`) and the GPUs' isolation
(`verdicts.with_isolation`, inside `verdicts.judge` too). Nothing else amends a verdict.
"""

from __future__ import annotations

import datetime
import typing
import weakref
from collections.abc import Mapping

from gpuhealth_operator.decisions import isolation, liveness, model, overlap, policies, verdicts
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import cache
from gpuhealth_operator.state.judged import Selection


def selecting_policies(ctx: context.Context, record: cache.NodeRecord) -> list[model.Policy]:
    """The policies that select the node, in name order.

    A pass asks this again after each step that may have changed the Node (`verdict_now`): while the
    Node's version and the policies are the same objects, the answer is the one worked out last
    (`state.judged.Selection`), not every policy's selector matched again.
    """
    every = tuple(p for _, p in sorted(ctx.cache.policies.items()))
    known = ctx.judging.selection
    if (
        known is not None
        and known.view is record.view
        and len(known.every) == len(every)
        and all(a is b for a, b in zip(known.every, every, strict=True))
    ):
        return list(known.selecting)
    selecting = policies.selecting(every, record.view)
    ctx.judging.selection = Selection(record.view, every, tuple(selecting))
    return selecting


def judge(
    ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime
) -> model.NodeVerdict | None:
    """The node's verdict under `policy` now (None: its Node or GPUNode is gone)."""
    node = _node(ctx, name)
    return _judge(ctx, policy, node, now) if node is not None else None


class _Node(typing.NamedTuple):
    """What a node's verdicts under every policy are judged from but the policy and the instant, read once
    for them all (`node_verdicts`, `judged_at`): no `await` comes between, so all of it stays as read."""

    record: cache.NodeRecord
    gpunode: cache.GPUNodeRecord
    isolated: Mapping[tuple[str, str], isolation.NodeState]
    agent_pod: liveness.AgentPod | None


def _node(ctx: context.Context, name: str) -> _Node | None:
    record = ctx.cache.nodes.get(name)
    gpunode = ctx.cache.gpunodes.get(name)
    if record is None or gpunode is None:
        return None
    # The pods' read-only view, not `AgentPods.get`: a dict look-up, no call into their module (issue 46).
    return _Node(record, gpunode, ctx.steps.isolated, ctx.agent_pods.nodes.get(name))


def _judge(
    ctx: context.Context, policy: model.Policy, node: _Node, now: datetime.datetime
) -> model.NodeVerdict:
    key = (policy.name, node.record.view.name)
    inputs = _inputs(ctx, policy, node, now)
    known = _known(ctx, key, inputs)
    if known is not None:
        return known
    record, gpunode = node.record, node.gpunode
    _, _, _, straggler, _, agent_pod, isolated = inputs
    verdict = verdicts.judge(
        policy,
        record.view,
        gpunode.status,
        gpunode.conditions,
        straggler,
        now,
        report_age_seconds=gpunode.report_age(now),
        agent_pod=agent_pod,
        known_signals=gpunode.fact_signals,
        memory=ctx.cache.memory(gpunode),
        isolated=isolated,
    )
    ctx.verdicts[key] = verdict
    # Held weakly where they can be: a GPUNode version the cache has already replaced can only fail the
    # identity test, and holding it would keep a second copy of every node's facts in memory (issue 14).
    ctx.judging.judged[key] = (verdict, tuple(_weakly(i) for i in inputs))
    return verdict


def _known(ctx: context.Context, key: tuple[str, str], inputs: _Inputs) -> model.NodeVerdict | None:
    """The stored verdict if it was judged from exactly these inputs (the same objects), else None."""
    held = ctx.judging.judged.get(key)
    if held is None:
        return None
    verdict, kept = held
    if len(kept) != len(inputs) or any(_strongly(a) is not b for a, b in zip(kept, inputs, strict=True)):
        return None
    return verdict


def _weakly(value: object) -> object:
    """A weak reference to `value` where it takes one (records, policies); else `value` itself."""
    try:
        return weakref.ref(value)
    except TypeError:  # str, datetime, None, tuples: small, or not worth a reference
        return value


def _strongly(value: object) -> object:
    """The object `_weakly` kept (None once a referenced object is gone: never an input's identity)."""
    return value() if isinstance(value, weakref.ref) else value


def node_verdicts(
    ctx: context.Context, name: str, now: datetime.datetime
) -> list[tuple[model.Policy, model.NodeVerdict]] | None:
    """Every selecting policy's verdict on the node, in name order; None: the node is gone.

    Acting policies patch one Node, so theirs carry one wish for its labels and taint
    (`overlap.combine`), or overlapping policies would undo each other's.
    """
    node = _node(ctx, name)
    if node is None:
        return None
    judged = [(policy, _judge(ctx, policy, node, now)) for policy in selecting_policies(ctx, node.record)]
    acting = [(p, v) for p, v in judged if not p.dry_run]
    if len(acting) > 1:
        merged = overlap.combine([v for _, v in acting])
        combined = dict(zip((p.name for p, _ in acting), merged, strict=True))
        judged = [(p, combined.get(p.name, v)) for p, v in judged]
    return judged


def verdict_now(
    ctx: context.Context, policy: model.Policy, name: str, now: datetime.datetime
) -> model.NodeVerdict | None:
    """`policy`'s verdict as the node stands now, as `node_verdicts` gives it (asked again after a step
    of the pass changed what it is judged from); None: the node is gone or no longer selected."""
    for selecting, verdict in node_verdicts(ctx, name, now) or ():
        if selecting.name == policy.name:
            return verdict
    return None


def judged_at(ctx: context.Context, name: str, now: datetime.datetime) -> bool:
    """Whether every selecting policy's verdict on the node was judged at `now` from what the cache holds.

    The timer judges its due nodes at one instant and acts on them one after another; a node that moved
    meanwhile is judged again, and at an earlier instant than what moved it, which would stamp a cordon
    before its fault was seen (`cordoned-at`) and time every clock from before its start.
    """
    node = _node(ctx, name)
    if node is None:
        return True  # gone: the pass finds nothing to judge either way
    return all(
        _known(ctx, (policy.name, name), _inputs(ctx, policy, node, now)) is not None
        for policy in selecting_policies(ctx, node.record)
    )


_Inputs = tuple[
    model.Policy,
    cache.NodeRecord,
    cache.GPUNodeRecord,
    model.StragglerScore | None,
    datetime.datetime,
    liveness.AgentPod | None,
    isolation.NodeIsolation | None,
]


def _inputs(ctx: context.Context, policy: model.Policy, node: _Node, now: datetime.datetime) -> _Inputs:
    """What a verdict is judged from (`judge`): the same objects, the same verdict."""
    key = (policy.name, node.record.view.name)
    isolated = node.isolated.get(key)
    return (
        policy,
        node.record,
        node.gpunode,
        ctx.judging.stragglers.get(key),
        now,
        node.agent_pod,
        isolated.decision if isolated is not None else None,
    )
