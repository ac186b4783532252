"""Topology budgets (spec.topology.budgets): one budget per domain, admitted with maxUnavailable.

The pure rule (`budget.domain_budgets`, `budget.refusing`) without a cluster, then the
admission as the operator asks it, over the cache's selections.
"""

import asyncio
import datetime
from collections.abc import Callable, Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

import drain_cluster
from gpuhealth_operator.decisions import budget, drill, model, policies
from gpuhealth_operator.state import admission, cache

T0 = datetime.datetime(2026, 11, 26, 12, 0, 0, tzinfo=datetime.UTC)
RACK, ZONE = "example.com/rack", "topology.kubernetes.io/zone"


def policy(
    name: str = "p",
    max_unavailable: int | str = 10,
    budgets: Mapping[str, int | str] | None = None,
    *,
    pool: str | None = None,
    dry_run: bool = False,
) -> model.Policy:
    spec = {
        "nodeSelector": {"matchLabels": {pool: "true"}} if pool else {},
        "maxUnavailable": max_unavailable,
        "dryRun": dry_run,
        "rules": [],
        "topology": {"budgets": [{"key": k, "maxUnavailable": v} for k, v in (budgets or {}).items()]},
    }
    return policies.parse_policy(name, 1, spec)


def labels_of(table: Mapping[str, Mapping[str, str]]) -> Callable[[str], Mapping[str, str] | None]:
    return table.get


def ranks(*names: str) -> budget.Ranks:
    """Every name wants a cordon, ranked in the order given."""
    order = {n: (i, T0) for i, n in enumerate(names)}
    return budget.Ranks([(order, set(order))])


# --- the pure rule --------------------------------------------------------------------------------------


def test_domains_are_the_values_of_the_label_and_nodes_without_it_are_in_none() -> None:
    p = policy(budgets={RACK: 1, ZONE: "50%"})
    table = {
        "a": {RACK: "r1", ZONE: "z1"},
        "b": {RACK: "r1", ZONE: "z1"},
        "c": {RACK: "r2", ZONE: "z1"},
        "d": {ZONE: "z2"},  # no rack label: in no rack
        "e": {RACK: ""},  # an empty value is a domain of its own
        "opted-out": {RACK: "r2"},  # unschedulable, matched, opted out: counted, not selected
    }
    selected = frozenset("abcde")
    unavailable = frozenset({"b", "opted-out"})
    found = budget.domain_budgets(p, selected, unavailable, labels_of(table))
    assert [(str(b.domain), sorted(b.selected), sorted(b.unavailable), b.limit) for b in found] == [
        (f"{RACK}=", ["e"], [], 1),
        (f"{RACK}=r1", ["a", "b"], ["b"], 1),
        (f"{RACK}=r2", ["c"], ["opted-out"], 1),
        (f"{ZONE}=z1", ["a", "b", "c"], ["b"], 1),  # 50% of 3, rounded down
        (f"{ZONE}=z2", ["d"], [], 1),  # at least 1
    ]
    assert found[1].describe() == f"topology budget {RACK}=r1 (maxUnavailable=1)"
    assert budget.domain_budgets(policy(), selected, unavailable, labels_of(table)) == []


def test_a_domain_percentage_is_of_the_domains_selected_nodes() -> None:
    p = policy(budgets={ZONE: "25%"})
    table = {f"n{i}": {ZONE: "z1" if i < 8 else "z2"} for i in range(15)}
    found = budget.domain_budgets(p, frozenset(table), frozenset(), labels_of(table))
    assert [(str(b.domain), len(b.selected), b.limit) for b in found] == [
        (f"{ZONE}=z1", 8, 2),
        (f"{ZONE}=z2", 7, 1),
    ]


def budgets_for(
    p: model.Policy, table: Mapping[str, Mapping[str, str]], unavailable: frozenset[str] = frozenset()
) -> list[budget.Budget]:
    own = budget.Budget(p, frozenset(table), unavailable)
    return [own, *budget.domain_budgets(p, own.selected, own.unavailable, labels_of(table))]


