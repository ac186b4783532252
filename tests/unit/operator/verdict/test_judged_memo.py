"""A verdict asked again from the same inputs is the stored one; any input replaced is judged anew, and
the memo of the inputs (`ctx.judging.judged`) never keeps a replaced GPUNode version alive (issue 14)."""

from __future__ import annotations

import datetime
import gc
import json
import weakref
from typing import Any

import gpunode_facts
import operator_context
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import model, policies
from gpuhealth_operator.shared import context
from gpuhealth_operator.verdict import judging

NOW = datetime.datetime(2026, 11, 24, tzinfo=datetime.UTC)
RULES = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}]


def make() -> tuple[context.Context, model.Policy]:
    ctx = operator_context.new_context(
        kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    )
    policy = policies.parse_policy("p", 1, {"rules": RULES})
    ctx.cache.put_policy(policy)
    ctx.cache.put_node({"metadata": {"name": "a", "resourceVersion": "1"}, "spec": {}})
    return ctx, policy


def gpunode(version: int) -> dict[str, Any]:
    """A GPUNode as a watch event decodes it: every value a fresh object."""
    raw = {
        "metadata": {"name": "a", "uid": "uid-a", "resourceVersion": str(version)},
        "status": gpunode_facts.agent_status(
            heartbeat=gpunode_facts.rfc3339(NOW), observed=gpunode_facts.rfc3339(NOW)
        ),
    }
    decoded: dict[str, Any] = json.loads(json.dumps(raw))
    return decoded


def test_the_same_inputs_give_the_stored_verdict_and_a_new_version_is_judged_anew() -> None:
    ctx, policy = make()
    ctx.cache.put_gpunode(gpunode(1), NOW)
    first = judging.judge(ctx, policy, "a", NOW)
    assert first is not None and ctx.verdicts[("p", "a")] is first
    assert judging.judge(ctx, policy, "a", NOW) is first  # the same objects: not judged again
    assert judging.judged_at(ctx, "a", NOW)
    assert not judging.judged_at(ctx, "a", NOW + datetime.timedelta(seconds=1))  # another instant
    ctx.cache.put_gpunode(gpunode(2), NOW)
    assert not judging.judged_at(ctx, "a", NOW)  # another GPUNode version
    second = judging.judge(ctx, policy, "a", NOW)
    assert second is not first and ctx.verdicts[("p", "a")] is second


def test_a_verdict_does_not_keep_a_replaced_gpunode_version_alive() -> None:
    """Each node's facts once in memory: the verdict's memo of its inputs lets an old version go."""
    ctx, policy = make()
    gone = weakref.ref(ctx.cache.put_gpunode(gpunode(1), NOW))
    assert judging.judge(ctx, policy, "a", NOW) is not None
    ctx.cache.put_gpunode(gpunode(2), NOW)
    gc.collect()
    assert gone() is None
    assert not judging.judged_at(ctx, "a", NOW)  # new facts: judged again


def test_a_forgotten_node_or_policy_leaves_no_memo_behind() -> None:
    ctx, policy = make()
    ctx.cache.put_gpunode(gpunode(1), NOW)
    judging.judge(ctx, policy, "a", NOW)
    ctx.forget_verdicts("a")
    assert ctx.judging.judged == {} and ("p", "a") not in ctx.verdicts
    judging.judge(ctx, policy, "a", NOW)
    ctx.forget_policy("p")
    assert ctx.judging.judged == {} and ("p", "a") not in ctx.verdicts
