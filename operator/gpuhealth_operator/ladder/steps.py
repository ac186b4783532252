"""The ladder's steps, registered once: what the timer runs of each, in order.

Every second the timer (`runtime/ticker.py`) judges the due nodes and walks them down the ladder
(`remediation`); then it gives each step below its timer sweep, in this order: what time alone
changes for that step (a breaker's announcement, a repair that must stop, a new node to validate,
a Job whose Node went, the active checks ended and started, a deleted policy's DeviceTaintRules,
a domain's recovery). A sweep returns
the nodes whose GPUNode status must be written after it (a cancelled repair's history: no pass may
write it), or None.

A new ladder step is its package plus its row here (and, if it remembers anything between passes,
its memory's field in `ladder/memories.py`, which `Context.forget_node` / `forget_policy` walk).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Awaitable, Callable, Iterable

from gpuhealth_operator.ladder.check import checking
from gpuhealth_operator.ladder.cordon import pausing
from gpuhealth_operator.ladder.domain import domain_actions
from gpuhealth_operator.ladder.isolate import isolation_sweep
from gpuhealth_operator.ladder.new_nodes import new_nodes
from gpuhealth_operator.ladder.repair import orphan_jobs, repairing
from gpuhealth_operator.shared import context


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    """One timer pass, as a sweep sees it."""

    now: datetime.datetime
    full: bool
    """Every node judged (`--full-pass-seconds`): stale ones swept too."""
    refresh: bool
    """The periodic part that is not judging (drifted marks put back)."""
    write: Callable[[context.Context, str], Awaitable[None]]
    """Writes a node's operator status with the histories this process made (`reconciler.write_history`),
    for a step that records a run mid-sweep (the active checks)."""


Sweep = Callable[[context.Context, Tick], Awaitable[Iterable[str] | None]]
"""A step's timer sweep: the nodes whose status to write after it, or None."""


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    name: str
    sweep: Sweep


STEPS: tuple[Step, ...] = (
    Step("cordon", lambda ctx, tick: pausing.announce(ctx, tick.now)),  # the breakers, said once
    Step("repair", lambda ctx, tick: repairing.sweep(ctx, tick.now)),  # excluded, deselected, dry run
    Step("new_nodes", lambda ctx, tick: new_nodes.sweep(ctx, tick.now)),  # spec.repair.validation
    Step("orphan_jobs", lambda ctx, tick: orphan_jobs.sweep(ctx, full=tick.full)),  # Node deleted
    Step("check", lambda ctx, tick: checking.on_timer(ctx, tick.now, tick.write)),  # ended, then started
    Step("isolate", lambda ctx, tick: isolation_sweep.sweep(ctx, tick.now)),  # deleted policies' rules
    Step("domain", lambda ctx, tick: domain_actions.on_timer(ctx, tick.now, full=tick.refresh)),
)
"""The ladder's timer sweeps, in the order the timer runs them."""
