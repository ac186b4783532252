"""A preempted check stops within seconds, so the workload that preempted it starts within the issue's
10 s: kube-scheduler binds the preemptor only once its victim is gone, and the kubelet gives a victim its
whole terminationGracePeriodSeconds (the Kubernetes default is 30 s; the shipped check templates set
none). `check_jobs.build` caps it at `check_jobs.STOP_GRACE_SECONDS`; a template may ask for less."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuhealth_operator.decisions import checks
from gpuhealth_operator.ladder.check import check_jobs
from gpuhealth_operator.ladder.repair import jobs

START = checks.Start(node="n1", policy="p", check="quick", template="DcgmDiagQuick", timeout_seconds=60)


def shipped(name: str) -> dict[str, Any]:
    return jobs.packaged_templates()[name]


def grace(job: dict[str, Any]) -> Any:
    return job["spec"]["template"]["spec"].get("terminationGracePeriodSeconds")


@pytest.mark.parametrize("name", ["DcgmDiagQuick", "DcgmDiag"])
def test_a_shipped_check_stops_within_seconds_of_its_preemption(name: str) -> None:
    job = check_jobs.build(shipped(name), START, namespace="ns", node_uid="uid-1", gpus=8)
    assert grace(job) == check_jobs.STOP_GRACE_SECONDS == 5


@pytest.mark.parametrize(("asked", "given"), [(30, 5), (2, 2), (0, 0)])
def test_a_template_may_ask_for_less_never_more(asked: int, given: int) -> None:
    template = copy.deepcopy(shipped("DcgmDiagQuick"))
    template["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = asked
    job = check_jobs.build(template, START, namespace="ns", node_uid="uid-1", gpus=8)
    assert grace(job) == given
