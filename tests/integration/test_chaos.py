"""Chaos: the operator and the API server are SIGKILLed at random while faults arrive; the invariant holds.

Twenty Nodes, one workload pod each. Half of them suffer a double-bit ECC
error at a random moment; the policy drains them with maxUnavailable=5, and
the test "repairs" a node (the agent reports a reset GPU) once it is
cordoned and empty, so the policy uncordons it and the next one gets its
place. Meanwhile, at random moments, the operator is SIGKILLed and started
again (same identity, as a restarted container), and the kube-apiserver is
SIGKILLed and started again. A watch of our own records every Node change
(reconnecting after API-server restarts) to sample the budget.

At the end: every fatal node was cordoned once (one cordon transition, one
NodeCordoned Event with count 1), drained once (one NodeDrained Event with
count 1; its pod gone, asked to leave by eviction and accepted at most once),
and uncordoned; no healthy
node was ever unschedulable, told anything, or lost its pod; and never more
than five nodes were unschedulable at once. Every violation is reported at
once. The randomness is seeded: the seed is printed, and CHAOS_SEED=<seed>
replays the same schedule (not the same timing of the processes).

Each run plays a fresh random seed and, beside it, the fixed REGRESSION_SEEDS:
a schedule that once broke the invariant is replayed on every run, not only
when someone happens to draw it again.
"""

import dataclasses
import json
import os
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

NODES = 20
FATAL = 10
MAX_UNAVAILABLE = 5
FAULT_WINDOW_SECONDS = 20.0
"""Faults arrive within this; kills happen within twice this."""
REPAIR_SECONDS = (3.0, 10.0)
"""A drained node is repaired this long (at random) after the test sees it empty."""
OPERATOR_KILLS = 3
APISERVER_KILLS = 2
FINISH_SECONDS = 75.0
"""After the fault window, every fatal node has gone through cordon, drain and repair within this."""
ECC = {2: {"ecc": {"uncorrectedVolatile": 1}}}
REGRESSION_SEEDS = (7947, 3838)
"""Replayed on every run. Add each seed a run reports as broken (the assertion names it), with why.
No failing seed was written down before this list existed; these two are the schedules of the
failure modes the chaos fixes were about, picked from the first 20,000 seeds by `Chaos.draw`:
7947 SIGKILLs the operator and the API server within 5 ms of each other while faults still
arrive (a restart that meets no API server, a kill of a client mid-eviction); 3838 SIGKILLs the
operator three times within 0.3 s, 8 s in (a SIGKILL during interpreter start-up, a restart
before the Lease expired). Not listed: 3441685228, which broke only on a starved machine (the
operator killed between its last eviction and NodeDrained, the node repaired before any term looked
again); its break is replayed exactly by a unit test (`test_drained_without_events`)."""
OPERATOR_ARGS = [
    "--tick-seconds=0.5",
    "--lease-duration-seconds=4",
    "--lease-renew-deadline-seconds=2.5",
    "--lease-retry-seconds=0.5",
]


@pytest.fixture
def fleet(k8s: client.ApiClient) -> Iterator[operator_harness.Fleet]:
    with operator_harness.Fleet(k8s, label=f"chaos-{secrets.token_hex(3)}") as nodes:
        yield nodes


operator = operator_fixtures.operator_fixture("chaos", OPERATOR_ARGS, scope="function", lead=False)


class NodeRecorder:
    """In a thread: every change of the fleet's Nodes, through API-server restarts (re-list, then watch)."""

    def __init__(self, plane: local.ControlPlane, label: str) -> None:
        self.plane = plane
        self.selector = f"{operator_harness.Fleet.LABEL_KEY}={label}"
        self.unschedulable: dict[str, bool] = {}
        self.cordons: dict[str, int] = {}
        """node → how many times it was seen turning unschedulable."""
        self.most = 0
        """The most nodes seen unschedulable at once."""
        self.most_at: list[str] = []
        self.samples = 0
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "NodeRecorder":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(15)

    def _see(self, name: str, unschedulable: bool) -> None:
        if unschedulable and not self.unschedulable.get(name, False):
            self.cordons[name] = self.cordons.get(name, 0) + 1
        self.unschedulable[name] = unschedulable
        self.samples += 1
        now = sorted(n for n, u in self.unschedulable.items() if u)
        if len(now) > self.most:
            self.most, self.most_at = len(now), now

    def _run(self) -> None:
        while not self.stopping.is_set():
            api = self.plane.api_client()
            try:
                core = client.CoreV1Api(api)
                listed = core.list_node(label_selector=self.selector)
                for item in listed.items:
                    self._see(item.metadata.name, bool(item.spec.unschedulable))
                version = listed.metadata.resource_version
                while not self.stopping.is_set():
                    for event in watch.Watch().stream(
                        core.list_node,
                        label_selector=self.selector,
                        resource_version=version,
                        timeout_seconds=2,
                    ):
                        node = event["object"]
                        version = node.metadata.resource_version
                        if event["type"] == "DELETED":
                            self.unschedulable.pop(node.metadata.name, None)
                        else:
                            self._see(node.metadata.name, bool(node.spec.unschedulable))
            except Exception:  # the API server is down or the history is gone: list again
                time.sleep(0.1)
            finally:
                api.close()  # type: ignore[no-untyped-call]


