"""The fleet's GPU SLIs: GPUs by policy and model, out of service by reason, GPU-hours lost.

They are set from per-policy tallies (`GPUTally`) that the timer's pass computes with the policies'
status counts, at most every GPU_SLI_SECONDS; in between, the last tally is carried forward
(`GPUMeters.carry`), so the GPU-hours lost grow without every selected node's GPUs counted again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime

import prometheus_client

from gpuhealth_operator.shared.metric_labels import LOST_REASONS, OUT_OF_SERVICE_REASONS

LOST_MAX_STEP_SECONDS = 30.0
"""At most this much time is counted between two passes: a gap (a lost lease, a stopped process) is
not lost GPU time this replica saw, and another replica may have counted it."""
GPU_SLI_SECONDS = 10.0
"""The GPU gauges are recounted at most this often: a pass over every selected node's GPUs costs
~10 ms per 1,000 nodes, too much for every 1 s tick, and far finer than any scrape."""


@dataclasses.dataclass
class GPUTally:
    """GPUs of one policy's judged nodes, by model: all, healthy and in service, out of service by reason."""

    total: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    healthy: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    out: collections.Counter[tuple[str, str]] = dataclasses.field(default_factory=collections.Counter)

    def add(self, model: str, gpus: int, *, healthy: bool, out_reason: str | None) -> None:
        self.total[model] += gpus
        if out_reason is not None:
            self.out[(model, out_reason)] += gpus
        elif healthy:
            self.healthy[model] += gpus


@dataclasses.dataclass
class GPUMeters:
    """The GPU gauges and counter, and what of each policy's GPUs they were last set from."""

    gpus: prometheus_client.Gauge
    healthy: prometheus_client.Gauge
    out_of_service: prometheus_client.Gauge
    hours_lost: prometheus_client.Counter
    _models: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    """Models each policy's GPU series exist for (a model gone from the policy loses its series)."""
    _counted_at: dict[str, datetime.datetime] = dataclasses.field(default_factory=dict)
    _tallies: dict[str, GPUTally] = dataclasses.field(default_factory=dict)
    """Each policy's last GPU tally: carried forward while nothing it counts moved (`carry`)."""

    def due(self, policy: str, now: datetime.datetime) -> bool:
        """Whether the policy's GPU gauges are due for a recount (GPU_SLI_SECONDS since the last)."""
        previous = self._counted_at.get(policy)
        return previous is None or (now - previous).total_seconds() >= GPU_SLI_SECONDS

    def record(self, policy: str, tally: GPUTally, now: datetime.datetime) -> None:
        """Set a policy's GPU gauges from one pass's tally, and count the GPU-hours lost since the last."""
        previous = self._counted_at.get(policy)
        self._counted_at[policy] = now
        self._tallies[policy] = tally
        step = 0.0 if previous is None else (now - previous).total_seconds()
        hours = min(max(step, 0.0), LOST_MAX_STEP_SECONDS) / 3600.0
        models = set(tally.total)
        self._forget_models(policy, self._models.get(policy, set()) - models)
        self._models[policy] = models
        for model in models:
            self.gpus.labels(policy, model).set(tally.total[model])
            self.healthy.labels(policy, model).set(tally.healthy[model])
            for reason in OUT_OF_SERVICE_REASONS:
                self.out_of_service.labels(policy, model, reason).set(tally.out[(model, reason)])
            lost = sum(tally.out[(model, reason)] for reason in LOST_REASONS)
            self.hours_lost.labels(policy, model).inc(lost * hours)

    def carry(self, now: datetime.datetime) -> None:
        """Each policy's last tally recorded again at `now`: what the GPU-hours lost grow by while nothing
        the tally counts moved, without counting every selected node's GPUs again."""
        for policy, tally in list(self._tallies.items()):
            self.record(policy, tally, now)

    def forget_policy(self, policy: str) -> None:
        """Drop a deleted policy's GPU series and what they were set from."""
        self._forget_models(policy, self._models.pop(policy, set()))
        self._counted_at.pop(policy, None)
        self._tallies.pop(policy, None)

    def new_term(self) -> None:
        """A term starts: the time between terms is not lost GPU time this replica saw."""
        self._counted_at.clear()
        self._tallies.clear()

    def _forget_models(self, policy: str, models: set[str]) -> None:
        for model in models:
            for gauge in (self.gpus, self.healthy):
                with contextlib.suppress(KeyError):
                    gauge.remove(policy, model)
            for reason in OUT_OF_SERVICE_REASONS:
                with contextlib.suppress(KeyError):
                    self.out_of_service.remove(policy, model, reason)
            with contextlib.suppress(KeyError):
                self.hours_lost.remove(policy, model)
