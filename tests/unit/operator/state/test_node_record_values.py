"""Issue 46: a Node's record shares its strings a list at a time (`SharedValues.values`), not one call per
string. Held here equal to the record it replaced (`_old_node_record`, copied below), on random Nodes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import keys
from gpuhealth_operator.decisions import model, overrides
from gpuhealth_operator.state import compaction, records


def _old_node_record(body: Mapping[str, Any]) -> records.NodeRecord:
    """`records.node_record` before issue 46: each string shared in a call of its own."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    share = compaction.SHARED.value
    compaction.SHARED.check()
    taints = tuple(share(t) for t in spec.get("taints") or [] if isinstance(t, Mapping))
    capacity = (body.get("status") or {}).get("capacity") or {}
    condition = None
    others: dict[str, str] = {}
    written: dict[str, str] = {}
    for c in (body.get("status") or {}).get("conditions") or []:
        if not isinstance(c, Mapping):
            continue
        if c.get("type") != keys.NODE_CONDITION_TYPE and isinstance(c.get("type"), str):
            others[sys.intern(c["type"])] = share(str(c.get("status", "")))
            stamps = [str(c[k]) for k in ("lastHeartbeatTime", "lastTransitionTime") if c.get(k)]
            if stamps:
                written[sys.intern(c["type"])] = max(stamps)  # RFC 3339 UTC: in order as strings
        if c.get("type") == keys.NODE_CONDITION_TYPE:
            condition = records.NodeCondition(
                status=share(str(c.get("status", ""))),
                reason=share(str(c.get("reason", ""))),
                message=share(str(c.get("message", ""))),
                last_transition_time=share(str(c.get("lastTransitionTime", ""))),
            )
    view = model.NodeView(
        name=str(meta.get("name", "")),
        labels={sys.intern(str(k)): share(v) for k, v in (meta.get("labels") or {}).items()},
        annotations={k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(keys.PREFIX)},
        unschedulable=bool(spec.get("unschedulable", False)),
        taint_keys=frozenset(str(t.get("key", "")) for t in taints) if taints else records._NO_KEYS,
        gpu_capacity=records._int_or_none(capacity.get(keys.GPU_RESOURCE)),
        conditions=compaction.SHARED.mapping(
            others
        ),  # most nodes hold the same few conditions alike: one copy
    )
    return records.NodeRecord(
        view=view,
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        taints=taints,
        condition=condition,
        cordon_taken_over=view.unschedulable and overrides.cordon_taken_over(meta),
        created=str(meta.get("creationTimestamp") or ""),
        condition_written=written,
    )


_WORDS = st.sampled_from(["True", "False", "", "x" * 30, "KernelDeadlock", "Ready", 3])
_NODE_CONDITION = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from([keys.NODE_CONDITION_TYPE, "Ready", "KernelDeadlock", 7]),
        "status": _WORDS,
        "reason": _WORDS,
        "message": _WORDS,
        "lastTransitionTime": st.sampled_from(["2026-11-24T00:00:00Z", "", None]),
        "lastHeartbeatTime": st.sampled_from(["2026-11-24T00:01:00Z", None]),
    },
)
_BODY = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "name": st.just("n0"),
                "labels": st.dictionaries(st.sampled_from(["a", "b", "nvidia.com/gpu.present"]), _WORDS),
                "annotations": st.dictionaries(
                    st.sampled_from([keys.CORDONED_BY_ANNOTATION, "other/x"]), st.just("p")
                ),
            },
        ),
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "unschedulable": st.booleans(),
                "taints": st.lists(
                    st.one_of(
                        st.fixed_dictionaries(
                            {"key": st.sampled_from(["k", "j"]), "effect": st.just("NoSchedule")}
                        ),
                        st.just("junk"),
                    )
                ),
            },
        ),
        "status": st.fixed_dictionaries(
            {},
            optional={
                "capacity": st.just({keys.GPU_RESOURCE: "8"}),
                "conditions": st.lists(st.one_of(_NODE_CONDITION, st.just("junk")), max_size=4),
            },
        ),
    },
)


@settings(max_examples=500, deadline=None)
@given(body=_BODY)
def test_a_node_record_is_the_record_kept_before(body: dict[str, Any]) -> None:
    new, old = records.node_record(body), _old_node_record(body)
    assert new == old
    assert new.view.labels == old.view.labels and list(new.view.labels) == list(old.view.labels)
    assert list(new.view.conditions.items()) == list(old.view.conditions.items())
    assert new.condition_written == old.condition_written


def test_values_shares_each() -> None:
    long = "y" * 40
    first = compaction.SHARED.values([long, 1000, "s"])
    again = compaction.SHARED.values(["y" * 40, 1000, "s"])
    assert first == again and all(a is b for a, b in zip(first, again, strict=True))


_STATUS = st.fixed_dictionaries(
    {},
    optional={
        "summary": st.fixed_dictionaries({"gpuCount": st.integers(0, 8), "model": st.just("H100")}),
        "health": st.sampled_from(["Healthy", "Unhealthy", "x" * 30]),
        "issues": st.sampled_from(["", "EccUncorrectable"]),
        "action": st.sampled_from(["None", "Cordoned"]),
        "straggler": st.just({"score": 1.0}),
    },
)


@settings(max_examples=200, deadline=None)
@given(status=_STATUS)
def test_a_gpunode_records_repeated_fields_are_shared_as_before(status: dict[str, Any]) -> None:
    """`gpunode_record` shares summary, health, issues and action a list at a time: each as
    `SharedValues.value` shares it (one copy across nodes), the status otherwise as it was, in its order."""
    body = {"metadata": {"name": "n0"}, "status": status}
    first, second = (records.gpunode_record(json.loads(json.dumps(body))) for _ in range(2))
    assert first.status == status and list(first.status) == list(status)
    for key in ("summary", "health", "issues", "action"):
        if key in status:
            assert first.status[key] is compaction.SHARED.value(json.loads(json.dumps(status[key])))  # type: ignore[literal-required]
            assert first.status[key] is second.status[key]  # type: ignore[literal-required]
