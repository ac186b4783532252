"""Hysteresis: conditions set after forSeconds, clear after clear_seconds, never flap, survive restarts."""

import datetime
from collections.abc import Sequence

import hypothesis
import pytest
from hypothesis import strategies as st

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import hysteresis, model, policies, times, verdicts

Condition = vocabulary.Condition
T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
THERMAL = Condition.THERMAL_THROTTLED


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def sig(
    present: bool | None, condition: Condition = THERMAL, observed_at: float | None = None
) -> model.Signal:
    when = None if observed_at is None else at(observed_at)
    return model.Signal(condition, present, f"present={present}", observed_at=when)


def run(samples: list[tuple[float, bool | None]], for_seconds: float, clear_seconds: float) -> list[str]:
    """Status after each (time, present) sample."""
    state = None
    statuses = []
    for t, present in samples:
        state = hysteresis.advance(state, sig(present), for_seconds, clear_seconds, at(t))
        statuses.append(state.status)
    return statuses


@pytest.mark.parametrize(
    ("samples", "for_seconds", "clear_seconds", "expected"),
    [
        # fatal: sets and clears at once
        ([(0, True), (5, False)], 0, 0, ["True", "False"]),
        # sets only once held for forSeconds
        ([(0, True), (30, True), (59, True), (60, True)], 60, 600, ["False", "False", "False", "True"]),
        # a gap restarts the clock on the way in
        ([(0, True), (50, False), (55, True), (110, True), (115, True)], 60, 0, ["False"] * 4 + ["True"]),
        # clears only after clear_seconds of absence
        (
            [(0, True), (10, False), (300, False), (609, False), (610, False)],
            0,
            600,
            ["True"] * 4 + ["False"],
        ),
        # evidence returning restarts the clock on the way out
        (
            [(0, True), (10, False), (500, True), (510, False), (1000, False), (1110, False)],
            0,
            600,
            ["True"] * 5 + ["False"],
        ),
        # unknown keeps whatever was there
        ([(0, True), (10, None), (10_000, None)], 0, 0, ["True", "True", "True"]),
        ([(0, False), (10, None)], 0, 0, ["False", "False"]),
        ([(0, None)], 0, 0, ["Unknown"]),
        ([(0, None), (5, False)], 0, 0, ["Unknown", "False"]),
        ([(0, None), (5, True)], 0, 0, ["Unknown", "True"]),
        # unknown does not restart a clock (the recovery clock restarts on AgentStale clearing instead)
        ([(0, True), (10, False), (20, None), (605, False)], 0, 600, ["True", "True", "True", "True"]),
        ([(0, True), (10, False), (20, None), (611, False)], 0, 600, ["True", "True", "True", "False"]),
    ],
)
def test_advance(
    samples: list[tuple[float, bool | None]], for_seconds: float, clear_seconds: float, expected: list[str]
) -> None:
    assert run(samples, for_seconds, clear_seconds) == expected


def test_for_seconds_counts_from_the_signals_own_start_by_the_operators_clock() -> None:
    """E.g. a stale agent's (its last report) or a straggler's window (its oldest sample's receipt)."""
    state = hysteresis.advance(None, sig(True, observed_at=-50), 60, 600, at(0))
    assert state.status == "False"
    assert state.observed_since == at(-50)
    assert hysteresis.advance(state, sig(True), 60, 600, at(10)).status == "True"


def test_future_observation_time_is_clamped_to_now() -> None:
    state = hysteresis.advance(None, sig(True, observed_at=3600), 60, 600, at(0))
    assert state.observed_since == at(0)


def test_last_transition_time_changes_only_on_status_changes() -> None:
    state = hysteresis.advance(None, sig(False), 60, 600, at(0))
    for t, present in [(5, True), (10, False), (20, True), (30, False)]:
        state = hysteresis.advance(state, sig(present), 60, 600, at(t))
        assert state.status == "False"
        assert state.last_transition_time == at(0)
    state = hysteresis.advance(state, sig(True), 0, 600, at(40))
    assert (state.status, state.last_transition_time) == ("True", at(40))
    state = hysteresis.advance(state, sig(True), 0, 600, at(50))
    assert state.last_transition_time == at(40)


