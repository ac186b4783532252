"""The term's `Context` holds what is shared; each step's memory is the step's (issue 46).

A field added to `Context` for one step's bookkeeping belongs in that step's memory
(`ladder/memories.py`), which `Context.forget_node` / `forget_policy` reach through the
memories' own `forget_*` (tests/unit/operator/shared/test_forget.py walks them all).
"""

import dataclasses

from gpuhealth_operator.shared import context

SHARED = {
    "config",
    "client",
    "meters",
    "recorder",
    "cache",
    "clock",
    "agent_pods",
    "node_locks",
    "passes",
    "admission",
    "breakers",
    "verdicts",
    "judging",
    "steps",
    "status",
}
"""What every layer above the context passes around: no one step's memory."""


def test_the_context_keeps_at_most_fifteen_fields() -> None:
    names = {f.name for f in dataclasses.fields(context.Context)}
    assert len(names) <= 15, sorted(names - SHARED)


def test_the_context_keeps_only_what_is_shared() -> None:
    assert {f.name for f in dataclasses.fields(context.Context)} == SHARED
