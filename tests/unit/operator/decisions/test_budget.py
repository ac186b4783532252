"""Disruption budget: never more than maxUnavailable selected nodes cordoned per policy."""

import dataclasses
import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import keys
from gpuhealth_operator.decisions import budget, model, policies

T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
POLICY = "gpu"


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def pol(max_unavailable: int | str) -> model.Policy:
    return policies.parse_policy(POLICY, 1, {"maxUnavailable": max_unavailable})


def nodes(
    count: int, *, ours: tuple[int, ...] = (), human: tuple[int, ...] = (), other: tuple[int, ...] = ()
) -> list[model.NodeView]:
    result = []
    for i in range(count):
        annotations = {}
        if i in ours:
            annotations[keys.CORDONED_BY_ANNOTATION] = POLICY
        if i in other:
            annotations[keys.CORDONED_BY_ANNOTATION] = "other-policy"
        result.append(
            model.NodeView(name=f"n{i}", annotations=annotations, unschedulable=i in ours + human + other)
        )
    return result


@pytest.mark.parametrize(
    ("case", "limit", "fleet", "wanting", "in_flight", "admitted", "pending"),
    [
        (
            "four failing, budget two: most severe then oldest first",
            2,
            nodes(10),
            [("n1", 1, at(5)), ("n2", 0, at(9)), ("n3", 1, at(1)), ("n4", 0, at(3))],
            frozenset(),
            {"n4", "n2"},
            ("n3", "n1"),
        ),
        (
            "ties broken by name",
            1,
            nodes(10),
            [("n5", 0, at(0)), ("n3", 0, at(0))],
            frozenset(),
            {"n3"},
            ("n5",),
        ),
        (
            "already ours holds budget and stays admitted",
            2,
            nodes(10, ours=(7,)),
            [("n1", 0, at(0)), ("n7", 3, at(50)), ("n2", 0, at(1))],
            frozenset(),
            {"n7", "n1"},
            ("n2",),
        ),
        (
            "a human cordon counts against the budget",
            2,
            nodes(10, human=(0,)),
            [("n1", 0, at(0)), ("n2", 0, at(1))],
            frozenset(),
            {"n1"},
            ("n2",),
        ),
        (
            "another policy's cordon counts too",
            2,
            nodes(10, other=(0, 9)),
            [("n1", 0, at(0))],
            frozenset(),
            set(),
            ("n1",),
        ),
        (
            "a wanting node that is already unschedulable costs nothing more",
            1,
            nodes(10, human=(4,)),
            [("n4", 0, at(0)), ("n5", 0, at(0))],
            frozenset(),
            {"n4"},
            ("n5",),
        ),
        (
            "in-flight cordons count before their watch event arrives",
            2,
            nodes(10),
            [("n1", 0, at(0)), ("n2", 0, at(1)), ("n3", 0, at(2))],
            frozenset({"n2"}),
            {"n1", "n2"},
            ("n3",),
        ),
        (
            "over budget already (humans): ours continue, nobody new",
            2,
            nodes(10, ours=(1,), human=(2, 3)),
            [("n1", 0, at(0)), ("n5", 0, at(0))],
            frozenset(),
            {"n1"},
            ("n5",),
        ),
        (
            "nodes the policy does not select are ignored",
            5,
            nodes(3),
            [("elsewhere", 0, at(0)), ("n1", 0, None)],
            frozenset({"elsewhere"}),
            {"n1"},
            (),
        ),
        (
            "unknown detection time queues last; duplicates keep the most severe entry",
            1,
            nodes(10),
            [("n1", 2, None), ("n2", 2, at(0)), ("n1", 0, None)],
            frozenset(),
            {"n1"},
            ("n2",),
        ),
    ],
)
def test_plan(
    case: str,
    limit: int,
    fleet: list[model.NodeView],
    wanting: list[tuple[str, int, datetime.datetime | None]],
    in_flight: frozenset[str],
    admitted: set[str],
    pending: tuple[str, ...],
) -> None:
    result = budget.plan(pol(limit), fleet, wanting, in_flight)
    assert result.limit == limit, case
    assert result.admitted == admitted, case
    assert result.pending == pending, case


def test_percent_is_resolved_against_selected_nodes() -> None:
    fleet = nodes(40)
    wanting = [(f"n{i}", 0, at(i)) for i in range(10)]
    result = budget.plan(pol("10%"), fleet, wanting)
    assert result.limit == 4
    assert result.admitted == {"n0", "n1", "n2", "n3"}
    assert result.pending == tuple(f"n{i}" for i in range(4, 10))


def test_counted() -> None:
    fleet = nodes(6, ours=(0,), human=(1,), other=(2,))
    assert budget.counted(pol(1), fleet, frozenset({"n3", "gone"})) == {"n0", "n1", "n2", "n3"}


# --- property: never more than maxUnavailable cordoned per policy -------------------------------

KINDS = st.sampled_from(["free", "free", "free", "ours", "human", "other"])
MAX_UNAVAILABLE = st.one_of(st.integers(1, 6), st.sampled_from(["1%", "10%", "25%", "50%", "100%"]))


