"""One budget across overlapping policies, counted in GPU nodes (DESIGN.md, safety rule 2).

A node that several acting policies select is cordoned only if every one of
them admits it, and then takes a place in each; a percentage is taken of the
selected nodes that have a GPUNode (an agent), never of every Node the
selector matches. These tests drive the budget's run-time memory
(`admission.Admission`) over a real `cache.ClusterCache`, as the reconciler
does, without a cluster.
"""

import asyncio
import dataclasses
import datetime
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_api import keys
from gpuhealth_operator.decisions import budget, model, policies
from gpuhealth_operator.state import admission, cache

T0 = datetime.datetime(2026, 11, 22, 1, 0, 0, tzinfo=datetime.UTC)
POOLS = ("pool-a", "pool-b", "pool-c")


def node_body(
    name: str, version: int, pools: frozenset[str], *, unschedulable: bool = False, by: str | None = None
) -> dict:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": str(version),
            "labels": {pool: "true" for pool in pools},
            "annotations": {keys.CORDONED_BY_ANNOTATION: by} if by else {},
        },
        "spec": {"unschedulable": unschedulable},
    }


def gpunode_body(name: str, version: int = 1) -> dict:
    return {"metadata": {"name": name, "resourceVersion": str(version)}, "status": {}}


def policy(name: str, pool: str | None, max_unavailable: int | str, *, dry_run: bool = False) -> model.Policy:
    selector = {"matchLabels": {pool: "true"}} if pool else {}
    spec = {"nodeSelector": selector, "maxUnavailable": max_unavailable, "dryRun": dry_run, "rules": []}
    return policies.parse_policy(name, 1, spec)


async def ask(
    memory: admission.Admission,
    nodes: cache.ClusterCache,
    asking: model.Policy,
    name: str,
    wanting: Mapping[str, Mapping[str, budget.Rank]],
) -> bool:
    """What `cordoning.cordon` asks before it cordons `name` for `asking`."""
    return await memory.admit(asking, name, nodes, wanting, T0)


# --- GPU-node budgets ------------------------------------------------------------------------------


def test_five_gpu_nodes_among_fifty_cpu_nodes_at_ten_percent_cordon_one_at_a_time() -> None:
    """Today's bug: 10% of 55 matched Nodes let all 5 GPU nodes go at once; 10% of 5 GPU nodes is 1."""
    nodes = cache.ClusterCache()
    for i in range(50):
        nodes.put_node(node_body(f"cpu{i}", 1, frozenset({"pool-a"})))
    gpus = [f"gpu{i}" for i in range(5)]
    for name in gpus:
        nodes.put_node(node_body(name, 1, frozenset({"pool-a"})))
        nodes.put_gpunode(gpunode_body(name), T0)
    fleet = policy("fleet", None, "10%")  # an empty selector: nodes with an agent, not all 55
    nodes.put_policy(fleet)
    wanting = {"fleet": {name: (0, T0) for name in gpus}}

    async def faults() -> list[str]:
        memory = admission.Admission()
        return [name for name in gpus if await ask(memory, nodes, fleet, name, wanting)]

    assert asyncio.run(faults()) == ["gpu0"]
    assert nodes.selection(fleet).selected == set(gpus)


def test_an_unschedulable_node_without_an_agent_takes_no_place() -> None:
    nodes = cache.ClusterCache()
    nodes.put_node(node_body("cpu", 1, frozenset({"pool-a"}), unschedulable=True))
    nodes.put_node(node_body("gpu", 1, frozenset({"pool-a"})))
    nodes.put_gpunode(gpunode_body("gpu"), T0)
    one = policy("one", "pool-a", 1)
    nodes.put_policy(one)
    assert asyncio.run(ask(admission.Admission(), nodes, one, "gpu", {"one": {"gpu": (0, T0)}}))


# --- overlapping policies ----------------------------------------------------------------------------


