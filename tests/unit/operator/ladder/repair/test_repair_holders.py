"""Repairs and new nodes' validations share one maxConcurrent: each side counts the other."""

from __future__ import annotations

import operator_context
from gpuhealth_operator.client import kube
from gpuhealth_operator.ladder.repair import reading
from gpuhealth_operator.shared import context


def make() -> context.Context:
    client = kube.Kube(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
    return operator_context.new_context(client)


def test_a_running_new_node_validation_holds_a_repair_place() -> None:
    ctx = make()
    assert reading.in_progress(ctx) == 0
    ctx.steps.repair.validations.add("new-node-1")
    assert reading.holders(ctx) == ["new-node-1"]
    assert reading.in_progress(ctx) == 1  # a repair with maxConcurrent 1 waits for it
