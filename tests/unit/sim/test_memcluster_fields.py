"""The in-memory cluster keeps the operator's GPUNode status fields across an agent report, as the
real API server does under server-side apply (each manager owns its fields).

The expected set is derived, not copied: from what `reconciler.desired_status` writes with every
optional part present, and from the CRD's status schema less the agent's fields, so a field the
operator starts writing cannot be wiped by the simulator unnoticed.
"""

from __future__ import annotations

import pathlib
import types
from typing import Any, cast

import yaml

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import isolation, model
from gpuhealth_operator.ladder.isolate import isolating
from gpuhealth_operator.runtime import reconciler
from gpuhealth_operator.shared import context
from gpuhealth_operator.state import check_memory
from gpuhealth_sim.backtest import memcluster, tracerecord
from gpunode_facts import verdict

CRD = pathlib.Path(__file__).parents[3] / "charts/gpu-health/crds/gpuhealth.io_gpunodes.yaml"


def _everything_written() -> dict[str, Any]:
    """The operator's GPUNode status with every optional field present: several selecting policies,
    a straggler score, an isolated GPU, a repair history."""
    name = "n"
    ctx = types.SimpleNamespace(
        stragglers={("a", name): model.StragglerScore(score=0.8, z_score=-4.0, peers=8, flagged=True)},
        isolations={
            ("a", name): isolation.NodeState(
                None,
                in_place=(isolation.Isolated(3, "GPU-3", "gpuhealth-n-gpu-3", "2026-11-23T19:00:00.000Z"),),
            )
        },
        cache=types.SimpleNamespace(gpunode=lambda _: None),
        repair_history={name: [{"time": "2026-11-26T15:00:00Z", "cycle": 1, "result": "Started"}]},
        checks=check_memory.CheckMemory(
            history={name: [{"name": "quick", "time": "2026-11-26T16:00:00Z", "result": "Passed"}]}
        ),
    )
    policy_a, policy_b = model.Policy(name="a"), model.Policy(name="b", dry_run=True)
    judged = verdict(node=name)
    action = vocabulary.NodeAction.NONE
    return reconciler.desired_status(
        cast(context.Context, ctx),
        policy_a,
        name,
        judged,
        action,
        results=[(policy_a, judged, action), (policy_b, judged, action)],
    )


def _crd_status_fields() -> set[str]:
    crd = yaml.safe_load(CRD.read_text())
    fields: set[str] = set()
    for version in crd["spec"]["versions"]:
        fields |= set(version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"])
    return fields


def test_every_field_the_operator_writes_survives_an_agent_report() -> None:
    written = _everything_written()
    owned = {reconciler.POLICIES_FIELD, "straggler", "repairs", "checks", *isolating.STATUS_FIELDS}
    assert owned <= set(written)
    assert set(written) <= memcluster.OPERATOR_STATUS_FIELDS

    cluster = memcluster.MemoryKube()
    cluster.put_gpunode("n", {"agent": {"version": "1"}})
    cluster.gpunodes["n"]["status"].update(written)  # the operator's apply
    after = cluster.put_gpunode("n", {"agent": {"version": "2"}, "summary": {"gpuCount": 8}})
    assert {k: after["status"].get(k) for k in written} == written


def test_operator_and_agent_fields_cover_the_crd_status_and_do_not_overlap() -> None:
    agent = set(tracerecord.AGENT_STATUS_FIELDS)
    assert not agent & memcluster.OPERATOR_STATUS_FIELDS
    assert _crd_status_fields() == agent | memcluster.OPERATOR_STATUS_FIELDS