def test_at_budget_lists_the_full_domains_only() -> None:
    table = {"a": {RACK: "r1"}, "b": {RACK: "r1"}, "c": {RACK: "r2"}, "d": {RACK: "r3"}}
    found = budgets_for(policy(max_unavailable=1, budgets={RACK: 1}), table, frozenset({"a", "d"}))
    full = budget.at_budget(found)
    assert [(str(b.domain), len(b.unavailable), b.limit, len(b.selected)) for b in full] == [
        (f"{RACK}=r1", 1, 1, 2),
        (f"{RACK}=r3", 1, 1, 1),
    ]


def test_a_busy_domain_holds_a_second_step_in_it_back() -> None:
    """Two cordoned nodes of one rack (one relabelled into it): one may be repaired at a time."""
    table = {"a": {RACK: "r1"}, "moved": {RACK: "r1"}, "c": {RACK: "r2"}, "x": {}}
    found = budgets_for(policy(budgets={RACK: 1}), table, frozenset({"a", "moved", "c", "x"}))
    assert budget.busy_domain("a", found, set()) is None
    assert budget.busy_domain("a", found, {"a"}) is None  # itself
    held = budget.busy_domain("moved", found, {"a"})
    assert held is not None and str(held.domain) == f"{RACK}=r1"
    assert budget.busy_domain("c", found, {"a"}) is None
    assert budget.busy_domain("x", found, {"a", "moved", "c"}) is None  # in no rack


def test_one_node_per_rack_on_top_of_max_unavailable() -> None:
    table = {"a": {RACK: "r1"}, "b": {RACK: "r1"}, "c": {RACK: "r2"}, "x": {}}
    wanting = ranks("a", "b", "c", "x")
    found = budgets_for(policy(budgets={RACK: 1}), table)
    assert [n for n in table if budget.admits_all(n, found, wanting)] == ["a", "c", "x"]
    refused = budget.refusing("b", found, wanting)
    assert [str(b.domain) for b in refused] == [f"{RACK}=r1"]
    # maxUnavailable still holds: two free racks, one place
    tight = budgets_for(policy(max_unavailable=1, budgets={RACK: 1}), table)
    assert [n for n in table if budget.admits_all(n, tight, wanting)] == ["a"]


def test_an_unschedulable_node_of_anyone_holds_its_rack_and_a_holder_keeps_its_place() -> None:
    table = {"human": {RACK: "r1"}, "a": {RACK: "r1"}, "b": {RACK: "r2"}, "moved": {RACK: "r2"}}
    wanting = ranks("a", "b", "moved")
    found = budgets_for(policy(budgets={RACK: 1}), table, frozenset({"human", "moved"}))
    assert not budget.admits_all("a", found, wanting)  # human's cordon takes r1's place
    assert not budget.admits_all("b", found, wanting)  # moved (relabelled into r2, cordoned) takes r2's
    assert budget.admits_all("moved", found, wanting)  # its drain goes on


def test_a_node_a_full_zone_blocks_keeps_no_place_in_its_rack() -> None:
    """x ranks first in rack r1 but zone z2 is full: r1's one place goes to y, not kept for x."""
    table = {"x": {RACK: "r1", ZONE: "z2"}, "y": {RACK: "r1", ZONE: "z1"}, "z": {RACK: "r9", ZONE: "z2"}}
    found = budgets_for(policy(budgets={RACK: 1, ZONE: 1}), table, frozenset({"z"}))
    wanting = ranks("x", "y")
    assert not budget.admits_all("x", found, wanting)
    assert budget.admits_all("y", found, wanting)


