"""The simulated node's side of active checks: check pods end as the node scenario's `checks:` says.

On the local control plane no kubelet runs a check's container. kube-scheduler places the check pod
(it requests all the node's `nvidia.com/gpu`, in PriorityClass gpu-health-check) and kwok starts it
Running but leaves it there (kwok-stages.yaml spares pods labelled `gpuhealth.io/check`). The
`Executor` plays the node: it polls for check pods bound to a node of its fleet and, once one has been
Running for the check's simulated duration, ends it as `decide` says for the pod's template label
(attempts counted per node and template, as repairs count theirs): `pass` exits 0, `fail` exits 1,
figures exit 0 with the JSON object of the figures as the termination message, which the operator reads
(`decisions.checks.figures_of`). The end is written as a kubelet would (`podplay.end_pod`).

Preemption is not scripted: kube-scheduler preempts a check pod for a workload that wants its GPUs, and
a pod preempted or deleted meanwhile is left alone (`left`), never ended and never an attempt.

`decide` is pure; `Executor` is the I/O.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kubernetes import client

from gpuhealth_agent import scenario
from gpuhealth_api import keys
from gpuhealth_sim.fleet import agentpool, podplay

log = logging.getLogger(__name__)

DEFAULT_SECONDS: Final = 3.0
"""How long a check pod runs before the executor ends it: a real DCGM level 1 takes about a minute, the
simulated one is short so that demos and tests see checks end (`seconds` to change it)."""
POLL_SECONDS: Final = 0.25


def decide(checks: scenario.Checks, template: str, attempt: int) -> podplay.Outcome:
    """The end of attempt `attempt` (0: the node's first) of a check pod from template `template`."""
    said = checks.outcome(template, attempt)
    if not said.passed:
        return podplay.Outcome(False, 1, f"simulated check {template} failed")
    if said.figures:
        return podplay.Outcome(True, 0, json.dumps(dict(said.figures), sort_keys=True))
    return podplay.Outcome(True, 0, "")


@dataclasses.dataclass(frozen=True)
class Played:
    """A check pod the executor ended (for tests, benchmarks and the demo)."""

    time: float
    node: str
    pod: str
    template: str
    attempt: int
    outcome: podplay.Outcome


class Executor:
    """Plays the fleet's nodes for their check pods (module docstring); a thread, `start`/`stop`.

    `namespace`: where the check Jobs run; None looks in every namespace (the operator's check namespace
    is its own setting, and a check pod is known by its label, not its namespace).
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        sim: agentpool.Fleet,
        *,
        namespace: str | None = None,
        seconds: float = DEFAULT_SECONDS,
        node_seconds: Mapping[str, float] | None = None,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.core = client.CoreV1Api(api_client)
        self.sim = sim
        self.namespace = namespace
        self.seconds = seconds
        self.node_seconds = dict(node_seconds or {})
        """Nodes whose checks take other than `seconds` (the demo: a check that real work preempts)."""
        self.clock = clock
        self.played: list[Played] = []
        self.left = 0
        """Check pods that went (preempted, deleted) before their end was written: left alone."""
        self.errors = 0
        """Pods the executor could not end (an API error): logged."""
        self._clock = podplay.Clock()
        self._attempts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.Lock()
        self._loop = podplay.Loop("sim-checks", self.poll_once, poll_seconds)
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="sim-checks")

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _list(self) -> list[client.V1Pod]:
        if self.namespace is None:
            return list(self.core.list_pod_for_all_namespaces(label_selector=keys.CHECK_LABEL).items)
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=keys.CHECK_LABEL).items)

    def poll_once(self) -> int:
        """Look at the check pods once; start ending each that has run its time. Returns how many."""
        now = self.clock()
        started = 0
        for item in self._list():
            pod = self.core.api_client.sanitize_for_serialization(item)
            node = (pod.get("spec") or {}).get("nodeName") or ""
            template = (pod["metadata"].get("labels") or {}).get(keys.CHECK_TEMPLATE_LABEL, "")
            if not podplay.playable(pod) or not self.sim.has_node(node) or not template:
                continue
            with self._lock:
                seconds = self.node_seconds.get(node, self.seconds)
                if not self._clock.due(pod["metadata"].get("uid", ""), now, seconds):
                    continue
            self._pool.submit(self._end, pod, node, template)
            started += 1
        return started

    def _end(self, pod: dict[str, Any], node: str, template: str) -> None:
        name = pod["metadata"]["name"]
        try:
            with self._lock:
                attempt = self._attempts[(node, template)]
            outcome = decide(self.sim.scenario(node).checks, template, attempt)
            now = self.clock()
            if not podplay.end_pod(self.core, pod, outcome, now):
                with self._lock:
                    self.left += 1
                log.info("check pod %s on %s went before it ended (preempted?): left alone", name, node)
                return
        except Exception as error:
            with self._lock:
                self.errors += 1
            log.error("could not end check pod %s on %s: %s", name, node, error)
            return
        log.info("check pod %s on %s (%s, attempt %d): %s", name, node, template, attempt + 1, outcome.phase)
        with self._lock:
            # Counted once ended: a preempted pod is no attempt (the scenario's list is per run to an end).
            self._attempts[(node, template)] += 1
            self.played.append(Played(now, node, name, template, attempt, outcome))
