"""Repair step kinds are rows (`decisions.step_kinds`): every kind the API names has one, the CRD offers
exactly those, the packaged templates hold each one's Job, and the cycle reads its row."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, policies, repair, step_kinds
from gpuhealth_operator.ladder.repair import jobs

ROOT = Path(__file__).resolve().parents[4]


def _step_action_enum() -> list[str]:
    crd = yaml.safe_load((ROOT / "crds" / "gpuhealth.io_gpuhealthpolicies.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    step = spec["properties"]["repair"]["properties"]["steps"]["items"]
    return list(step["properties"]["action"]["enum"])


def test_every_repair_action_has_its_row_and_the_crd_offers_exactly_those() -> None:
    assert set(step_kinds.KINDS) == set(vocabulary.RepairAction)
    assert sorted(_step_action_enum()) == sorted(a.value for a in step_kinds.KINDS)
    for action, kind in step_kinds.KINDS.items():
        assert kind.action is action


def test_every_kind_has_a_packaged_template_and_a_default_timeout() -> None:
    packaged = jobs.packaged_templates()
    for kind in step_kinds.KINDS.values():
        assert kind.template in packaged, f"repair-templates.yaml has no {kind.template} Job"
        assert kind.template in jobs.TEMPLATE_KEYS
        assert policies.DEFAULT_STEP_TIMEOUTS[kind.action] == kind.default_timeout_seconds


def _spec(*actions: vocabulary.RepairAction) -> model.RepairSpec:
    steps = tuple(
        model.RepairStep(f"s{i}", a, step_kinds.of(a).default_timeout_seconds) for i, a in enumerate(actions)
    )
    return model.RepairSpec(steps=steps)


def test_a_step_on_the_faulty_gpus_is_skipped_while_none_is_known() -> None:
    spec = _spec(vocabulary.RepairAction.RESET_GPU, vocabulary.RepairAction.REBOOT_NODE)
    assert repair.next_step(spec, 0, []) == 1
    assert repair.next_step(spec, 0, ["GPU-1"]) == 0


def test_the_driver_s_request_picks_the_first_step_by_the_rows_rank() -> None:
    spec = _spec(vocabulary.RepairAction.RESET_GPU, vocabulary.RepairAction.REBOOT_NODE)
    reboot, reset = vocabulary.RecoveryAction.NODE_REBOOT.value, vocabulary.RecoveryAction.GPU_RESET.value
    assert repair.first_step(spec, ["GPU-1"], [reboot]) == 1
    assert repair.first_step(spec, ["GPU-1"], [reset]) == 0
    assert repair.first_step(spec, ["GPU-1"], [reset, reboot]) == 1, "a reboot cures what a reset does"
    assert repair.first_step(spec, ["GPU-1"], []) == 0
    assert step_kinds.asked_for({vocabulary.RecoveryAction.NONE.value}) is None
