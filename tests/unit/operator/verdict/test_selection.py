"""The policies that select a node, asked again and again in one pass, are always the ones whose selector
matches the Node as the cache holds it now: the answer kept for the last node (`memory.Selection`) is
never stale after a Node edit, a policy added, changed or deleted, or another node asked in between."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import model, policies
from gpuhealth_operator.shared import context
from gpuhealth_operator.verdict import judging

RULES = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}]
POLICIES = ("a", "b", "c")
NODES = ("n1", "n2")
LABELS = st.dictionaries(
    st.sampled_from(("pool", "zone", keys.EXCLUDE_LABEL)), st.sampled_from(("x", "true"))
)


def make() -> context.Context:
    return operator_context.new_context(
        kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    )


def policy(name: str, selector: dict[str, str], generation: int) -> model.Policy:
    return policies.parse_policy(
        name, generation, {"nodeSelector": {"matchLabels": selector}, "rules": RULES}
    )


def node(name: str, labels: dict[str, str], version: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels, "resourceVersion": str(version)}, "spec": {}}


STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("node"), st.sampled_from(NODES), LABELS),
        st.tuples(st.just("policy"), st.sampled_from(POLICIES), LABELS),
        st.tuples(st.just("delete"), st.sampled_from(POLICIES), st.just({})),
        st.tuples(st.just("ask"), st.sampled_from(NODES), st.just({})),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(STEPS)
def test_selection_is_every_policy_whose_selector_matches_now(
    steps: list[tuple[str, str, dict[str, str]]],
) -> None:
    ctx = make()
    for n in NODES:
        ctx.cache.put_node(node(n, {}, 1))
    for version, (kind, name, labels) in enumerate(steps, start=2):
        if kind == "node":
            ctx.cache.put_node(node(name, labels, version))
        elif kind == "policy":
            ctx.cache.put_policy(policy(name, labels, version))
        elif kind == "delete":
            ctx.cache.remove_policy(name)
            ctx.forget_policy(name)
        for n in NODES:  # each node asked twice in a row, then the other: the kept answer and a new one
            record = ctx.cache.nodes[n]
            expected = [p for _, p in sorted(ctx.cache.policies.items()) if policies.selects(p, record.view)]
            assert judging.selecting_policies(ctx, record) == expected
            assert judging.selecting_policies(ctx, record) == expected


def test_a_forgotten_node_or_policy_leaves_no_selection_behind() -> None:
    ctx = make()
    ctx.cache.put_node(node("n1", {}, 1))
    ctx.cache.put_policy(policy("a", {}, 1))
    judging.selecting_policies(ctx, ctx.cache.nodes["n1"])
    ctx.forget_node("n2")
    assert ctx.judging.selection is not None  # another node's forgetting keeps it
    ctx.forget_node("n1")
    assert ctx.judging.selection is None
    judging.selecting_policies(ctx, ctx.cache.nodes["n1"])
    ctx.forget_policy("a")
    assert ctx.judging.selection is None


def test_bulk_selecting_is_selects_of_each() -> None:
    view = model.NodeView(name="n", labels={"pool": "x"})
    candidates = [policy("a", {"pool": "x"}, 1), policy("b", {"pool": "y"}, 1), policy("c", {}, 1)]
    assert policies.selecting(candidates, view) == [p for p in candidates if policies.selects(p, view)]
    excluded = model.NodeView(name="n", labels={"pool": "x", keys.EXCLUDE_LABEL: "true"})
    assert policies.selecting(candidates, excluded) == []
