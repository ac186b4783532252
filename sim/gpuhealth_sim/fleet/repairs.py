"""The simulated fleet's repair executor: what a GPU node does with gpu-health's repair Jobs.

The operator repairs a node by running Jobs on it (a GPU reset, a reboot, a
validation; DESIGN.md "Repair"). On the local control plane no kubelet runs
their containers: kwok starts their pods (Running) but, unlike other Job
pods, does not complete them (kwok-stages.yaml leaves pods labelled
`gpuhealth.io/repair-action` alone). This executor plays the node instead.
It polls the repair namespace for such pods on a node of its fleet; once one
has been Running for the step's simulated duration it looks up the node
scenario's `repair:` outcome for that attempt and

- `fixes`: does the step's effect on the simulated GPUs at the node's next
  agent turn (`ResetGPU`: the GPUs named in `GPUHEALTH_GPU_UUIDS` reset, as
  `nvidia-smi --gpu-reset` would: volatile ECC counts, pending retirements
  and the recovery action cleared, a lost GPU back, while aggregate counters,
  retired pages and remapped rows stay; `RebootNode`: every GPU reset and the
  agent restarted with a new bootId), and only then ends the pod Succeeded,
  as a real reset finishes before its container exits;
- `fails`: ends the pod Failed (exit code 1, reason Error), nothing changes;
- `noEffect`: ends the pod Succeeded, nothing changes;
- validation `pass` / `fail`: Succeeded (exit 0) / Failed (exit 1); and Failed
  whatever the scenario says where the node runs the GPU Operator's standalone
  DCGM host engine (an `nvidia.com/gpu.deploy.dcgm=true` pod) and the pod was
  not pointed at it (`GPUHEALTH_HOSTENGINE` empty): its own would be a second.

A ResetGPU pod naming a UUID that is not a GPU of the node fails as
nvidia-smi would (exit 1). The pod's end is written through the API server
(pods/status, a JSON merge patch of phase, conditions and containerStatuses),
so the Job controller sees it as from a kubelet, unless the pod went meanwhile (`podplay`, shared with
the check executor). Each pod is played once;
attempts are counted per node and action, so `ResetGPU: [fails, fixes]`
fails the first reset of a node and fixes the second.

`decide` (the outcome of one pod) and `terminal_status` (the status it
ends with) are pure; `Executor` is the I/O.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from kubernetes import client

from gpuhealth_agent import scenario, simulated
from gpuhealth_api import keys, resources, vocabulary
from gpuhealth_sim.fleet import agentpool, defaults, podplay

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE: Final = defaults.DEFAULT_REPAIR_NAMESPACE
"""Where the operator creates repair Jobs unless told otherwise (its --repair-namespace default)."""
DEFAULT_SECONDS: Final[Mapping[str, float]] = {
    vocabulary.RepairAction.RESET_GPU.value: 1.0,
    vocabulary.RepairAction.REBOOT_NODE.value: 2.0,
    vocabulary.VALIDATION_JOB: 2.0,
}
"""How long each kind of repair pod runs before the executor ends it (simulated time of the work)."""
POLL_SECONDS: Final = 0.25
EFFECT_TIMEOUT_SECONDS: Final = 30.0
"""How long to wait for the node's agent turn that performs a reset or reboot."""
FIXES, FAILS, NO_EFFECT = scenario.STEP_OUTCOMES
PASS, FAIL = scenario.VALIDATION_OUTCOMES
DCGM_LABEL: Final = "nvidia.com/gpu.deploy.dcgm"
"""The GPU Operator's operand label of its standalone DCGM host engine (`nvidia-dcgm`)."""
SECOND_HOSTENGINE: Final = (
    "a second nv-hostengine would start beside the node's (DCGM allows one per node): validation failed"
)


Outcome = podplay.Outcome
"""How one repair pod ends, and what it does to the node first (shared with the check executor)."""


def scenario_key(action: str) -> str | None:
    """The `repair:` key that says how a pod with this repair-action label ends (None: not ours)."""
    if action == vocabulary.VALIDATION_JOB:
        return scenario.VALIDATION_KEY
    return action if action in {a.value for a in vocabulary.RepairAction} else None


