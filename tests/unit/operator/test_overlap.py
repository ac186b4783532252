"""Overlapping acting policies give the Node one combined wish, so labels never flap between them."""

import datetime

from gpuhealth_api import keys
from gpuhealth_operator.decisions import overlap
from gpunode_facts import verdict

NOW = datetime.datetime(2026, 11, 22, tzinfo=datetime.UTC)


def test_a_label_one_policy_sets_is_not_removed_by_another() -> None:
    straggler_rule = verdict({keys.HEALTH_LABEL: "degraded", keys.STRAGGLER_LABEL: "true"})
    no_straggler_rule = verdict({keys.HEALTH_LABEL: "healthy", keys.STRAGGLER_LABEL: None})
    for order in ([straggler_rule, no_straggler_rule], [no_straggler_rule, straggler_rule]):
        combined = overlap.combine(order)
        assert {v.wanted_labels[keys.STRAGGLER_LABEL] for v in combined} == {"true"}
        assert {v.wanted_labels[keys.HEALTH_LABEL] for v in combined} == {"degraded"}


def test_a_label_is_removed_only_when_every_policy_wants_it_gone() -> None:
    combined = overlap.combined_labels(
        [verdict({keys.THERMAL_LABEL: None}), verdict({keys.THERMAL_LABEL: None})]
    )
    assert combined == {keys.THERMAL_LABEL: None}


def test_a_label_a_policy_leaves_alone_is_taken_from_the_others() -> None:
    stale = verdict({})  # a stale agent: the policy leaves the health label as it is
    combined = overlap.combined_labels([stale, verdict({keys.HEALTH_LABEL: "unhealthy"})])
    assert combined == {keys.HEALTH_LABEL: "unhealthy"}


def test_the_most_severe_taint_wins_and_none_only_when_no_policy_taints() -> None:
    taints = [verdict({}, "ThermalThrottled"), verdict({}, None), verdict({}, "EccUncorrectable")]
    assert overlap.combined_taint(taints) == "EccUncorrectable"
    assert overlap.combined_taint([verdict({}), verdict({})]) is None