@dataclasses.dataclass
class Chaos:
    """What happens when, drawn from the seed."""

    faults: dict[str, float]
    """fatal node → seconds into the run its GPU's DBE is reported."""
    kills: list[tuple[float, str]]
    """(seconds into the run, "operator" | "apiserver")."""
    repairs: dict[str, float]
    """fatal node → seconds from when it is seen drained to its repair."""

    @classmethod
    def draw(cls, seed: int, fatal: list[str]) -> "Chaos":
        rng = random.Random(seed)
        faults = {name: rng.uniform(0, FAULT_WINDOW_SECONDS) for name in fatal}
        kills = [(rng.uniform(2, 2 * FAULT_WINDOW_SECONDS), "operator") for _ in range(OPERATOR_KILLS)]
        kills += [(rng.uniform(5, 2 * FAULT_WINDOW_SECONDS), "apiserver") for _ in range(APISERVER_KILLS)]
        repairs = {name: rng.uniform(*REPAIR_SECONDS) for name in fatal}
        return cls(faults, sorted(kills), repairs)


def quietly(action: Callable[[], Any]) -> bool:
    """One attempt of something that may meet the API server down: True once it went through."""
    try:
        action()
    except Exception:  # the API server is down or restarting: try again later
        return False
    return True


def holds(check: Callable[[], bool]) -> bool:
    """Whether the check is true now; False while the API server cannot answer it."""
    try:
        return check()
    except Exception:  # the API server is down or restarting
        return False


def leads_again(operator: operator_harness.OperatorProcess) -> bool:
    """Whether the operator (perhaps just restarted by the last kill) leads within a while."""
    try:
        waiting.wait_until(operator.is_leading, timeout_seconds=30, message="the operator leads")
    except TimeoutError:
        return False
    return True


def pod_names(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    """node → its pod that still exists (not being deleted)."""
    pods = core.list_namespaced_pod(namespace).items
    return {p.spec.node_name: p.metadata.name for p in pods if p.metadata.deletion_timestamp is None}


def event_counts(fleet: operator_harness.Fleet, name: str, reason: str) -> int:
    return sum(int(e.get("count") or 1) for e in fleet.events(name, reason))


def evictions(plane: local.ControlPlane, namespace: str) -> dict[str, list[int | None]]:
    """pod → the status code of every eviction of it the API server received, from its audit log.

    A request whose client was SIGKILLed may be audited with an error code although the pod went; one
    received by an API server SIGKILLed before it answered has no code (None), and the pod may be gone.
    """
    received: dict[str, str] = {}  # auditID → pod
    answered: dict[str, int] = {}  # auditID → code
    for line in plane.audit_log.read_text().splitlines():
        entry: dict[str, Any] = json.loads(line)
        ref = entry.get("objectRef") or {}
        if (
            entry.get("verb") != "create"
            or ref.get("subresource") != "eviction"
            or ref.get("namespace") != namespace
        ):
            continue
        received[entry["auditID"]] = ref["name"]
        if entry.get("stage") == "ResponseComplete":
            answered[entry["auditID"]] = int((entry.get("responseStatus") or {}).get("code", 0))
    codes: dict[str, list[int | None]] = {}
    for audit_id, pod in received.items():
        codes.setdefault(pod, []).append(answered.get(audit_id))
    return codes


@pytest.mark.parametrize(
    "fixed_seed",
    [*REGRESSION_SEEDS, None],
    ids=[*(f"seed-{s}" for s in REGRESSION_SEEDS), "random"],
)
def test_random_kills_of_operator_and_api_server_never_break_the_invariant(
    crds: local.ControlPlane,
    k8s: client.ApiClient,
    operator: operator_harness.OperatorProcess,
    fleet: operator_harness.Fleet,
    namespace: str,
    fixed_seed: int | None,
) -> None:
    drawn = int(os.environ.get("CHAOS_SEED") or secrets.randbits(32))
    seed = drawn if fixed_seed is None else fixed_seed
    print(f"chaos seed {seed} (replay with CHAOS_SEED={seed})")
    names = [f"{fleet.label}-{i:02d}" for i in range(NODES)]
    fatal = sorted(random.Random(seed).sample(names, FATAL))
    healthy = sorted(set(names) - set(fatal))
    chaos = Chaos.draw(seed, fatal)
    print(f"faults {chaos.faults}; kills {chaos.kills}")
    core = client.CoreV1Api(k8s)
    for name in names:
        fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": MAX_UNAVAILABLE,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
            "drain": {"force": True, "timeoutSeconds": 30},
            "recovery": {"uncordon": True, "healthyForSeconds": 1},
        },
    )
    for name in names:
        pod = client.V1Pod.from_dict(
            {
                "metadata": {"name": f"work-{name}", "namespace": namespace},
                "spec": {
                    "nodeName": name,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                    "terminationGracePeriodSeconds": 0,
                },
            }
        )
        assert pod is not None
        core.create_namespaced_pod(namespace, pod)
    waiting.wait_until(operator.is_leading, timeout_seconds=30, message="operator leads")
    recorder = NodeRecorder(crds, fleet.label).start()
    try:
        run(crds, operator, fleet, namespace, chaos, seed)
    finally:
        recorder.stop()

    evicted = evictions(crds, namespace)
    print(f"most nodes unschedulable at once: {recorder.most} {recorder.most_at}; {recorder.samples} samples")
    assert recorder.samples > NODES, "the recorder saw the changes"
    remaining = pod_names(core, namespace)
    broken: list[str] = []  # every violation at once: one run tells the whole story
    if recorder.most > MAX_UNAVAILABLE:
        broken.append(f"budget exceeded: {recorder.most_at} unschedulable at once")
    for name in fatal:
        found = {
            "cordons seen": recorder.cordons.get(name, 0),
            "NodeCordoned": event_counts(fleet, name, "NodeCordoned"),
            "NodeDrained": event_counts(fleet, name, "NodeDrained"),
        }
        broken += [f"fatal {name}: {what} {count}, not 1" for what, count in found.items() if count != 1]
        codes = evicted.get(f"work-{name}", [])
        if not codes or sum(code is not None and 200 <= code < 300 for code in codes) > 1:
            broken.append(
                f"fatal {name}: its pod's evictions were answered {codes} (None: the API server died first): "
                "not evicted exactly once"
            )
        if recorder.unschedulable.get(name) or name in remaining:
            broken.append(f"fatal {name}: still cordoned or its pod still there")
    for name in healthy:
        if name in recorder.cordons or event_counts(fleet, name, "NodeCordoned"):
            broken.append(f"healthy {name} was cordoned")
        if f"work-{name}" in evicted or remaining.get(name) != f"work-{name}":
            broken.append(f"healthy {name} lost its pod")
    if not leads_again(operator):
        broken.append("the operator does not lead again")
    elif operator.stop() != 0:
        broken.append("the operator did not exit cleanly on SIGTERM")
    assert not broken, f"chaos seed {seed} (replay with CHAOS_SEED={seed}): " + "; ".join(broken)


