"""The degraded domains kept between judgements: taken up from the policy status once, and a node's watch
event asks for a judgement only when what the domains count of it changed."""

import datetime

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import model
from gpuhealth_operator.state import domain_states

Health = vocabulary.Health
CLIQUE = "nvidia.com/gpu.clique"
POLICY = model.Policy(
    name="p", topology=model.Topology(domains=(model.TopologyDomain(key=CLIQUE, unhealthy=5),))
)
RECORDED = {
    "status": {"topology": {"degraded": [{"key": CLIQUE, "value": "c1", "since": "2026-01-01T00:00:00Z"}]}}
}


def test_recorded_domains_are_taken_up_once() -> None:
    states = domain_states.DomainStates()
    states.note_status("p", RECORDED)
    previous = states.previous(POLICY)
    assert previous[(CLIQUE, "c1")].since == datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    assert states.recorded == {}
    states.states["p"] = {}
    states.note_status("p", RECORDED)  # judged since: the status is our own echo, not news
    assert states.previous(POLICY) == {}


def test_changed_only_when_health_class_or_domain_label_moves() -> None:
    states = domain_states.DomainStates()
    labels = {CLIQUE: "c1"}
    assert states.changed(POLICY, "n", Health.HEALTHY, labels)
    assert not states.changed(POLICY, "n", Health.HEALTHY, labels)
    assert not states.changed(POLICY, "n", Health.DEGRADED, labels)  # neither Unhealthy nor Unknown
    assert states.changed(POLICY, "n", Health.UNHEALTHY, labels)
    assert states.changed(POLICY, "n", Health.UNHEALTHY, {CLIQUE: "c2"})
    assert not states.changed(POLICY, "n", Health.UNHEALTHY, {CLIQUE: "c2", "other": "x"})
    assert states.changed(POLICY, "n", None, {})  # no longer selected
    assert not states.changed(POLICY, "n", None, {})


def test_forget() -> None:
    states = domain_states.DomainStates()
    states.changed(POLICY, "n", Health.HEALTHY, {})
    states.note_status("q", RECORDED)
    states.forget_node("n")
    assert states.seen == {}
    states.forget_policy("q")
    assert states.recorded == {}