def test_overlapping_policies_each_count_their_own_nodes_of_the_domain() -> None:
    """wide: every node, 2 per rack; pool-b: b1 and b2, 1 per rack. Once b1 is cordoned, b2 is blocked by
    pool-b's full rack and keeps no place in wide's queue: wide's second place goes to a1."""
    table = {"b1": {RACK: "r1"}, "b2": {RACK: "r1"}, "a1": {RACK: "r1"}, "a2": {RACK: "r1"}}
    wide = policy("wide", budgets={RACK: 2})
    pool_b = policy("pool-b", budgets={RACK: 1})

    def found(held: frozenset[str]) -> list[budget.Budget]:
        return [
            *budgets_for(wide, table, held),
            *budgets_for(pool_b, {n: table[n] for n in ("b1", "b2")}, held & {"b1", "b2"}),
        ]

    wanting = ranks("b1", "b2", "a1", "a2")
    assert [n for n in table if budget.admits_all(n, found(frozenset()), wanting)] == ["b1"]
    assert [n for n in table if budget.admits_all(n, found(frozenset({"b1"})), wanting)] == ["b1", "a1"]
    assert [n for n in table if budget.admits_all(n, found(frozenset({"b1", "a1"})), wanting)] == ["b1", "a1"]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_admitting_one_by_one_never_exceeds_any_domain_or_max_unavailable(data: st.DataObject) -> None:
    """Admit and cordon the admitted nodes one at a time, as the operator does under its lock: no
    domain of any budget and no maxUnavailable is ever exceeded, whatever the labels and holders."""
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 12)))]
    table = {
        n: {
            k: v
            for k, v in {
                RACK: data.draw(st.sampled_from(["r1", "r2", "r3", None])),
                ZONE: data.draw(st.sampled_from(["z1", "z2", None])),
            }.items()
            if v is not None
        }
        for n in names
    }
    p = policy(
        max_unavailable=data.draw(st.sampled_from([1, 2, 5, "50%"])),
        budgets={RACK: data.draw(st.sampled_from([1, 2, "50%"])), ZONE: data.draw(st.sampled_from([1, 3]))},
    )
    held = set(data.draw(st.sets(st.sampled_from(names))))
    wanting = ranks(*data.draw(st.permutations(names)))
    start = {b.domain: len(b.unavailable) for b in budgets_for(p, table, frozenset(held))}
    while True:
        found = budgets_for(p, table, frozenset(held))
        admitted = [n for n in names if n not in held and budget.admits_all(n, found, wanting)]
        if not admitted:
            break
        held.add(admitted[0])
    for b in budgets_for(p, table, frozenset(held)):
        assert len(b.unavailable) <= max(b.limit, start.get(b.domain, 0)), b.describe()


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_one_admission_call_is_each_policys_budgets_and_admits_all(data: st.DataObject) -> None:
    """`budget.admission` (one call per admission) answers what building each acting policy's budget and
    domains one by one, then asking `admits_all` over them, answers: the same budgets, the same verdict."""
    names = [f"n{i}" for i in range(data.draw(st.integers(1, 8)))]
    table = {n: {RACK: data.draw(st.sampled_from(["r1", "r2"]))} for n in names if data.draw(st.booleans())}
    acting = []
    for i in range(data.draw(st.integers(0, 3))):
        p = policy(
            f"p{i}",
            max_unavailable=data.draw(st.sampled_from([1, 2, "50%"])),
            budgets=data.draw(st.sampled_from([{}, {RACK: 1}])),
        )
        selected = frozenset(data.draw(st.sets(st.sampled_from(names))))
        acting.append((p, selected, frozenset(data.draw(st.sets(st.sampled_from(names))))))
    wanting = [({n: (i, T0) for i, n in enumerate(data.draw(st.permutations(names)))}, frozenset(names))]
    name = data.draw(st.sampled_from(names))
    one_by_one: list[budget.Budget] = []
    for p, selected, unavailable in acting:
        own = budget.Budget(p, selected, unavailable)
        one_by_one += [own, *budget.domain_budgets(p, selected, unavailable, labels_of(table))]
    found, admitted = budget.admission(name, acting, labels_of(table), wanting)
    assert found == one_by_one
    assert admitted == budget.admits_all(name, one_by_one, budget.Ranks(wanting))