def _thermal_policy() -> model.Policy:
    return policies.parse_policy(
        "p",
        1,
        {
            "rules": [
                {"name": "thermal", "condition": "ThermalThrottled", "action": "Label", "forSeconds": 60}
            ],
            "recovery": {"healthyForSeconds": 600},
        },
    )


def _facts(now: datetime.datetime, temperature: int) -> object:
    return {
        "agent": {"lastHeartbeatTime": times.render(now), "heartbeatSeconds": 60},
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "temperatureCelsius": temperature, "slowdownTemperatureCelsius": 90}
        ],
    }


def _label_history(
    temperatures: Sequence[tuple[float, int]], restart_every: int | None = None
) -> list[tuple[float, str | None]]:
    """(time, label value) at each change of the thermal label, judging each sample as the operator does."""
    policy, node = _thermal_policy(), model.NodeView(name="n")
    stored: list[model.ConditionRecord] = []
    label: str | None = None
    changes: list[tuple[float, str | None]] = []
    for i, (t, temperature) in enumerate(temperatures):
        previous = hysteresis.from_status(stored)
        verdict = verdicts.judge(policy, node, _facts(at(t), temperature), previous, None, at(t))  # type: ignore[arg-type]
        stored = hysteresis.to_status(verdict.conditions.values(), generation=1)
        if restart_every and i % restart_every == 0:
            stored = hysteresis.to_status(hysteresis.from_status(list(stored)).values(), generation=1)
        wanted = verdict.wanted_labels[keys.THERMAL_LABEL]
        if wanted != label:
            label = wanted
            changes.append((t, label))
    return changes


