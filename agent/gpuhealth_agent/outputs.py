"""What one agent turn hands to its outputs, and the output that writes the GPUNode.

Like node-problem-detector's exporters, the runner gives each turn to a list
of outputs (`for output in outputs: output.export(turn)`): the GPUNode
reporter and the Prometheus metrics today. Adding an output is appending to
that list, not another `if metrics is not None` in the loop. Outputs run in
order; the reporter runs first, so later outputs see its write outcome.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from gpuhealth_agent import collector, events, reporter
from gpuhealth_api import status


@dataclasses.dataclass
class Turn:
    """One turn of the agent loop: what was read and what happened since the last turn."""

    now: float
    """Epoch seconds when the turn started."""
    sample: collector.Sample
    status: status.GPUNodeStatus
    """The agent's part of the GPUNode status built from the sample."""
    xids: list[tuple[collector.Gpu, int]] = dataclasses.field(default_factory=list)
    """XIDs received this turn (NVML events, DCGM), each with its GPU."""
    events: list[events.Kind] = dataclasses.field(default_factory=list)
    """Kinds of the NVML events received this turn."""
    nvml_calls: int = 0
    """Calls into NVML since the previous turn."""
    dcgm_failed: bool = False
    """The DCGM exporter could not be scraped this turn."""
    outcome: reporter.Outcome | None = None
    """What the reporter did with the status (set by ReportOutput; None without a reporter)."""


class Output(Protocol):
    def export(self, turn: Turn) -> None: ...


class ReportOutput:
    """Writes the turn's status to the GPUNode (when it matters) through a Reporter."""

    def __init__(self, report: reporter.Reporter) -> None:
        self.reporter = report

    def export(self, turn: Turn) -> None:
        turn.outcome = self.reporter.report(turn.now, turn.status)