def decide(
    repair: scenario.Repair,
    action: str,
    attempt: int,
    requested: Sequence[str],
    node_uuids: Sequence[str],
) -> Outcome:
    """The outcome of attempt `attempt` (0: the node's first) of a repair pod doing `action`.

    `requested`: the UUIDs in its GPUHEALTH_GPU_UUIDS; `node_uuids`: the node's GPUs, by scenario index.
    """
    key = scenario_key(action)
    if key is None:
        raise ValueError(f"not a repair action: {action!r}")
    said = repair.outcome(key, attempt)
    if key == scenario.VALIDATION_KEY:
        if said == PASS:
            return Outcome(True, 0, "simulated validation passed")
        return Outcome(False, 1, "simulated validation failed")
    if action == vocabulary.RepairAction.RESET_GPU:
        unknown = [u for u in requested if u not in node_uuids]
        if unknown:
            return Outcome(False, 1, f"no GPU {unknown[0]} on this node (nvidia-smi: not found)")
    if said == FAILS:
        return Outcome(False, 1, f"simulated {action} failed")
    if said == NO_EFFECT:
        return Outcome(True, 0, f"simulated {action} ran and changed nothing")
    if action == vocabulary.RepairAction.REBOOT_NODE:
        return Outcome(True, 0, "simulated reboot: every GPU reset, a new boot", reboot=True)
    gpus = tuple(sorted({node_uuids.index(u) for u in requested}))
    said_gpus = ", ".join(str(g) for g in gpus) or "none named"
    return Outcome(True, 0, f"simulated reset of GPU {said_gpus}", reset=gpus)


def pod_env(pod: Mapping[str, Any], name: str) -> str | None:
    """The value of the first variable `name` in the pod's containers (None: not set)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == name:
                return str(env.get("value") or "")
    return None


def second_hostengine(pod: Mapping[str, Any], running: Sequence[str]) -> bool:
    """Whether a Validation pod would start a second DCGM host engine: the node runs one (`running`) and
    the pod was not pointed at it (`keys.REPAIR_HOSTENGINE_ENV` empty or absent), so its template starts
    its own, which DCGM refuses beside the node's."""
    return bool(running) and not pod_env(pod, keys.REPAIR_HOSTENGINE_ENV)


