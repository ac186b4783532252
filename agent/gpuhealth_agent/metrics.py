"""Prometheus metrics of the agent: per-GPU facts and the agent's own health.

All metrics live in a CollectorRegistry handed in by the caller, never the
process-global default, so many agents (the fleet simulator) or tests can
coexist in one process; the fleet simulator passes no metrics at all.
Per-GPU series are labelled by `gpu` (index) and `uuid`: that is one series
per GPU per metric, bounded by the GPUs in the node. XIDs add one series per
code seen, clock-event reasons one per reason (9 at most).
"""

from __future__ import annotations

from typing import Final

import prometheus_client

from gpuhealth_agent import collector, nvml
from gpuhealth_api import status

PREFIX: Final = "gpuhealth_agent"
GPU_LABELS: Final = ("gpu", "uuid")
GPU: Final = "gpu"
UUID: Final = "uuid"
FUNCTION: Final = "function"
ERROR: Final = "error"
REASON: Final = "reason"
CODE: Final = "code"
KIND: Final = "kind"
SCOPE: Final = "scope"


class AgentMetrics:
    """The agent's metric families, registered in `registry`."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.registry = registry
        g, c, h = prometheus_client.Gauge, prometheus_client.Counter, prometheus_client.Histogram
        r = registry
        self.temperature = g(
            f"{PREFIX}_gpu_temperature_celsius", "GPU core temperature.", GPU_LABELS, registry=r
        )
        self.slowdown_temperature = g(
            f"{PREFIX}_gpu_slowdown_temperature_celsius",
            "Temperature at which the GPU starts to slow down (NVML slowdown threshold).",
            GPU_LABELS,
            registry=r,
        )
        self.power = g(f"{PREFIX}_gpu_power_watts", "GPU power draw.", GPU_LABELS, registry=r)
        self.power_limit = g(
            f"{PREFIX}_gpu_power_limit_watts", "Enforced GPU power limit.", GPU_LABELS, registry=r
        )
        self.sm_clock = g(f"{PREFIX}_gpu_sm_clock_mhz", "Current SM clock.", GPU_LABELS, registry=r)
        self.max_sm_clock = g(f"{PREFIX}_gpu_max_sm_clock_mhz", "Maximum SM clock.", GPU_LABELS, registry=r)
        self.utilization = g(
            f"{PREFIX}_gpu_utilization_percent",
            "GPU utilisation over the driver's last period.",
            GPU_LABELS,
            registry=r,
        )
        self.ecc_errors = g(
            f"{PREFIX}_gpu_ecc_errors",
            "ECC error count as NVML reports it (kind: corrected|uncorrected, scope: volatile|aggregate). "
            "A gauge because volatile counts restart at a GPU reset.",
            (*GPU_LABELS, KIND, SCOPE),
            registry=r,
        )
        self.retired_pages = g(
            f"{PREFIX}_gpu_retired_pages_double_bit",
            "Pages retired after double-bit ECC errors.",
            GPU_LABELS,
            registry=r,
        )
        self.remapped_rows = g(
            f"{PREFIX}_gpu_remapped_rows",
            "Rows remapped (kind: correctable|uncorrectable).",
            (*GPU_LABELS, KIND),
            registry=r,
        )
        self.remap_failure = g(
            f"{PREFIX}_gpu_row_remap_failure",
            "1 when row remapping failed on the GPU.",
            GPU_LABELS,
            registry=r,
        )
        self.remap_pending = g(
            f"{PREFIX}_gpu_row_remap_pending",
            "1 when a row remap waits for a GPU reset.",
            GPU_LABELS,
            registry=r,
        )
        self.xids = c(
            f"{PREFIX}_gpu_xid_errors",
            "XID errors the agent received, by code.",
            (*GPU_LABELS, CODE),
            registry=r,
        )
        self.clock_event_reason = g(
            f"{PREFIX}_gpu_clock_event_reason_active",
            "1 while the clock-event (throttle) reason is active.",
            (*GPU_LABELS, REASON),
            registry=r,
        )
        self.recovery_action = g(
            f"{PREFIX}_gpu_recovery_action",
            "NVML GPU recovery action code (0 None, 1 GpuReset, 2 NodeReboot, 3 DrainP2P, 4 DrainAndReset).",
            GPU_LABELS,
            registry=r,
        )
        self.lost = g(
            f"{PREFIX}_gpu_lost", "1 when the GPU fell off the bus or is missing.", GPU_LABELS, registry=r
        )
        self.pcie_generation = g(
            f"{PREFIX}_gpu_pcie_link_generation",
            "PCIe link generation (kind: current|max).",
            (*GPU_LABELS, KIND),
            registry=r,
        )
        self.pcie_width = g(
            f"{PREFIX}_gpu_pcie_link_width",
            "PCIe link width in lanes (kind: current|max).",
            (*GPU_LABELS, KIND),
            registry=r,
        )
        self.pcie_replays = g(
            f"{PREFIX}_gpu_pcie_replay_counter",
            "PCIe replay counter as NVML reports it.",
            GPU_LABELS,
            registry=r,
        )
        # The agent's own health.
        self.gpus = g(f"{PREFIX}_gpus", "GPUs answering NVML.", registry=r)
        self.expected_gpus = g(f"{PREFIX}_expected_gpus", "GPUs the node should have.", registry=r)
        self.collection_duration = h(
            f"{PREFIX}_collection_duration_seconds",
            "Time to read all GPUs once.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.nvml_errors = c(
            f"{PREFIX}_nvml_errors",
            "NVML calls that failed, by function and error.",
            (FUNCTION, ERROR),
            registry=r,
        )
        self.nvml_calls = c(f"{PREFIX}_nvml_calls", "Calls into NVML (all functions).", registry=r)
        self.report_writes = c(
            f"{PREFIX}_report_writes",
            "GPUNode status writes that succeeded, by reason.",
            (REASON,),
            registry=r,
        )
        self.report_failures = c(
            f"{PREFIX}_report_failures", "GPUNode status writes that failed.", registry=r
        )
        self.last_report = g(
            f"{PREFIX}_last_successful_report_timestamp_seconds",
            "Unix time of the last successful GPUNode status write.",
            registry=r,
        )
        self.last_collection = g(
            f"{PREFIX}_last_collection_timestamp_seconds",
            "Unix time of the last completed collection.",
            registry=r,
        )
        self.dcgm_scrape_failures = c(
            f"{PREFIX}_dcgm_scrape_failures", "Failed scrapes of the dcgm-exporter.", registry=r
        )
        self.events = c(
            f"{PREFIX}_nvml_events", "NVML events received, by type (xid|dbe).", (KIND,), registry=r
        )

    def observe(self, sample: collector.Sample) -> None:
        self.collection_duration.observe(sample.duration_seconds)
        self.last_collection.set(sample.time)
        self.expected_gpus.set(sample.expected_gpus)
        self.gpus.set(sum(1 for g in sample.gpus if not g.get("lost", False)))
        for (function, error), count in sample.errors.items():
            self.nvml_errors.labels(function, error).inc(count)
        for gpu in sample.gpus:
            self._observe_gpu(gpu)

    def _observe_gpu(self, gpu: status.GPUStatus) -> None:
        labels = (str(gpu["index"]), gpu.get("uuid", ""))
        self.lost.labels(*labels).set(1 if gpu.get("lost") else 0)
        if gpu.get("lost"):
            return
        simple = (
            (self.temperature, gpu.get("temperatureCelsius")),
            (self.slowdown_temperature, gpu.get("slowdownTemperatureCelsius")),
            (self.power, gpu.get("powerWatts")),
            (self.power_limit, gpu.get("powerLimitWatts")),
            (self.sm_clock, gpu.get("smClockMHz")),
            (self.max_sm_clock, gpu.get("maxSmClockMHz")),
            (self.utilization, gpu.get("utilizationPercent")),
            (self.retired_pages, gpu.get("retiredPages", {}).get("doubleBit")),
            (self.remap_failure, gpu.get("remappedRows", {}).get("failure")),
            (self.remap_pending, gpu.get("remappedRows", {}).get("pending")),
            (self.pcie_replays, gpu.get("pcie", {}).get("replayCounter")),
        )
        for family, value in simple:
            if value is not None:
                family.labels(*labels).set(float(value))
        ecc = gpu.get("ecc", {})
        for key, kind, scope in (
            ("correctedVolatile", "corrected", "volatile"),
            ("uncorrectedVolatile", "uncorrected", "volatile"),
            ("correctedAggregate", "corrected", "aggregate"),
            ("uncorrectedAggregate", "uncorrected", "aggregate"),
        ):
            if key in ecc:
                self.ecc_errors.labels(*labels, kind, scope).set(ecc[key])  # type: ignore[literal-required]
        rows = gpu.get("remappedRows", {})
        for key, kind in (("correctable", "correctable"), ("uncorrectable", "uncorrectable")):
            if key in rows:
                self.remapped_rows.labels(*labels, kind).set(rows[key])  # type: ignore[literal-required]
        pcie = gpu.get("pcie", {})
        for family, current, maximum in (
            (self.pcie_generation, "generation", "maxGeneration"),
            (self.pcie_width, "width", "maxWidth"),
        ):
            if current in pcie:
                family.labels(*labels, "current").set(pcie[current])  # type: ignore[literal-required]
            if maximum in pcie:
                family.labels(*labels, "max").set(pcie[maximum])  # type: ignore[literal-required]
        if "clockEventReasons" in gpu:
            active = set(gpu["clockEventReasons"])
            for name in status.CLOCK_EVENT_REASONS.values():
                self.clock_event_reason.labels(*labels, name).set(1 if name in active else 0)
        if "recoveryAction" in gpu:
            codes = {name: code for code, name in nvml.RECOVERY_ACTIONS.items()}
            self.recovery_action.labels(*labels).set(codes.get(gpu["recoveryAction"], -1))

    def xid(self, gpu_index: int | None, uuid: str | None, code: int) -> None:
        self.xids.labels(str(gpu_index if gpu_index is not None else ""), uuid or "", str(code)).inc()
