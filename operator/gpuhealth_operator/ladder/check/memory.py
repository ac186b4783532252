"""What the active-check step remembers between timer passes (`ctx.steps.check`): one object, emptied of
a node or a policy by `forget_verdicts` / `forget_node` / `forget_policy` only.

Nothing here is needed after a restart: the check Jobs in flight are listed from the cluster (adopted),
the run history is GPUNode `status.checks[]`, and idleness is seen again (a new process waits
`idleForSeconds` from its first sighting: it never checks a node whose workload it did not see end).

`pods` is a view of the cluster, not a memory of this step: the GPU pods by node as the term's watch of
pods shows them (`state/gpu_pods.py`). The forgetting of a node's verdicts or GPUNode leaves it alone
(its pods still run); the Node's deletion forgets the node there (`handlers.on_node`; not a Node that
only left the `--node-selector` pool, whose pods still run).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from gpuhealth_operator.state import gpu_pods


@dataclasses.dataclass(eq=False)
class CheckMemory:
    history: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """node → its GPUNode `status.checks[]` as this process last made it, written with the node's next
    status; absent: the status as stored is the history."""

    idle_since: dict[str, datetime.datetime] = dataclasses.field(default_factory=dict)
    """node → since when this process has seen no pod using GPUs on it (absent: one runs, or not seen)."""

    recorded: dict[str, str] = dataclasses.field(default_factory=dict)
    """check Job UID → node: runs recorded whose Job is still to be deleted (recorded once, deleted again
    until it goes). Forgotten with the node: its Jobs are owned by the Node, the garbage collector's."""

    dry_run_said: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(policy, node) → the check its DryRun "would check" Event named: said once per check due."""

    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    """node → the token of the on-demand request refused last (its annotation's removal may lag)."""

    pods: gpu_pods.GpuPods = dataclasses.field(default_factory=gpu_pods.GpuPods)
    """The pods using GPUs by node (module docstring): fed by `runtime/gpu_pod_watch.py`, read by a pass."""

    yielded: dict[str, str] = dataclasses.field(default_factory=dict)
    """check Job UID → node: DRA checks whose pod this process evicted for a pending pod (`check_yield`):
    ended Preempted at the next pass, without waiting for the pod's end (the Job's deletion ends it)."""

    no_gpus: dict[str, datetime.datetime] = dataclasses.field(default_factory=dict)
    """node → when a check last found no GPUs there that the scheduler could give it (no `nvidia.com/gpu`
    capacity, no DRA GPU device): logged once, and left out of the plan for a while (`checking`), so
    that it never takes the place of a node that can be checked."""

    in_flight: int = 0
    """Check Jobs running as the last pass counted them (none, with no policy wanting checks: no list)."""

    def forget_verdicts(self, name: str) -> None:
        """No policy selects the node now: its dry runs are said again if one does; its runs are kept
        (the history is the GPUNode's, and a check in flight still ends and is recorded)."""
        for key in [k for k in self.dry_run_said if k[1] == name]:
            del self.dry_run_said[key]

    def forget_node(self, name: str) -> None:
        self.history.pop(name, None)
        self.idle_since.pop(name, None)
        self.refused.pop(name, None)
        self.no_gpus.pop(name, None)
        for uid in [u for u, node in self.yielded.items() if node == name]:
            del self.yielded[uid]
        for uid in [u for u, node in self.recorded.items() if node == name]:
            del self.recorded[uid]
        for key in [k for k in self.dry_run_said if k[1] == name]:
            del self.dry_run_said[key]

    def forget_policy(self, name: str) -> None:
        for key in [k for k in self.dry_run_said if k[0] == name]:
            del self.dry_run_said[key]