def run(
    plane: local.ControlPlane,
    operator: operator_harness.OperatorProcess,
    fleet: operator_harness.Fleet,
    namespace: str,
    chaos: Chaos,
    seed: int,
) -> None:
    """Play the schedule: faults as the agents report them, kills, and repairs of drained nodes."""
    started = time.monotonic()
    kills = list(chaos.kills)
    unreported = dict(chaos.faults)
    repaired: set[str] = set()
    drained: dict[str, float] = {}
    deadline = started + FAULT_WINDOW_SECONDS + FINISH_SECONDS
    core = fleet.core
    while len(repaired) < len(chaos.faults) or unreported or kills:
        now = time.monotonic() - started
        assert time.monotonic() < deadline, (
            f"not done in time (chaos seed {seed}): repaired {sorted(repaired)} of {sorted(chaos.faults)}"
        )
        if kills and kills[0][0] <= now:
            _, what = kills.pop(0)
            print(f"{now:.1f}s: SIGKILL {what}")
            if what == "operator":
                operator.kill()
                operator.start()
            else:
                plane.kill_apiserver()
                plane.start_apiserver()
            continue
        for name, at in sorted(unreported.items()):
            if at <= now and quietly(
                lambda name=name: fleet.report(name, gpunode_facts.agent_status(overrides=ECC))
            ):
                del unreported[name]
        try:
            pods = pod_names(core, namespace)
        except Exception:  # the API server is down or restarting
            time.sleep(0.2)
            continue
        for name in sorted(set(chaos.faults) - set(unreported) - repaired):
            # Cordoned and empty: the node is drained; a while later its GPU is reset (the volatile ECC
            # count is 0 again).
            if name not in drained and name not in pods and holds(lambda name=name: _cordoned(fleet, name)):
                drained[name] = now
                print(f"{now:.1f}s: {name} drained")
            if (
                name in drained
                and now - drained[name] >= chaos.repairs[name]
                and quietly(lambda name=name: fleet.report(name, gpunode_facts.agent_status()))
            ):
                repaired.add(name)
                print(f"{now:.1f}s: repaired {name}")
        time.sleep(0.2)
    waiting.wait_until(
        lambda: not any(_cordoned(fleet, n) for n in chaos.faults),
        timeout_seconds=30,
        message=f"every repaired node uncordoned (chaos seed {seed})",
    )


def _cordoned(fleet: operator_harness.Fleet, name: str) -> bool:
    return bool(fleet.node(name)["spec"].get("unschedulable"))
