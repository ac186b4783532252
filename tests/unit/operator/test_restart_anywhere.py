"""Restart anywhere (issue 45): for each scripted lifecycle, an operator restarted from the same cluster after
any event of the story ends it as the uninterrupted run does.

A restart is a new process (`restart_world.start_process`: module stores emptied, a new Context primed
from the cluster, kopf's first policy listing, a first full timer pass). After every event of a story the
world plays the watches and runs the passes to the end, so the story is deterministic. At the end the
test compares what a user sees (`restart_world.seen_by_users`): each Node's gpuhealth.io labels,
annotations, taints, unschedulable and GPUHealthy condition; the GPUNode status the operator writes; the
Jobs created (by name, each exactly once) and left; the DeviceTaintRules created and left; and the Events
by (reason, node), counted (a restart that says a decision again bumps a count). Timestamps are left
out: a restarted process acts at its first (full) timer pass, which may come before the uninterrupted
run's next pass over the node; what it decides must not differ. Every run must also leave no unfinished
step Job whose Node is gone or newer than the Job (`restart_world.orphans`).

The same stories run again with a new term of the same process instead (a leader that lost its Lease
and won it back: the cache and module stores kept). A case that fails today for a known reason another
branch fixes is a strict xfail naming it (`KNOWN`): it flips to a failure the day the fix merges, to be
unmarked then. `test_every_module_level_store_is_reset_or_a_constant` keeps the new process honest: a
module-level store added to the operator later must be emptied by `restart_world.fresh_process`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import importlib
import itertools
import pkgutil
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest

import gpuhealth_api
import gpuhealth_operator
import restart_world
from gpuhealth_api import keys
from gpuhealth_operator.compact import interning

World = restart_world.World
FAULT = {0: {"ecc": {"uncorrectedVolatile": 2}}}


@dataclasses.dataclass(frozen=True)
class Event:
    what: str
    act: Callable[[World], Awaitable[None]]

    async def __call__(self, world: World) -> None:
        await self.act(world)


def policy(name: str, spec: Mapping[str, Any]) -> Event:
    return Event(f"policy {name}", lambda w: w.policy(name, spec))


def node(name: str, labels: Mapping[str, str] | None = None) -> Event:
    return Event(f"node {name} joins", lambda w: w.add_node(name, labels))


def report(name: str, overrides: Any = None, what: str = "healthy", **kw: Any) -> Event:
    return Event(f"{name} reports {what}", lambda w: w.report(name, overrides, **kw))


def tick(seconds: float = 1.0, times: int = 1) -> Event:
    return Event(f"{times}x{seconds:g}s", lambda w: w.tick(seconds, times))


def end(name: str, action: str, ok: bool = True) -> Event:
    return Event(
        f"{action} Job of {name} {'succeeds' if ok else 'fails'}", lambda w: w.end_job(name, action, ok=ok)
    )


def label(name: str, labels: Mapping[str, str | None]) -> Event:
    def edit(body: dict[str, Any]) -> None:
        held = body["metadata"].setdefault("labels", {})
        for key, value in labels.items():
            if value is None:
                held.pop(key, None)
            else:
                held[key] = value

    return Event(f"{name} labelled {dict(labels)}", lambda w: w.edit_node(name, edit))


def uncordon(name: str) -> Event:
    def edit(body: dict[str, Any]) -> None:
        body["spec"]["unschedulable"] = False

    return Event(f"a human uncordons {name}", lambda w: w.edit_node(name, edit))


def reboot(name: str) -> Event:
    async def act(world: World) -> None:
        world.reboot(name)

    return Event(f"{name} reboots", act)


def delete(name: str) -> Event:
    return Event(f"node {name} deleted", lambda w: w.delete_node(name))


# --- the policies ----------------------------------------------------------------------------------------

ECC_DRAIN = {"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}
RESET_STEP = {"name": "reset", "action": "ResetGPU", "timeoutSeconds": 300}
REBOOT_STEP = {"name": "reboot", "action": "RebootNode", "timeoutSeconds": 1800}
REPAIR_SPEC: dict[str, Any] = {
    "steps": [RESET_STEP, REBOOT_STEP],
    "validation": {"timeoutSeconds": 900},
    "maxConcurrent": 1,
}
REPAIR: dict[str, Any] = {
    "rules": [ECC_DRAIN],
    "drain": {"timeoutSeconds": 600, "force": True},
    "recovery": {"uncordon": True, "healthyForSeconds": 3600},  # a validated node returns at once
    "repair": REPAIR_SPEC,
}
RESET_ONLY = {**REPAIR, "repair": {**REPAIR_SPEC, "steps": [RESET_STEP]}}
ISOLATE = {
    "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}],
    "isolation": {"maxGPUsPerNode": 2},
    "recovery": {"uncordon": True, "healthyForSeconds": 30},
}
DOMAIN = {
    "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Taint"}],
    "recovery": {"uncordon": True, "healthyForSeconds": 30},
    "topology": {"domains": [{"key": "rack", "unhealthy": 2, "action": "Label"}]},
}
NEW_NODES = {
    "rules": [ECC_DRAIN],
    "repair": {**REPAIR_SPEC, "validation": {"timeoutSeconds": 900, "newNodes": True}},
}
MAINTENANCE = {
    "rules": [{"name": "lost", "condition": "GPULost", "action": "Drain"}, ECC_DRAIN],
    "recovery": {"uncordon": True, "healthyForSeconds": 0},
}
LINKS = {
    "rules": [
        {"name": "nvlink", "condition": "NvLinkDegraded", "action": "Taint"},
        {"name": "nic", "condition": "NicDegraded", "action": "Taint"},
    ],
    "recovery": {"uncordon": True, "healthyForSeconds": 30},
}

UPGRADE = keys.GPU_DRIVER_UPGRADE_STATE_LABEL
NVLINK_UP = {
    i: {"nvlink": {"linksUp": 18, "linksDown": 0, "crcErrors": 0, "replayErrors": 0, "recoveryErrors": 0}}
    for i in range(8)
}
NVLINK_DOWN = {
    **NVLINK_UP,
    2: {"nvlink": {"linksUp": 17, "linksDown": 1, "crcErrors": 0, "replayErrors": 0, "recoveryErrors": 0}},
}


def nics(state: str) -> dict[str, Any]:
    port = {
        "name": "mlx5_0",
        "port": 1,
        "state": state,
        # DOWN while polling: a cable, a peer or a switch port gone (an administrator's Disabled is benign)
        "physState": "LinkUp" if state == "ACTIVE" else "Polling",
        "rateGbps": 400,
        "linkDowned": 0,
        "symbolErrors": 0,
        "rcvErrors": 0,
    }
    return {"nics": [port]}


# --- the stories -----------------------------------------------------------------------------------------

STORIES: dict[str, list[Event]] = {
    "repair-return": [
        policy("p", REPAIR),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("n", "ResetGPU"),
        tick(),
        report("n"),
        tick(),
        end("n", "Validation"),
        tick(times=3),
    ],
    "repair-reboot-return": [
        policy("p", REPAIR),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("n", "ResetGPU"),
        tick(),
        report("n", FAULT, "the fault still"),
        tick(),
        reboot("n"),
        end("n", "RebootNode"),
        report("n", what="healthy after the reboot"),
        tick(),
        end("n", "Validation"),
        tick(times=3),
    ],
    "retire": [
        policy("p", RESET_ONLY),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("n", "ResetGPU"),
        tick(),
        report("n"),
        tick(),
        end("n", "Validation", ok=False),
        tick(times=3),
    ],
    "isolate-restore": [
        policy("p", ISOLATE),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        report("n"),
        tick(10, times=4),
        report("n"),
        tick(times=3),
    ],
    "domain-mark-clear": [
        policy("p", DOMAIN),
        node("a", {"rack": "r1"}),
        node("b", {"rack": "r1"}),
        node("c", {"rack": "r1"}),
        report("a", FAULT, "an uncorrectable ECC error"),
        report("b", FAULT, "an uncorrectable ECC error"),
        tick(),
        report("a"),
        report("b"),
        tick(10, times=4),
        tick(times=3),
    ],
    "new-node-validation": [
        policy("p", NEW_NODES),
        tick(),
        node("n"),
        tick(times=3),
        end("n", "Validation"),
        tick(times=3),
    ],
    "maintenance": [
        policy("p", MAINTENANCE),
        node("n"),
        label("n", {UPGRADE: "pod-restart-required"}),
        report("n", gpus=0, what="no GPUs (the driver unloaded)"),
        tick(10),
        report("n", what="its GPUs back"),
        label("n", {UPGRADE: "upgrade-done"}),
        tick(10, times=7),
        tick(times=2),
    ],
    # Issue 45 item 7: the most links up and the port ACTIVE were seen by this process only.
    "nvlink-down": [
        policy("p", LINKS),
        node("n"),
        report("n", NVLINK_UP, "every NVLink up"),
        report("n", NVLINK_DOWN, "an NVLink down"),
        tick(),
        report("n", NVLINK_DOWN, "an NVLink still down"),
        tick(10, times=4),
        report("n", NVLINK_DOWN, "an NVLink still down"),
        tick(times=2),
    ],
    "nic-port-down": [
        policy("p", LINKS),
        node("n"),
        report("n", extra=nics("ACTIVE"), what="its NIC port ACTIVE"),
        report("n", extra=nics("DOWN"), what="its NIC port DOWN"),
        tick(),
        report("n", extra=nics("DOWN"), what="its NIC port still DOWN"),
        tick(10, times=4),
        report("n", extra=nics("DOWN"), what="its NIC port still DOWN"),
        tick(times=2),
    ],
    # A human, a second policy: the same paths with someone else acting too.
    "human-uncordon-mid-repair": [
        policy("p", REPAIR),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        uncordon("n"),
        tick(times=3),
        report("n", FAULT, "the fault still"),
        tick(times=2),
    ],
    "excluded-mid-repair": [
        policy("p", REPAIR),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        label("n", {keys.EXCLUDE_LABEL: "true"}),
        tick(times=3),
        label("n", {keys.EXCLUDE_LABEL: None}),
        tick(times=3),
    ],
    "retired-then-returned-by-a-human": [
        policy("p", RESET_ONLY),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("n", "ResetGPU"),
        tick(),
        report("n", FAULT, "the fault still"),
        tick(times=2),
        report("n"),
        uncordon("n"),
        tick(times=3),
    ],
    "second-policy-taints-while-the-first-repairs": [
        policy("p", REPAIR),
        policy("q", {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Taint"}]}),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("n", "ResetGPU"),
        tick(),
        report("n"),
        tick(),
        end("n", "Validation"),
        tick(times=3),
    ],
    # The budget: two faulty nodes, room for one (maxUnavailable) and one repair at a time (maxConcurrent).
    "budget-wait": [
        policy("p", {**REPAIR, "maxUnavailable": 1}),
        node("a"),
        node("b"),
        report("a", FAULT, "an uncorrectable ECC error"),
        report("b", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("a", "ResetGPU"),
        tick(),
        report("a"),
        tick(),
        end("a", "Validation"),
        tick(times=3),
        end("b", "ResetGPU"),
        tick(),
        report("b"),
        tick(),
        end("b", "Validation"),
        tick(times=3),
    ],
    "repair-wait": [
        policy("p", REPAIR),
        node("a"),
        node("b"),
        report("a", FAULT, "an uncorrectable ECC error"),
        report("b", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("a", "ResetGPU"),
        tick(),
        report("a"),
        tick(),
        end("a", "Validation"),
        tick(times=3),
        end("b", "ResetGPU"),
        tick(),
        report("b"),
        tick(),
        end("b", "Validation"),
        tick(times=3),
    ],
    # Issue 45 item 6: the Node goes mid-repair, one of its name comes back.
    "node-deleted-mid-repair": [
        policy("p", REPAIR),
        node("n"),
        report("n", FAULT, "an uncorrectable ECC error"),
        tick(),
        end("n", "ResetGPU"),
        tick(),
        report("n", FAULT, "the fault still"),
        tick(),
        delete("n"),
        tick(),
        node("n"),
        tick(times=3),
    ],
}


# --- what each story must come to (so that no story passes by doing nothing) ------------------------------

ENDS: dict[str, tuple[dict[str, tuple[str, str]], set[str]]] = {
    "repair-return": (
        {"n": ("Healthy", "None")},
        {"RepairSucceeded n", "ValidationPassed n", "NodeUncordoned n"},
    ),
    "repair-reboot-return": (
        {"n": ("Healthy", "None")},
        {"RepairFailed n", "RepairSucceeded n", "NodeUncordoned n"},
    ),
    "retire": ({"n": ("Healthy", "Retired")}, {"ValidationFailed n", "NodeRetired n"}),
    "isolate-restore": ({"n": ("Healthy", "None")}, {"GPUIsolated n", "GPURestored n"}),
    "domain-mark-clear": (
        {"a": ("Healthy", "None"), "c": ("Healthy", "None")},
        {"DomainDegraded p", "DomainRecovered p"},
    ),
    "new-node-validation": ({"n": ("Healthy", "None")}, {"ValidationPassed n"}),
    "maintenance": ({"n": ("Healthy", "None")}, {"GPUOperatorMaintenance n"}),
    "nvlink-down": ({"n": ("Degraded", "Tainted")}, {"NvLinkDegraded n"}),
    "nic-port-down": ({"n": ("Degraded", "Tainted")}, {"NicDegraded n"}),
    "node-deleted-mid-repair": ({"n": ("Healthy", "None")}, {"RepairStarted n"}),
    "budget-wait": (
        {"a": ("Healthy", "None"), "b": ("Healthy", "None")},
        {"DisruptionBudgetExceeded b", "NodeUncordoned b"},
    ),
    "repair-wait": ({"a": ("Healthy", "None"), "b": ("Healthy", "None")}, {"DisruptionBudgetExceeded b"}),
    "human-uncordon-mid-repair": (
        {"n": ("Unhealthy", "Overridden")},
        {"RemediationPaused n", "OverriddenByUser n"},
    ),
    "excluded-mid-repair": ({"n": ("Unhealthy", "Repairing")}, {"RemediationPaused n"}),
    "retired-then-returned-by-a-human": ({"n": ("Healthy", "None")}, {"NodeRetired n", "OverriddenByUser n"}),
    "second-policy-taints-while-the-first-repairs": (
        {"n": ("Healthy", "None")},
        {"RepairSucceeded n", "NodeUncordoned n"},
    ),
}

KNOWN: dict[tuple[str, int | None], str] = {}
"""(story, restart point) → the issue 45 item whose fix (on another branch) this case waits for."""


def known(story: str, first: int, why: str) -> None:
    for point in range(first, len(STORIES[story])):
        KNOWN[(story, point)] = why


KNOWN_IN_A_TERM = {k: v for k, v in KNOWN.items() if k[0] == "repair-wait"}
"""A new term keeps the cache and its trends, not what was said."""

_RUNS: dict[tuple[str, int | None, bool], restart_world.World] = {}


def played(story: str, restart_after: int | None, *, new_term: bool = False) -> restart_world.World:
    """The story played (each run once per test session: the stories are deterministic)."""
    key = (story, restart_after, new_term)
    if key not in _RUNS:
        _RUNS[key] = asyncio.run(restart_world.run(STORIES[story], restart_after, new_term=new_term))
    return _RUNS[key]


def differences(expected: Mapping[str, Any], got: Mapping[str, Any], where: str = "") -> list[str]:
    """Where two `seen_by_users` differ, one line each."""
    lines: list[str] = []
    for key in sorted(set(expected) | set(got)):
        a, b = expected.get(key, "<none>"), got.get(key, "<none>")
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            lines += differences(a, b, f"{where}{key}.")
        elif a != b:
            lines.append(f"{where}{key}: uninterrupted {a!r}, restarted {b!r}")
    return lines


def case(story: str, point: int | None, *, term: bool = False) -> Any:
    why = (KNOWN_IN_A_TERM if term else KNOWN).get((story, point))
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    label = "never" if point is None else f"after-{point}-{STORIES[story][point].what}"
    return pytest.param(story, point, marks=marks, id=f"{story}-{label}".replace(" ", "_"))


@pytest.mark.parametrize(("story", "point"), [case(s, None) for s in STORIES])
def test_each_story_comes_to_its_end_with_no_orphaned_job(story: str, point: int | None) -> None:
    world = played(story, point)
    seen = restart_world.seen_by_users(world)
    nodes, said = ENDS[story]
    for name, (health, action) in nodes.items():
        status = seen["gpunodes"][name]
        assert (status.get("health"), status.get("action")) == (health, action), (name, status)
    assert said <= set(seen["events"]), seen["events"]
    assert restart_world.orphans(world) == [], "a step Job outlived its Node"


@pytest.mark.parametrize(("story", "point"), [case(s, k) for s in STORIES for k in range(len(STORIES[s]))])
def test_a_restart_after_any_event_ends_the_story_as_the_uninterrupted_run(story: str, point: int) -> None:
    expected = restart_world.seen_by_users(played(story, None))
    world = played(story, point)
    got = restart_world.seen_by_users(world)
    assert differences(expected, got) == [], f"restarted after event {point} ({STORIES[story][point].what})"
    assert restart_world.orphans(world) == [], "a step Job outlived its Node"


@pytest.mark.parametrize(
    ("story", "point"), [case(s, k, term=True) for s in STORIES for k in range(len(STORIES[s]))]
)
def test_a_new_term_after_any_event_ends_the_story_as_the_uninterrupted_run(story: str, point: int) -> None:
    """A leader change back to the same process: its next term keeps the cache and the module stores."""
    expected = restart_world.seen_by_users(played(story, None))
    world = played(story, point, new_term=True)
    got = restart_world.seen_by_users(world)
    assert differences(expected, got) == [], f"a new term after event {point} ({STORIES[story][point].what})"
    assert restart_world.orphans(world) == [], "a step Job outlived its Node"


# --- a restart is a new process: every module-level store of the operator is known -------------------------

STORE_TYPES = (
    dict,
    list,
    set,
    bytearray,
    collections.deque,
    weakref.WeakKeyDictionary,
    weakref.WeakValueDictionary,
    weakref.WeakSet,
    interning.Table,
    itertools.count,
    functools._lru_cache_wrapper,
)
CONSTANT = {
    "gpuhealth_operator.state.breakers._RESTORED_STATES": "a table built at import",
    "gpuhealth_operator.state.records._DERIVATIONS": "a table built at import",
    "gpuhealth_operator.state.records._MOVING_SAMPLES": "a table built at import",
    "gpuhealth_operator.state.compaction.GPU_FIELDS": "a table built at import",
    "gpuhealth_operator.state.compaction._EMPTY_LIST": "the shared empty list (never appended to)",
    "gpuhealth_operator.state.compaction._COMPACTIONS": "a table built at import",
    "gpuhealth_operator.decisions.gpu_facts.FIELDS": "a table built at import",
    "gpuhealth_operator.decisions.overlap.LABEL_SEVERITY": "a table built at import",
    "gpuhealth_operator.decisions.overlap.HEALTH_STRENGTH": "a table built at import",
    "gpuhealth_operator.decisions.overlap.ACTION_STRENGTH": "a table built at import",
    "gpuhealth_operator.decisions.policies.DEFAULT_STEP_TIMEOUTS": "a table built at import",
    "gpuhealth_operator.decisions.severity._RANKS": "a table built at import",
    "gpuhealth_operator.decisions.healthy_reports._MOVING": "a table built at import",
    "gpuhealth_operator.decisions.signals._HEALTHY_MESSAGES": "a table built at import",
    "gpuhealth_operator.decisions.signals._HEALTHY": "a table built at import",
    "gpuhealth_operator.decisions.stragglers.STATUS_STEPS": "a table built at import",
    "gpuhealth_operator.decisions.text._NAMED": "a table built at import",
    "gpuhealth_operator.decisions.trends.RESTART_WITH": "a table built at import",
    "gpuhealth_operator.decisions.verdicts._CONDITION_LABELS": "a table built at import",
    "gpuhealth_operator.runtime.heap._libc": "the C library, the same in every process",
    "gpuhealth_operator.client.kubeconfigs._directory": "a path of the environment, the same everywhere",
    "gpuhealth_operator.runtime.reconciler.NODE_CONDITION": "a table built at import",
    "gpuhealth_operator.ladder.remediation.LESSER_ACTIONS": "a table built at import",
    **{
        f"gpuhealth_api.{name}": "a table of the contract, built at import"
        for name in (
            "conditions.BY_CONDITION",
            "conditions.DEFAULT_THRESHOLDS",
            "conditions.GPU_COUNTERS",
            "conditions.GPU_PATHS",
            "conditions.READS",
            "conditions.SIGNIFICANT_GPU_PATHS",
            "faults._NODE_WIDE_CURES",
            "status.CLOCK_EVENT_REASONS",
            "vocabulary.ACTION_ORDER",
        )
    },
    "gpuhealth_api.xid_catalogue._packaged": "the packaged XID catalogue, read once",
}
"""Module-level containers that hold no run-time state, and why."""


def module_stores() -> dict[str, object]:
    """Every module-level container of the operator's and the API's modules, by dotted name (imported
    names counted where they are defined)."""
    found: dict[str, object] = {}
    for package in (gpuhealth_operator, gpuhealth_api):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if isinstance(value, STORE_TYPES) and not name.startswith("__"):
                    found[f"{info.name}.{name}"] = value
    mentioned = {id(v) for k, v in found.items() if k in restart_world.RESET or k in CONSTANT}
    return {
        k: v for k, v in found.items() if k in restart_world.RESET or k in CONSTANT or id(v) not in mentioned
    }


def test_every_module_level_store_is_reset_or_a_constant() -> None:
    """A store added later must be emptied by `restart_world.fresh_process` (or named a constant here):
    else the restarted operator of these tests would remember what a new process cannot."""
    found = set(module_stores())
    unknown = sorted(found - set(restart_world.RESET) - set(CONSTANT))
    assert unknown == [], f"module-level stores neither reset nor constant: {unknown}"
    assert sorted((set(restart_world.RESET) | set(CONSTANT)) - found) == [], "named but gone"


def test_the_constants_stay_constant_through_every_story() -> None:
    def fingerprint() -> dict[str, str]:
        stores = module_stores()
        return {k: repr(stores[k]) for k in CONSTANT if isinstance(stores[k], dict | list | set)}

    before = fingerprint()
    for story, events in STORIES.items():
        played(story, None)
        played(story, len(events) // 2)
    after = fingerprint()
    assert [k for k in before if before[k] != after[k]] == [], "a 'constant' written at run time: a store"
