"""The demo's active checks: what the check pods need, and real work arriving on a node under check.

The demo fleet (examples/fleets/demo.yaml) has three idle nodes outside the training job's pool, which
the demo policy's check runs on: `PASSING` passes, `PREEMPTED`'s check runs long (`NODE_SECONDS`)
until `Arrival` starts a whole-node inference pod there, which kube-scheduler makes room for by
preempting the check (result Preempted, no failure), and `FAILING`'s fails (its scenario's `checks:`):
ActiveCheckFailed, drained, repaired and back. The demo's own backtest replays the recorded runs
(trace `check` records), so that drain is the replay's too.

The check pods' PriorityClass comes with the chart; the demo installs no chart, so it creates it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from kubernetes import client

from gpuhealth_api import keys
from gpuhealth_sim.demo import workload
from gpuhealth_sim.fleet import fleetfile

log = logging.getLogger(__name__)

PRIORITY_CLASS: Final = "gpu-health-check"
PRIORITY: Final = -100
"""As the chart's `checks.priorityClass.value`: below every workload."""
PASSING, PREEMPTED, FAILING = "gpu-node-13", "gpu-node-14", "gpu-node-15"
CHECK_SECONDS: Final = 2.0
"""How long a simulated check runs in the demo: short, so its end shows within the story."""
NODE_SECONDS: Final[Mapping[str, float]] = MappingProxyType({PREEMPTED: 120.0})
"""The check real work preempts runs until it comes (longer than the demo)."""
ARRIVAL_NAME: Final = "inference"
POLL_SECONDS: Final = 0.25


def priority_class(labels: Mapping[str, str]) -> dict[str, Any]:
    """The chart's PriorityClass of check pods (charts/gpu-health/templates/checks.yaml)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": dict(labels)},
        "value": PRIORITY,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "gpu-health demo: active checks, below every workload",
    }


def inference_pod(node: str, gpus: int) -> dict[str, Any]:
    """A whole-node pod of real work (priority 0, above the check) that wants `node`'s GPUs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": ARRIVAL_NAME, "namespace": workload.NAMESPACE, "labels": {"app": ARRIVAL_NAME}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "server",
                    "image": workload.IMAGE,
                    "resources": {
                        "requests": {keys.GPU_RESOURCE: str(gpus)},
                        "limits": {keys.GPU_RESOURCE: str(gpus)},
                    },
                }
            ],
        },
    }


def ensure_priority_class(api: client.ApiClient, labels: Mapping[str, str]) -> bool:
    """Create the PriorityClass unless one of the name exists (then it is someone's: left as it is).
    True if created here."""
    try:
        body = client.V1PriorityClass.from_dict(priority_class(labels))
        assert body is not None, "from_dict returns None only for None"
        client.SchedulingV1Api(api).create_priority_class(body)
    except client.ApiException as error:
        if error.status == 409:
            return False
        raise
    return True


class Arrival:
    """A thread: once a check pod runs on `PREEMPTED`, real work arrives there (`inference_pod`), once;
    nothing where the fleet has no such node."""

    def __init__(self, api: client.ApiClient, spec: fleetfile.Fleet, say: Callable[[str], None]) -> None:
        self.core = client.CoreV1Api(api)
        self.node = PREEMPTED
        self.gpus = next((p.gpu_count for p in spec.nodes if p.name == PREEMPTED), 0)
        self.say = say
        self.arrived = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-arrival", daemon=True)

    def start(self) -> None:
        if self.gpus:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _checking(self) -> bool:
        pods = self.core.list_pod_for_all_namespaces(
            label_selector=keys.CHECK_LABEL, field_selector=f"spec.nodeName={self.node}"
        ).items
        return any(p.status and p.status.phase == "Running" for p in pods)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._checking():
                    pod = client.V1Pod.from_dict(inference_pod(self.node, self.gpus))
                    assert pod is not None, "from_dict returns None only for None"
                    self.core.create_namespaced_pod(workload.NAMESPACE, pod)
                    self.arrived = True
                    self.say(
                        f"real work arrived on {self.node} while its check ran: the scheduler preempts it"
                    )
                    return
            except Exception as error:  # the API server busy a moment: look again
                log.warning("demo arrival on %s: %s", self.node, error)
            self._stop.wait(POLL_SECONDS)