def test_temperature_oscillating_around_threshold_does_not_flap_the_label() -> None:
    # 91 °C and 89 °C alternating every 3 s for an hour: never 60 s above, so never labelled.
    samples = [(t, 91 if (t // 3) % 2 == 0 else 89) for t in range(0, 3600, 1)]
    assert _label_history(samples) == []


def test_label_holds_through_oscillation_and_clears_after_healthy_for_seconds() -> None:
    hot = [(t, 95) for t in range(0, 120)]  # labelled after 60 s
    wobble = [(t, 91 if (t // 3) % 2 == 0 else 89) for t in range(120, 1800)]  # never 600 s cool
    cool = [(t, 60) for t in range(1800, 3000)]
    # The last wobble dipped below 90 °C at 1797 s and it stayed cool: cleared 600 s later.
    assert _label_history(hot + wobble + cool, restart_every=7) == [(60, "true"), (2397, None)]


def test_round_trip_through_status() -> None:
    states = [
        model.ConditionState(
            THERMAL, "True", "Recovering", "m", at(0), observed_since=at(-60.5), recovering_since=at(30)
        ),
        model.ConditionState(Condition.ECC_UNCORRECTABLE, "False", "NotDetected", "ok", at(0.000001)),
        model.ConditionState(Condition.AGENT_STALE, "Unknown", "NoData", "", at(5)),
    ]
    records = hysteresis.to_status(states, generation=7)
    assert all(r["observedGeneration"] == 7 for r in records)
    assert records[-1] == {
        "type": "ThermalThrottled",
        "status": "True",
        "reason": "Recovering",
        "message": "m",
        "lastTransitionTime": "2026-11-22T01:00:00.000000Z",
        "observedGeneration": 7,
        "observedSince": "2026-11-22T00:58:59.500000Z",
        "recoveringSince": "2026-11-22T01:00:30.000000Z",
    }
    assert hysteresis.from_status(records) == {s.type: s for s in states}


@pytest.mark.parametrize(
    "items",
    [
        None,
        "conditions",
        {"type": "ThermalThrottled"},
        [None, 3, "x", []],
        [{"type": "Bogus", "status": "True", "lastTransitionTime": "2026-11-22T01:00:00Z"}],
        [{"type": ["EccUncorrectable"], "status": "True", "lastTransitionTime": "2026-11-22T01:00:00Z"}],
        [{"type": "EccUncorrectable", "status": "Maybe", "lastTransitionTime": "2026-11-22T01:00:00Z"}],
        [{"type": "EccUncorrectable", "status": "True", "lastTransitionTime": "last tuesday"}],
        [{"type": "EccUncorrectable", "status": "True"}],
    ],
)
def test_from_status_drops_garbage(items: object) -> None:
    assert hysteresis.from_status(items) == {}


def test_from_status_tolerates_garbage_optional_fields() -> None:
    items = [
        {
            "type": "EccUncorrectable",
            "status": "True",
            "lastTransitionTime": "2026-11-22T01:00:00+00:00",
            "reason": 5,
            "message": None,
            "observedSince": "soon",
            "recoveringSince": 12,
        }
    ]
    assert hysteresis.from_status(items) == {
        Condition.ECC_UNCORRECTABLE: model.ConditionState(Condition.ECC_UNCORRECTABLE, "True", "", "", at(0))
    }


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    steps=st.lists(
        st.tuples(st.integers(0, 120), st.sampled_from([True, False, None]), st.sampled_from(["a", "b"])),
        min_size=1,
        max_size=30,
    ),
    for_seconds=st.sampled_from([0.0, 30.0, 60.0]),
    clear_seconds=st.sampled_from([0.0, 60.0]),
    first=st.one_of(
        st.none(),
        st.builds(  # as read back from a status anyone may have written
            model.ConditionState,
            st.just(THERMAL),
            st.sampled_from([hysteresis.TRUE, hysteresis.FALSE, hysteresis.UNKNOWN]),
            st.sampled_from([hysteresis.DETECTED, hysteresis.NOT_DETECTED, hysteresis.PENDING]),
            st.sampled_from(["a", "b"]),
            st.just(T0),
            observed_since=st.sampled_from([None, T0]),
            recovering_since=st.sampled_from([None, T0]),
        ),
    ),
)
@hypothesis.example(  # read back pending-looking: absent now restarts its recovery clock
    steps=[(10, False, "a")],
    for_seconds=0.0,
    clear_seconds=0.0,
    first=model.ConditionState(
        THERMAL, hysteresis.FALSE, hysteresis.NOT_DETECTED, "a", T0, observed_since=T0
    ),
)
@hypothesis.example(  # read back held while recovering: present again ends the recovery
    steps=[(10, True, "a")],
    for_seconds=0.0,
    clear_seconds=60.0,
    first=model.ConditionState(THERMAL, hysteresis.TRUE, hysteresis.DETECTED, "a", T0, recovering_since=T0),
)
def test_a_state_carried_over_unchanged_equals_one_built_afresh(
    steps: list[tuple[int, bool | None, str]],
    for_seconds: float,
    clear_seconds: float,
    first: model.ConditionState | None,
) -> None:
    """A report that changes nothing keeps the previous state object (no copy per condition per
    report); it must be the state the rules build, field for field, whatever came before."""
    state = built = first
    now = T0
    for seconds, present, message in steps:
        now += datetime.timedelta(seconds=seconds)
        signal = model.Signal(THERMAL, present, message)
        state = hysteresis.advance(state, signal, for_seconds, clear_seconds, now)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(hysteresis, "_unchanged", lambda *_: False)  # always build
            built = hysteresis.advance(built, signal, for_seconds, clear_seconds, now)
        assert state == built


def test_a_healthy_report_and_a_held_fault_keep_their_state_object() -> None:
    healthy = hysteresis.advance(None, sig(False), 0, 0, at(0))
    assert hysteresis.advance(healthy, sig(False), 0, 0, at(60)) is healthy
    held = hysteresis.advance(None, sig(True), 0, 0, at(0))
    assert held.status == hysteresis.TRUE
    assert hysteresis.advance(held, sig(True), 0, 0, at(60)) is held