def test_two_policies_over_the_same_nodes_admit_one_cordon_between_them() -> None:
    nodes = cache.ClusterCache()
    names = [f"n{i}" for i in range(4)]
    for name in names:
        nodes.put_node(node_body(name, 1, frozenset({"pool-a"})))
        nodes.put_gpunode(gpunode_body(name), T0)
    first, second = policy("first", "pool-a", 1), policy("second", None, 1)
    nodes.put_policy(first)
    nodes.put_policy(second)
    wanting = {"first": {n: (0, T0) for n in names[:3]}, "second": {n: (0, T0) for n in names[:3]}}

    async def one_tick() -> list[tuple[str, str]]:
        memory = admission.Admission()
        admitted = []
        for asking in (first, second):  # each selecting policy acts on each node, as the reconciler does
            for name in names[:3]:
                if name in {n for _, n in admitted}:
                    continue  # being cordoned: the next policy finds it unschedulable and asks no more
                if await ask(memory, nodes, asking, name, wanting):
                    admitted.append((asking.name, name))
        return admitted

    assert asyncio.run(one_tick()) == [("first", "n0")]


def test_a_node_waits_for_the_budget_of_a_policy_that_only_labels_it() -> None:
    """Every acting policy selecting the node must admit it, whether or not its own rules want a cordon."""
    nodes = cache.ClusterCache()
    for name, pools in [("held", {"pool-a", "pool-b"}), ("faulty", {"pool-a", "pool-b"}), ("x", {"pool-a"})]:
        nodes.put_node(node_body(name, 1, frozenset(pools), unschedulable=name == "held"))
        nodes.put_gpunode(gpunode_body(name), T0)
    drains, labels = policy("drains", "pool-a", 2), policy("labels", "pool-b", 1)
    dry = policy("dry", "pool-a", 1, dry_run=True)  # a dry run changes nothing, so it holds back nothing
    for each in (drains, labels, dry):
        nodes.put_policy(each)
    memory = admission.Admission()
    wanting = {"drains": {"faulty": (1, T0)}, "dry": {"x": (0, T0)}}
    assert not asyncio.run(ask(memory, nodes, drains, "faulty", wanting))
    why = memory.wait_reason(drains, "faulty", nodes, wanting)
    assert (
        "policy labels" in why and "maxUnavailable=1" in why and "held (cordoned outside gpu-health)" in why
    )
    nodes.put_node(node_body("held", 2, frozenset({"pool-a", "pool-b"})))  # a human uncordons it
    assert asyncio.run(ask(memory, nodes, drains, "faulty", wanting))


def test_a_verdict_judged_before_the_node_left_a_policy_keeps_no_place_in_another_budget() -> None:
    nodes = cache.ClusterCache()
    for name, pools in [("moved", {"pool-b"}), ("faulty", {"pool-b"}), ("spare", {"pool-a", "pool-b"})]:
        nodes.put_node(node_body(name, 1, frozenset(pools)))
        nodes.put_gpunode(gpunode_body(name), T0)
    pool_a, pool_b = policy("pool-a", "pool-a", 1), policy("pool-b", "pool-b", 1)
    nodes.put_policy(pool_a)
    nodes.put_policy(pool_b)
    # pool-a wanted "moved" (its worst fault) while the node was still labelled pool-a.
    wanting = {"pool-a": {"moved": (0, T0)}, "pool-b": {"faulty": (3, T0)}}
    assert asyncio.run(ask(admission.Admission(), nodes, pool_b, "faulty", wanting))


MAX_UNAVAILABLE = st.one_of(st.integers(1, 4), st.sampled_from(["1%", "25%", "50%", "100%"]))