# --- the admission over the cache ------------------------------------------------------------------------


def node_body(
    name: str, labels: Mapping[str, str], *, unschedulable: bool = False, by: str | None = None
) -> dict:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": dict(labels),
        },
        "spec": {"unschedulable": unschedulable},
    }


def fleet(*nodes: tuple[str, Mapping[str, str], bool]) -> cache.ClusterCache:
    result = cache.ClusterCache()
    for name, labels, unschedulable in nodes:
        result.put_node(node_body(name, labels, unschedulable=unschedulable))
        result.put_gpunode({"metadata": {"name": name, "resourceVersion": "1"}, "status": {}}, T0)
    return result


def test_the_admission_holds_a_rack_and_says_which_budget_and_domain() -> None:
    nodes = fleet(("a", {RACK: "r1"}, True), ("b", {RACK: "r1"}, False), ("c", {RACK: "r2"}, False))
    p = policy(budgets={RACK: 1})
    nodes.put_policy(p)
    memory = admission.Admission()
    wanting = {"p": {"b": (0, T0), "c": (0, T0)}}
    assert not asyncio.run(memory.admit(p, "b", nodes, wanting, T0))
    assert asyncio.run(memory.admit(p, "c", nodes, wanting, T0))
    why = memory.wait_reason(p, "b", nodes, wanting)
    assert why == (
        f"topology budget {RACK}=r1: 1 of its 2 selected GPU nodes in the domain are already unschedulable "
        "(maxUnavailable=1): a (cordoned outside gpu-health)"
    )


def test_another_policys_domain_budget_and_a_dry_run_one() -> None:
    nodes = fleet(("a", {RACK: "r1", "pool": "true"}, True), ("b", {RACK: "r1", "pool": "true"}, False))
    mine = policy("mine")
    pool = policy("pool", budgets={RACK: 1}, pool="pool")
    dry = policy("dry", budgets={RACK: 1}, dry_run=True)
    for each in (mine, pool, dry):
        nodes.put_policy(each)
    memory = admission.Admission()
    wanting = {"mine": {"b": (0, T0)}}
    assert not asyncio.run(memory.admit(mine, "b", nodes, wanting, T0))
    assert memory.wait_reason(mine, "b", nodes, wanting).startswith(
        f"policy pool, which also selects it: topology budget {RACK}=r1: 1 of its 2"
    )
    nodes.put_policy(policy("pool", budgets={RACK: 2}, pool="pool"))
    assert asyncio.run(memory.admit(mine, "b", nodes, wanting, T0))  # the dry run holds nothing back


def test_a_relabelled_node_counts_in_its_new_rack_from_its_next_version() -> None:
    nodes = fleet(("moved", {RACK: "r1"}, True), ("b", {RACK: "r1"}, False), ("c", {RACK: "r2"}, False))
    p = policy(budgets={RACK: 1})
    nodes.put_policy(p)
    memory = admission.Admission()
    wanting = {"p": {"b": (0, T0), "c": (0, T0)}}
    assert not asyncio.run(memory.admit(p, "b", nodes, wanting, T0))
    moved = node_body("moved", {RACK: "r2"}, unschedulable=True)
    moved["metadata"]["resourceVersion"] = "2"
    nodes.put_node(moved)
    assert asyncio.run(memory.admit(p, "b", nodes, wanting, T0))
    assert not asyncio.run(memory.admit(p, "c", nodes, wanting, T0))
    assert f"{RACK}=r2" in memory.wait_reason(p, "c", nodes, wanting)


def test_a_drill_names_a_full_rack() -> None:
    table = {"a": {RACK: "r1"}, "b": {RACK: "r1"}, "c": {RACK: "r2"}}
    found = budgets_for(policy(budgets={RACK: 1}), table, frozenset({"a"}))
    assert drill.budget_wait("b", found) == (
        f"policy p's topology budget {RACK}=r1 has no free place (1 of its 2 selected GPU nodes in the "
        "domain are unschedulable, maxUnavailable=1)"
    )
    assert drill.budget_wait("c", found) is None