def requested_gpus(pod: Mapping[str, Any]) -> list[str]:
    """The UUIDs in the first GPUHEALTH_GPU_UUIDS of the pod's containers (comma-separated)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == keys.REPAIR_GPUS_ENV:
                return [u.strip() for u in str(env.get("value") or "").split(",") if u.strip()]
    return []


terminal_status = podplay.terminal_status


@dataclasses.dataclass(frozen=True)
class Played:
    """A repair pod the executor ended (for tests, benchmarks and the demo)."""

    time: float
    node: str
    pod: str
    action: str
    attempt: int
    outcome: Outcome


class Executor:
    """Plays the fleet's nodes for their repair pods (module docstring); a thread, `start`/`stop`."""

    def __init__(
        self,
        api_client: client.ApiClient,
        sim: agentpool.Fleet,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        seconds: Mapping[str, float] | None = None,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.sim = sim
        self.namespace = namespace
        self.seconds = {**DEFAULT_SECONDS, **(seconds or {})}
        self.poll_seconds = poll_seconds
        self.clock = clock
        self.played: list[Played] = []
        self.refused_resets = 0
        """ResetGPU pods that met a holder of the GPU (the agent, an operand pod) and failed: the bench's
        "reset Jobs started while a holder ran"."""
        self.second_hostengines = 0
        """Validation pods that would have started a second DCGM host engine beside the node's, and failed."""
        self.errors = 0
        """Pods the executor could not end (an API error, an effect that did not happen): logged."""
        self.left = 0
        """Pods that went (deleted, evicted) before their end was written: left alone."""
        self._clock = podplay.Clock()
        self._attempts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        self._loop = podplay.Loop("sim-repairs", self.poll_once, poll_seconds)
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="sim-repairs")

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _pass_release_asks(self) -> None:
        """The operator's GPU release asks (GPUNode annotation) to the simulated agents: one list for the
        fleet per poll, where a real agent watches its own GPUNode."""
        listed = self.custom.list_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL
        )
        items = listed.get("items") if isinstance(listed, dict) else None
        for item in items or []:
            meta = item.get("metadata") or {}
            name = meta.get("name", "")
            if self.sim.has_node(name):
                self.sim.ask_release(name, (meta.get("annotations") or {}).get(keys.RELEASE_GPUS_ANNOTATION))

    def holders(self, node: str) -> list[str]:
        """What holds the node's GPUs open now: its agent (NVML initialised) and the pods an operand label
        of the GPU Operator selects (`nvidia.com/gpu.deploy.<operand>=true`, not finished)."""
        found = ["gpu-health-agent"] if self.sim.has_node(node) and self.sim.holds_gpus(node) else []
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        for item in pods.items:
            pod = self.core.api_client.sanitize_for_serialization(item)
            selector = (pod.get("spec") or {}).get("nodeSelector") or {}
            finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if not finished and any(selector.get(k) == "true" for k in keys.GPU_OPERATOR_OPERAND_LABELS):
                found.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
        return found

    def hostengines(self, node: str) -> list[str]:
        """The node's running standalone DCGM host engines: pods selecting the GPU Operator's
        `nvidia.com/gpu.deploy.dcgm=true` (its `nvidia-dcgm`), not finished."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        found = []
        for item in pods.items:
            pod = self.core.api_client.sanitize_for_serialization(item)
            selector = (pod.get("spec") or {}).get("nodeSelector") or {}
            finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if not finished and selector.get(DCGM_LABEL) == "true":
                found.append(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")
        return found

    def poll_once(self) -> int:
        """Look at the repair pods once; start ending each that has run its time. Returns how many."""
        try:
            self._pass_release_asks()
        except Exception as error:  # the API server may be down a moment; the next poll tries again
            log.warning("reading the GPUNodes' release asks failed: %s", error)
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=keys.REPAIR_ACTION_LABEL)
        now = self.clock()
        started = 0
        for item in pods.items:
            pod = self.core.api_client.sanitize_for_serialization(item)
            uid = pod["metadata"].get("uid", "")
            node = (pod.get("spec") or {}).get("nodeName") or ""
            action = (pod["metadata"].get("labels") or {}).get(keys.REPAIR_ACTION_LABEL, "")
            if not podplay.playable(pod) or not self.sim.has_node(node) or scenario_key(action) is None:
                continue
            with self._lock:
                if not self._clock.due(uid, now, self.seconds.get(action, 0.0)):
                    continue
            self._pool.submit(self._end, pod, node, action)
            started += 1
        return started

    def _end(self, pod: dict[str, Any], node: str, action: str) -> None:
        name = pod["metadata"]["name"]
        key = scenario_key(action)
        assert key is not None
        with self._lock:
            attempt = self._attempts[(node, key)]
            self._attempts[(node, key)] += 1
        try:
            plan = self.sim.scenario(node)
            uuids = [simulated.gpu_uuid(node, i) for i in range(plan.gpus)]
            outcome = decide(plan.repair, action, attempt, requested_gpus(pod), uuids)
            held = self.holders(node) if action == vocabulary.RepairAction.RESET_GPU else []
            if action == vocabulary.VALIDATION_JOB and second_hostengine(pod, self.hostengines(node)):
                # DCGM allows one nv-hostengine per node: the template's own would not start.
                outcome = Outcome(False, 1, SECOND_HOSTENGINE)
                with self._lock:
                    self.second_hostengines += 1
            if held:  # nvidia-smi --gpu-reset refuses while any process has the device open
                outcome = Outcome(False, 1, f"GPU in use by {', '.join(held)} (nvidia-smi: reset refused)")
                with self._lock:
                    self.refused_resets += 1
            if outcome.reboot:
                self.sim.reboot(node).result(timeout=EFFECT_TIMEOUT_SECONDS)
            elif outcome.reset:
                self.sim.reset_gpus(node, outcome.reset).result(timeout=EFFECT_TIMEOUT_SECONDS)
            now = self.clock()
            if not podplay.end_pod(self.core, pod, outcome, now):
                with self._lock:
                    self.left += 1
                log.info("repair pod %s on %s went before it ended: left alone", name, node)
                return
        except Exception as error:
            with self._lock:
                self.errors += 1
            log.error("could not end repair pod %s/%s on %s: %s", self.namespace, name, node, error)
            return
        log.info("repair pod %s on %s (%s, attempt %d): %s", name, node, action, attempt + 1, outcome.message)
        with self._lock:
            self.played.append(Played(now, node, name, action, attempt, outcome))