@dataclasses.dataclass
class World:
    """What the fleet looks like, kept by the test itself: the budget's answers are checked against it."""

    pools: list[frozenset[str]]
    agents: list[bool]
    human: list[bool]
    ours: dict[int, str] = dataclasses.field(default_factory=dict)
    """node index → the policy whose cordon is in the cache."""
    pending: dict[int, str] = dataclasses.field(default_factory=dict)
    """node index → the policy admitted to cordon it, its cordon not yet in the cache."""
    versions: list[int] = dataclasses.field(default_factory=list)

    def selected(self, p: model.Policy) -> set[int]:
        """GPU nodes the policy selects, by the contract's words (not by the operator's index)."""
        return {
            i
            for i, pools in enumerate(self.pools)
            if self.agents[i] and all(pools >= {k} for k in p.match_labels)
        }

    def held(self, p: model.Policy) -> set[int]:
        return {i for i in self.selected(p) if self.human[i] or i in self.ours or i in self.pending}

    def humans(self, p: model.Policy) -> int:
        return sum(1 for i in self.selected(p) if self.human[i])

    def put(self, nodes: cache.ClusterCache, i: int) -> None:
        self.versions[i] += 1
        by = self.ours.get(i)
        body = node_body(
            f"n{i}", self.versions[i], self.pools[i], unschedulable=self.human[i] or bool(by), by=by
        )
        nodes.put_node(body)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_interleaved_reconciles_of_overlapping_policies_never_exceed_any_budget(data: st.DataObject) -> None:
    """Random fleets, policies and orders of admissions, cordons landing, cordons lost and recoveries.

    After every step, every acting policy holds no more selected GPU nodes
    unschedulable (or about to be) than its maxUnavailable, unless humans alone
    cordoned more than that before the run started.
    """
    count = data.draw(st.integers(1, 12), label="nodes")
    world = World(
        pools=[data.draw(st.frozensets(st.sampled_from(POOLS))) for _ in range(count)],
        agents=[data.draw(st.integers(0, 3)) != 0 for _ in range(count)],
        human=[data.draw(st.integers(0, 5)) == 0 for _ in range(count)],
        versions=[0] * count,
    )
    drawn = data.draw(
        st.lists(
            st.tuples(st.sampled_from([None, *POOLS]), MAX_UNAVAILABLE, st.integers(0, 5)),
            min_size=1,
            max_size=4,
        )
    )
    pols = [policy(f"p{k}", pool, limit, dry_run=dry == 0) for k, (pool, limit, dry) in enumerate(drawn)]
    acting = [p for p in pols if not p.dry_run]
    wanting: dict[str, dict[str, budget.Rank]] = {
        p.name: {
            f"n{i}": (
                data.draw(st.integers(0, 3)),
                T0 + datetime.timedelta(seconds=data.draw(st.integers(0, 5))),
            )
            for i in sorted(data.draw(st.sets(st.sampled_from(sorted(world.selected(p) or {0})))))
            if i in world.selected(p)
        }
        for p in pols
    }
    steps = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(["admit", "admit", "land", "lose", "recover"]),
                st.integers(0, 11),
                st.integers(0, 3),
            ),
            max_size=40,
        )
    )
    nodes = cache.ClusterCache()
    for i in range(count):
        world.put(nodes, i)
        if world.agents[i]:
            nodes.put_gpunode(gpunode_body(f"n{i}"), T0)
    for p in pols:
        nodes.put_policy(p)

    def check() -> None:
        for p in acting:
            limit = policies.resolve_max_unavailable(p, len(world.selected(p)))
            held = world.held(p)
            assert len(held) <= max(limit, world.humans(p)), (p, sorted(held), limit)

    async def run() -> None:
        memory = admission.Admission()
        for kind, drawn_node, k in steps:
            i = drawn_node % count
            name = f"n{i}"
            if kind == "admit" and acting:
                asking = acting[k % len(acting)]
                busy = world.human[i] or i in world.ours or i in world.pending  # node locks serialise a node
                if (
                    name in wanting[asking.name]
                    and not busy
                    and await ask(memory, nodes, asking, name, wanting)
                ):
                    world.pending[i] = asking.name
            elif kind in ("land", "lose") and world.pending:
                landing = sorted(world.pending)[k % len(world.pending)]
                by = world.pending.pop(landing)
                if kind == "land":  # the cordon's answer reaches the cache, then admission lets go
                    world.ours[landing] = by
                    world.put(nodes, landing)
                memory.release(next(p for p in acting if p.name == by), f"n{landing}")
            elif kind == "recover" and i in world.ours:
                del world.ours[i]
                world.put(nodes, i)
            check()

    check()
    asyncio.run(run())