# --- a freed place is given at once, not at the next timer pass ------------------------------------------


def cordon_spec() -> dict:
    return {
        "nodeSelector": {"matchLabels": {"pool": "a"}},
        "maxUnavailable": 10,
        "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
        "breaker": {"maxNewUnhealthy": "100%"},
        "topology": {"budgets": [{"key": RACK, "maxUnavailable": 1}]},
    }


def test_a_human_uncordon_in_the_rack_admits_the_waiting_node_without_a_timer_pass() -> None:
    async def run() -> None:
        cluster = drain_cluster.DrainCluster()
        nodes = {"a1": {"pool": "a", RACK: "r1"}, "a2": {"pool": "a", RACK: "r1"}}
        ctx = await drain_cluster.start(cluster, {"p": cordon_spec()}, nodes)
        await drain_cluster.report(cluster, ctx, "a1", ecc=1)
        await drain_cluster.report(cluster, ctx, "a2", ecc=1)
        assert cluster.nodes["a1"]["spec"].get("unschedulable") is True
        assert not cluster.nodes["a2"]["spec"].get("unschedulable")
        assert ctx.admission.waiting("p", "a2")
        cluster.nodes["a1"]["spec"]["unschedulable"] = False  # kubectl uncordon a1
        cluster.put_node(cluster.nodes["a1"])
        await drain_cluster.deliver(cluster, ctx, "a1")
        assert cluster.nodes["a2"]["spec"].get("unschedulable") is True
        assert not cluster.nodes["a1"]["spec"].get("unschedulable"), "the human's uncordon stands"

    asyncio.run(run())


def test_a_cordoned_node_relabelled_into_another_rack_frees_its_old_racks_place_at_once() -> None:
    async def run() -> None:
        cluster = drain_cluster.DrainCluster()
        nodes = {n: {"pool": "a", RACK: "r1"} for n in ("a1", "a2")} | {"b1": {"pool": "a", RACK: "r2"}}
        ctx = await drain_cluster.start(cluster, {"p": cordon_spec()}, nodes)
        await drain_cluster.report(cluster, ctx, "a1", ecc=1)
        await drain_cluster.report(cluster, ctx, "a2", ecc=1)
        assert not cluster.nodes["a2"]["spec"].get("unschedulable")
        await drain_cluster.node_changed(cluster, ctx, "a1", **{RACK: "r2"})
        assert cluster.nodes["a2"]["spec"].get("unschedulable") is True
        await drain_cluster.report(cluster, ctx, "b1", ecc=1)
        assert not cluster.nodes["b1"]["spec"].get("unschedulable"), "a1 holds r2 now"
        assert cluster.nodes["a1"]["spec"].get("unschedulable") is True

    asyncio.run(run())


def test_our_uncordon_of_a_recovered_node_admits_the_waiting_node_without_a_timer_pass() -> None:
    async def run() -> None:
        cluster = drain_cluster.DrainCluster()
        nodes = {"a1": {"pool": "a", RACK: "r1"}, "a2": {"pool": "a", RACK: "r1"}}
        spec = {**cordon_spec(), "recovery": {"uncordon": True, "healthyForSeconds": 0}}
        ctx = await drain_cluster.start(cluster, {"p": spec}, nodes)
        await drain_cluster.report(cluster, ctx, "a1", ecc=1)
        await drain_cluster.report(cluster, ctx, "a2", ecc=1)
        assert not cluster.nodes["a2"]["spec"].get("unschedulable")
        await drain_cluster.report(cluster, ctx, "a1", ecc=0)  # repaired: uncordoned by its own pass
        assert not cluster.nodes["a1"]["spec"].get("unschedulable")
        assert cluster.nodes["a2"]["spec"].get("unschedulable") is True

    asyncio.run(run())
