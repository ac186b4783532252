"""A pending row remap (Ampere and later) or page retirement (earlier GPUs) is judged by its cause (issue 47
item 1, issue 45 "Also").

NVIDIA's GPU memory error management notes: a pending remap takes effect at the next GPU reset, and with
it set unaffected applications keep running and new work can be launched, so a remap for correctable
errors alone is a warning (MemoryDegrading, Degraded), not RowRemapFailure (fatal, drained by the default
policy). A remap failure, or a pending remap where uncorrectable errors are involved, stays fatal. On GPUs
that retire pages instead (V100, T4), a pending retirement for a double-bit error lets no new work start
until the GPU is reset (NVIDIA's dynamic page retirement notes): fatal; one for single-bit errors is a
warning. Judged as the operator does: each report stored in its cache (which keeps only the facts the
predicates read), then `verdicts.judge` under the shipped default policy.
"""

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpunode_facts
from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model, policies, verdicts
from gpuhealth_operator.state import cache

Condition = vocabulary.Condition
Health = vocabulary.Health
ROOT = Path(__file__).resolve().parents[4]
NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
NODE = model.NodeView(name="n", labels={"nvidia.com/gpu.count": "2"}, gpu_capacity=2)
DEFAULT = policies.parse_policy(
    "default", 1, yaml.safe_load((ROOT / "examples" / "default-policy.yaml").read_text())["spec"]
)


def judged(gpu0: dict[str, Any]) -> model.NodeVerdict:
    """The verdict on one report whose GPU 0 carries `gpu0`, as the operator's cache received it."""
    facts = gpunode_facts.agent_status(gpus=2, overrides={0: gpu0})
    facts = json.loads(json.dumps(facts))
    facts["agent"]["lastHeartbeatTime"] = gpunode_facts.rfc3339(NOW)
    body = {"metadata": {"name": "n", "uid": "u", "resourceVersion": "1"}, "status": facts}
    record = cache.ClusterCache().put_gpunode(body, NOW)
    return verdicts.judge(
        DEFAULT, NODE, record.status, {}, None, NOW, known_signals=record.fact_signals, memory=record.memory
    )


def rows(**rows: Any) -> dict[str, Any]:
    healthy = {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    return {"remappedRows": {**healthy, **rows}}


def pages(**pages: Any) -> dict[str, Any]:
    return {"retiredPages": {"doubleBit": 0, "pending": False, **pages}}


def test_a_pending_remap_for_correctable_errors_only_is_a_warning_not_a_drain() -> None:
    verdict = judged(rows(correctable=2, pending=True))
    assert Condition.ROW_REMAP_FAILURE not in verdict.issues
    assert Condition.MEMORY_DEGRADING in verdict.issues
    assert verdict.health is Health.DEGRADED
    message = verdict.conditions[Condition.MEMORY_DEGRADING].message
    assert "pending a GPU reset" in message and "correctable" in message


@pytest.mark.parametrize(
    ("gpu0", "why"),
    [
        (rows(correctable=2, uncorrectable=1, pending=True), "uncorrectable"),
        (rows(correctable=2, failure=True), "failed"),
        (rows(correctable=2, uncorrectable=None, pending=True), "not reported"),  # the cause cannot be told
    ],
    ids=["uncorrectable-rows", "failure", "cause-unknown"],
)
def test_a_remap_failure_or_a_pending_remap_with_uncorrectable_errors_stays_fatal(
    gpu0: dict[str, Any], why: str
) -> None:
    verdict = judged(gpu0)
    assert Condition.ROW_REMAP_FAILURE in verdict.issues
    assert verdict.health is Health.UNHEALTHY
    assert why in verdict.conditions[Condition.ROW_REMAP_FAILURE].message


def test_a_pending_remap_after_an_uncorrectable_error_is_that_error_not_a_correctable_warning() -> None:
    """A pending remap is younger than the last reset: with an uncorrectable error since then, it may be that
    error's, so it is no "correctable errors only" warning; EccUncorrectable judges the error."""
    verdict = judged({**rows(correctable=2, pending=True), "ecc": {"uncorrectedVolatile": 1}})
    assert Condition.ECC_UNCORRECTABLE in verdict.issues
    assert verdict.health is Health.UNHEALTHY
    assert Condition.MEMORY_DEGRADING not in verdict.issues


def test_recorded_remaps_without_a_pending_one_are_no_fault() -> None:
    verdict = judged(rows(correctable=3, uncorrectable=1))
    assert Condition.ROW_REMAP_FAILURE not in verdict.issues
    assert Condition.MEMORY_DEGRADING not in verdict.issues
    assert verdict.health is Health.HEALTHY


def test_a_pending_page_retirement_for_a_double_bit_error_is_fatal() -> None:
    """Pre-Ampere: after a DBE "no further context will be created on the GPU until the DBE is mapped out"."""
    verdict = judged(pages(doubleBit=1, pending=True))
    assert Condition.ROW_REMAP_FAILURE in verdict.issues
    assert verdict.health is Health.UNHEALTHY
    assert "page retirement" in verdict.conditions[Condition.ROW_REMAP_FAILURE].message


def test_a_pending_page_retirement_for_single_bit_errors_is_a_warning() -> None:
    verdict = judged(pages(pending=True))
    assert Condition.ROW_REMAP_FAILURE not in verdict.issues
    assert Condition.MEMORY_DEGRADING in verdict.issues
    assert verdict.health is Health.DEGRADED


def test_retired_pages_without_a_pending_one_are_no_fault() -> None:
    verdict = judged(pages(doubleBit=4))
    assert verdict.health is Health.HEALTHY