def fleet_from(kinds: list[str]) -> list[model.NodeView]:
    return [
        model.NodeView(
            name=f"n{i}",
            annotations={keys.CORDONED_BY_ANNOTATION: POLICY if kind == "ours" else "other"}
            if kind in ("ours", "other")
            else {},
            unschedulable=kind != "free",
        )
        for i, kind in enumerate(kinds)
    ]


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(KINDS, max_size=30),
    max_unavailable=MAX_UNAVAILABLE,
    data=st.data(),
)
def test_plan_never_exceeds_the_limit(
    kinds: list[str], max_unavailable: int | str, data: st.DataObject
) -> None:
    fleet = fleet_from(kinds)
    names = [n.name for n in fleet]
    wanting = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from([*names, "not-selected"]),
                st.integers(0, 9),
                st.one_of(st.none(), st.integers(0, 1000).map(at)),
            ),
            max_size=40,
        )
    )
    in_flight = frozenset(data.draw(st.lists(st.sampled_from([*names, "not-selected"]), max_size=5)))
    policy = pol(max_unavailable)
    result = budget.plan(policy, fleet, wanting, in_flight)

    counted = budget.counted(policy, fleet, in_flight)
    wanted = {name for name, _, _ in wanting if name in names}
    after = counted | result.admitted
    assert result.limit == policies.resolve_max_unavailable(policy, len(fleet))
    assert len(after) <= max(result.limit, len(counted))
    if result.admitted - counted:
        assert len(after) <= result.limit
    assert result.admitted.isdisjoint(result.pending)
    assert result.admitted | set(result.pending) == wanted
    assert len(result.pending) == len(set(result.pending))
    ours = {n.name for n in fleet if n.cordoned_by == POLICY} | (in_flight & set(names))
    assert (wanted & ours) <= result.admitted


@settings(max_examples=150, deadline=None)
@given(
    kinds=st.lists(KINDS, min_size=1, max_size=25),
    max_unavailable=MAX_UNAVAILABLE,
    data=st.data(),
)
def test_a_fleet_run_never_holds_more_than_the_limit(
    kinds: list[str], max_unavailable: int | str, data: st.DataObject
) -> None:
    """Replay rounds of faults, human cordons and recoveries; the policy never holds more than its limit."""
    # Start from a legal state: the policy holds no more than its limit.
    policy = pol(max_unavailable)
    limit = policies.resolve_max_unavailable(policy, len(kinds))
    seen_ours = 0
    for i, kind in enumerate(kinds):
        if kind == "ours":
            seen_ours += 1
            if seen_ours > limit:
                kinds[i] = "free"
    fleet = {n.name: n for n in fleet_from(kinds)}
    names = sorted(fleet)
    for round_ in range(data.draw(st.integers(1, 8))):
        failing = data.draw(st.sets(st.sampled_from(names)))
        wanting = [(name, data.draw(st.integers(0, 9)), at(round_)) for name in sorted(failing)]
        before = budget.counted(policy, list(fleet.values()))
        result = budget.plan(policy, list(fleet.values()), wanting)
        for name in sorted(result.admitted):
            node = fleet[name]
            # We cordon it and mark it ours; a cordon we did not make stays unmarked.
            if not node.unschedulable:
                fleet[name] = dataclasses.replace(
                    node, unschedulable=True, annotations={keys.CORDONED_BY_ANNOTATION: POLICY}
                )
        ours = [n for n in fleet.values() if n.cordoned_by == POLICY]
        assert len(ours) <= result.limit
        after = budget.counted(policy, list(fleet.values()))
        assert len(after) <= max(result.limit, len(before))
        if after - before:  # we took a node out: only while the total stays within the limit
            assert len(after) <= result.limit
        # Between rounds: some of ours recover (uncordoned), humans cordon or uncordon others.
        for name in sorted(data.draw(st.sets(st.sampled_from(names), max_size=4))):
            node = fleet[name]
            if node.cordoned_by == POLICY:
                fleet[name] = dataclasses.replace(node, unschedulable=False, annotations={})
            elif node.cordoned_by is None:
                fleet[name] = dataclasses.replace(node, unschedulable=not node.unschedulable)


# --- property: the indexed admission answers exactly what the plan answers ---------------------------


@settings(max_examples=400, deadline=None)
@given(
    kinds=st.lists(KINDS, max_size=30),
    max_unavailable=MAX_UNAVAILABLE,
    data=st.data(),
)
def test_admits_agrees_with_plan(kinds: list[str], max_unavailable: int | str, data: st.DataObject) -> None:
    fleet = fleet_from(kinds)
    names = [n.name for n in fleet]
    pool = [*names, "not-selected"]
    wanting: dict[str, budget.Rank] = data.draw(
        st.dictionaries(
            st.sampled_from(pool),
            st.tuples(st.integers(0, 9), st.one_of(st.none(), st.integers(0, 1000).map(at))),
            max_size=35,
        )
    )
    in_flight = frozenset(data.draw(st.lists(st.sampled_from(pool), max_size=5)))
    policy = pol(max_unavailable)
    result = budget.plan(policy, fleet, [(n, rank, when) for n, (rank, when) in wanting.items()], in_flight)

    selected = set(names)
    unavailable = budget.counted(policy, fleet, in_flight)
    for name in pool:
        assert budget.admits(policy, name, selected, unavailable, wanting) == (name in result.admitted), name


def test_the_wait_names_who_holds_the_budget_those_an_operator_can_free_first() -> None:
    views = nodes(4, ours=(0,), human=(1,), other=(2,))
    views[3] = model.NodeView(name="n3")  # admitted, its cordon not yet seen
    assert budget.holders_text(pol(4), views) == (
        "n1 (cordoned outside gpu-health), n2 (cordoned by policy other-policy), "
        "n0 (cordoned by this policy), n3 (being cordoned)"
    )
    many = nodes(8, human=tuple(range(8)))
    assert budget.holders_text(pol(8), many).endswith("n4 (cordoned outside gpu-health), and 3 more")
