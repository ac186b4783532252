"""Each policy's breaker at run time: reset requests are acted on once per value, and survive a restart."""

import datetime

from gpuhealth_api import keys
from gpuhealth_operator import breakers
from gpuhealth_operator.decisions import breaker, model, times

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
POLICY = model.Policy(name="p", breaker_max_new_unhealthy=1, breaker_window_seconds=600)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def body(annotation: str | None = None, recorded: dict[str, str] | None = None) -> dict[str, object]:
    annotations = {} if annotation is None else {keys.BREAKER_RESET_ANNOTATION: annotation}
    return {
        "metadata": {"name": "p", "annotations": annotations},
        "status": {} if recorded is None else {breakers.STATUS_FIELD: recorded},
    }


def test_a_storm_trips_it_and_old_faults_are_pruned() -> None:
    owner = breakers.Breakers()
    turned = {"a": at(0), "b": at(1), "old": at(-700)}
    assert owner.current(POLICY, 10, turned, at(2)).state is breaker.State.OPEN
    assert "old" not in turned, "out of every window: pruned"
    assert owner.paused("p") is not None
    condition = owner.condition("p", at(3))
    assert (condition["type"], condition["status"], condition["reason"]) == ("Paused", "True", "FaultStorm")
    assert condition["lastTransitionTime"] == times.render(at(2))


def test_a_closed_breaker_says_so() -> None:
    condition = breakers.Breakers().condition("p", at(0))
    assert (condition["status"], condition["reason"]) == ("False", "BreakerClosed")


def test_a_reset_is_acted_on_once_per_value_and_recorded() -> None:
    owner = breakers.Breakers()
    turned = {"a": at(0), "b": at(1)}
    owner.current(POLICY, 10, turned, at(2))
    owner.note_reset("p", body("ack-1"))
    assert owner.resets == {"p": "ack-1"}
    owner.reset("p", owner.resets.pop("p"), at(3))
    assert owner.current(POLICY, 10, turned, at(4)).state is breaker.State.CLOSED
    assert owner.status("p") == {"breakerReset": {"value": "ack-1", "time": times.render(at(3))}}
    owner.note_reset("p", body("ack-1", owner.status("p")["breakerReset"]))
    assert owner.resets == {}, "the same value again is no new request"
    owner.note_reset("p", body("ack-2"))
    assert owner.resets == {"p": "ack-2"}


def test_after_a_restart_the_recorded_reset_is_neither_repeated_nor_forgotten() -> None:
    restarted = breakers.Breakers()
    restarted.note_reset("p", body("ack-1", {"value": "ack-1", "time": times.render(at(3))}))
    assert restarted.resets == {}
    # The storm before the reset does not trip the new process; a new one does.
    assert restarted.current(POLICY, 10, {"a": at(0), "b": at(1)}, at(5)).state is breaker.State.CLOSED
    assert restarted.current(POLICY, 10, {"a": at(4), "b": at(5)}, at(6)).state is breaker.State.OPEN


def test_forgetting_a_node_keeps_the_trial_spent() -> None:
    owner = breakers.Breakers()
    owner.states["p"] = breaker.Breaker(state=breaker.State.HALF_OPEN, since=at(0), trial="n", trial_at=at(1))
    owner.forget_node("n")
    state = owner.states["p"]
    assert state.trial is None
    assert breaker.admit(state, "m", at(2))[1] is False


def test_a_limit_of_every_selected_node_never_trips_and_costs_no_count() -> None:
    owner = breakers.Breakers()
    everything = model.Policy(name="p", breaker_max_new_unhealthy="100%")
    turned = {f"n{i}": at(0) for i in range(10)}
    assert owner.current(everything, 10, turned, at(1)).state is breaker.State.CLOSED