# --- the pure rule ------------------------------------------------------------------------------------


def test_admits_all_needs_every_selecting_budget() -> None:
    a, b = policy("a", None, 1), policy("b", None, 2)
    wanting = budget.Ranks([({"x": (0, T0), "y": (1, T0)}, {"x", "y", "z", "w"})])
    free = budget.Budget(a, frozenset({"x", "y"}), frozenset())
    full = budget.Budget(b, frozenset({"x", "z"}), frozenset({"z", "w"}))
    elsewhere = budget.Budget(b, frozenset({"z"}), frozenset({"z"}))
    assert budget.admits_all("x", [free, elsewhere], wanting)
    assert not budget.admits_all("x", [free, full], wanting)
    assert not budget.admits_all("y", [free], wanting)  # x is worse: a's one place is x's
    assert not budget.admits_all("x", [elsewhere], wanting)  # no budget selects it: never admitted


def test_ranks_give_each_node_its_most_urgent_rank_among_the_policies_that_select_it() -> None:
    early, late = T0, T0 + datetime.timedelta(seconds=9)
    ranks = budget.Ranks(
        [
            ({"x": (2, early), "y": (1, None), "gone": (0, early)}, {"x", "y"}),
            ({"x": (1, late), "z": (0, early)}, {"x", "z"}),
            ({}, {"x"}),
        ]
    )
    assert dict(ranks) == {"x": (1, late), "y": (1, None), "z": (0, early)}
    assert "gone" not in ranks and len(ranks) == 3
    assert ranks.among({"x", "gone", "w"}) == {"x"}


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_most_urgent_node_that_every_selecting_budget_has_room_for_is_admitted(
    data: st.DataObject,
) -> None:
    """No deadlock, no head-of-line blocking.

    One queue order for all budgets (two orders could each keep their free place for a different
    node), and a node another budget blocks outright keeps no place in the queues of the rest.
    """
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 10)))]
    unschedulable = data.draw(st.sets(st.sampled_from(names)))
    budgets = []
    for k in range(data.draw(st.integers(1, 4))):
        selected = frozenset(data.draw(st.sets(st.sampled_from(names), min_size=1)))
        unavailable = selected & unschedulable
        budgets.append(
            budget.Budget(policy(f"p{k}", None, data.draw(MAX_UNAVAILABLE)), selected, unavailable)
        )
    ranks = st.tuples(
        st.integers(0, 3),
        st.one_of(st.none(), st.integers(0, 5).map(lambda s: T0 + datetime.timedelta(seconds=s))),
    )
    per_policy = [data.draw(st.dictionaries(st.sampled_from(names), ranks)) for _ in budgets]
    wanting = budget.Ranks((wants, b.selected) for wants, b in zip(per_policy, budgets, strict=True))
    waiting = sorted(
        (n for n in wanting if any(n in b.selected for b in budgets) and n not in unschedulable),
        key=lambda n: (wanting[n][0], wanting[n][1] or datetime.datetime.max.replace(tzinfo=datetime.UTC), n),
    )

    def room(name: str) -> bool:
        return all(
            policies.resolve_max_unavailable(b.policy, len(b.selected)) > len(b.unavailable)
            for b in budgets
            if name in b.selected
        )

    free = [n for n in waiting if room(n)]
    assert all(not budget.admits_all(n, budgets, wanting) for n in waiting if not room(n))
    if free:  # a node that cannot be cordoned anyway keeps no place from the others
        assert budget.admits_all(free[0], budgets, wanting)
