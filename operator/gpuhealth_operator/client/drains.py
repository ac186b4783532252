"""The drains this process runs, and the one owner of their bookkeeping.

Per node: the running task, the policy whose drain it is (what `stopping` asks
whether to stop it, so every drain started records it), how the last drain
ended, when a Drained node's pods were last looked at, and a NodeDrained
message whose Event was refused. Each way a drain ends for the operator is one
method here, so no caller pops some of these and forgets the others:

- `start`: a drain begins (the first, or again on a Drained node a pod came to);
- `finished`: it ended, completed or not;
- `handed_over`: the cordon changed owner (a deleted policy's, adopted): the
  next drain starts afresh, while a running one is left to `stopping`;
- `stop`: the cordon it belonged to is gone (uncordoned by us or a human);
- `forget_node` / `forget_policy`: the node or the policy is gone.

Nothing here survives a restart: the Node's `drain-started` annotation and the
GPUNode's `status.action` say where a drain stood (`remediation`).
"""

from __future__ import annotations

import asyncio

from gpuhealth_operator.client import drain


class Drains:
    """node → its drain in this process; `name in drains` while a task is kept for it."""

    def __init__(self) -> None:
        self.tasks: dict[str, asyncio.Task[drain.Result]] = {}
        """node → the drain running (or last run) in this process."""
        self.policies: dict[str, str] = {}
        """node → the policy whose drain runs (or ran) there."""
        self.results: dict[str, drain.Result] = {}
        """node → how its last drain in this process ended (cleared whenever the node is schedulable)."""
        self.checked: dict[str, float] = {}
        """node → when (monotonic) its pods were last looked at while Drained, so new ones are drained too."""
        self.unsaid: dict[str, str] = {}
        """node → the NodeDrained message of a completed drain whose Event was refused: said again each
        time the Drained node is looked at again. The node is Drained all the same (an Event is a report)."""

    def __contains__(self, name: object) -> bool:
        return name in self.tasks

    def __len__(self) -> int:
        return len(self.tasks)

    def running(self, name: str) -> bool:
        task = self.tasks.get(name)
        return task is not None and not task.done()

    def start(self, name: str, policy: str, task: asyncio.Task[drain.Result]) -> None:
        """`policy`'s drain of the node begins: what an earlier one ended with no longer stands."""
        self.results.pop(name, None)
        self.unsaid.pop(name, None)
        self.tasks[name] = task
        self.policies[name] = policy

    def finished(self, name: str, result: drain.Result, *, unsaid: str | None = None) -> None:
        """The node's drain ended; `unsaid`: a completed drain's NodeDrained Event was refused."""
        if unsaid is not None:
            self.unsaid[name] = unsaid
        self.results[name] = result

    def said(self, name: str) -> None:
        """The NodeDrained Event that was refused has been said."""
        self.unsaid.pop(name, None)

    def looked(self, name: str, at: float) -> None:
        """A Drained node's pods were looked at (monotonic `at`)."""
        self.checked[name] = at

    def handed_over(self, name: str) -> None:
        """The node's cordon changed owner: its last drain's end no longer stands, the new owner drains."""
        self.results.pop(name, None)
        self.unsaid.pop(name, None)

    def stop(self, name: str) -> None:
        """The cordon the drain belonged to is gone: cancel it and forget how it ended."""
        task = self.tasks.pop(name, None)
        if task is not None:
            task.cancel()
        self.results.pop(name, None)
        self.checked.pop(name, None)
        self.unsaid.pop(name, None)

    def forget_node(self, name: str) -> None:
        self.stop(name)
        self.policies.pop(name, None)

    def forget_policy(self, name: str) -> None:
        """The policy is gone; its drains were stopped (`stopping.stop_drains`)."""
        for node in [n for n, policy in self.policies.items() if policy == name]:
            del self.policies[node]

    def cancel_all(self) -> None:
        for task in self.tasks.values():
            task.cancel()
