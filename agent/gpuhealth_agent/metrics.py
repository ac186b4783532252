"""Prometheus metrics of the agent: per-GPU facts and the agent's own health.

All metrics live in a CollectorRegistry handed in by the caller, never the
process-global default, so many agents (the fleet simulator) or tests can
coexist in one process; the fleet simulator passes no metrics at all.
Per-GPU series are labelled by `gpu` (index) and `uuid`: that is one series
per GPU per metric, bounded by the GPUs in the node. The per-fact families
come from the fact table (`facts.py`: a row's `metric` and `labels`). XIDs add one series per
code seen, clock-event reasons one per reason (9 at most). NVLink, fabric and
AER add a few series per GPU (kind/state labels of fixed values); InfiniBand
ports are labelled `device` and `port`, bounded by the node's ports (at most
sysfs.MAX_NICS).
"""

from __future__ import annotations

import platform
from typing import Any, Final

import prometheus_client

from gpuhealth_agent import collector, facts, nvml, outputs
from gpuhealth_api import __version__, status, vocabulary

PREFIX: Final = "gpuhealth_agent"
GPU_LABELS: Final = ("gpu", "uuid")
GPU: Final = "gpu"
UUID: Final = "uuid"
FUNCTION: Final = "function"
ERROR: Final = "error"
REASON: Final = "reason"
CODE: Final = "code"
KIND: Final = "kind"
STATE: Final = "state"
DEVICE: Final = "device"
PORT: Final = "port"
NIC_LABELS: Final = (DEVICE, PORT)
NVLINK_ERRORS: Final = (("crcErrors", "crc"), ("replayErrors", "replay"), ("recoveryErrors", "recovery"))
AER_ERRORS: Final = (("fatal", "fatal"), ("nonFatal", "nonfatal"), ("correctable", "correctable"))
NIC_ERRORS: Final = (("linkDowned", "link_downed"), ("symbolErrors", "symbol"), ("rcvErrors", "rcv"))
FABRIC_CODES: Final = {name: code for code, name in nvml.FABRIC_STATES.items()}


TELEMETRY_METRICS: Final = frozenset({facts.TEMPERATURE, facts.POWER, facts.SM_CLOCK})
"""What dcgm-exporter exports as well (DCGM_FI_DEV_GPU_TEMP, _POWER_USAGE, _SM_CLOCK), sampled every few
seconds per GPU: the bulk of a fleet's series. `gpu_telemetry=False` leaves them to it; every fault
series stays (the operator judges GPUNode status, never these series)."""


class AgentMetrics:
    """The agent's metric families, registered in `registry`."""

    def __init__(self, registry: prometheus_client.CollectorRegistry, *, gpu_telemetry: bool = True) -> None:
        self.registry = registry
        g, c, h = prometheus_client.Gauge, prometheus_client.Counter, prometheus_client.Histogram
        r = registry
        self.facts = {
            metric: g(f"{PREFIX}_{metric.name}", metric.help, (*GPU_LABELS, *metric.labels), registry=r)
            for metric in facts.METRICS
            if gpu_telemetry or metric not in TELEMETRY_METRICS
        }
        """One gauge family per fact metric of the fact table (facts.METRICS), less the telemetry ones
        when `gpu_telemetry` is off (not registered at all: no family, no series)."""
        self.xids = c(
            f"{PREFIX}_gpu_xid_errors",
            "XID errors the agent received, by code.",
            (*GPU_LABELS, CODE),
            registry=r,
        )
        self.lost = g(
            f"{PREFIX}_gpu_lost", "1 when the GPU fell off the bus or is missing.", GPU_LABELS, registry=r
        )
        self.unreadable = g(
            f"{PREFIX}_gpu_unreadable_facts",
            "Facts of the GPU NVML keeps failing to read (absent from its status, not their last value).",
            GPU_LABELS,
            registry=r,
        )
        self.nvlink_links = g(
            f"{PREFIX}_gpu_nvlink_links",
            "NVLinks of the GPU by state (up|down); absent on boards without NVLink.",
            (*GPU_LABELS, STATE),
            registry=r,
        )
        self.nvlink_errors = g(
            f"{PREFIX}_gpu_nvlink_errors",
            "NVLink data-link error counts summed over the links that are up (kind: crc|replay|recovery). "
            "A gauge: a link going down takes its count out of the sum.",
            (*GPU_LABELS, KIND),
            registry=r,
        )
        self.fabric_state = g(
            f"{PREFIX}_gpu_fabric_state",
            "NVML GPU fabric state (1 NotStarted, 2 InProgress, 3 Completed); absent where not supported.",
            GPU_LABELS,
            registry=r,
        )
        self.fabric_ok = g(
            f"{PREFIX}_gpu_fabric_status_success",
            "1 when the GPU's fabric registration status is Success, 0 when it reports an error.",
            GPU_LABELS,
            registry=r,
        )
        self.aer_errors = g(
            f"{PREFIX}_gpu_pcie_aer_errors",
            "PCIe AER error totals of the GPU since boot, from sysfs (kind: fatal|nonfatal|correctable).",
            (*GPU_LABELS, KIND),
            registry=r,
        )
        self.nic_active = g(
            f"{PREFIX}_nic_port_active",
            "1 when the InfiniBand/RoCE port's state is ACTIVE.",
            NIC_LABELS,
            registry=r,
        )
        self.nic_link_up = g(
            f"{PREFIX}_nic_port_link_up",
            "1 when the port's physical state is LinkUp.",
            NIC_LABELS,
            registry=r,
        )
        self.nic_rate = g(f"{PREFIX}_nic_port_rate_gbps", "The port's current rate.", NIC_LABELS, registry=r)
        self.nic_errors = g(
            f"{PREFIX}_nic_port_errors",
            "The port's sysfs counters (kind: link_downed|symbol|rcv), as the kernel reports them.",
            (*NIC_LABELS, KIND),
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
        self.error = g(
            f"{PREFIX}_error",
            "1 while the agent reports this error of its own (status.agent.error), e.g. NoGPUsVisible.",
            (REASON,),
            registry=r,
        )
        for reason in vocabulary.AgentErrorReason:
            self.error.labels(reason.value).set(0)
        self.build_info = g(
            f"{PREFIX}_build_info",
            "Always 1: the agent's version and Python version, as labels (which agents run which release).",
            ("version", "python"),
            registry=r,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)

    def export(self, turn: outputs.Turn) -> None:
        """Everything the turn tells (an outputs.Output): the sample, events, XIDs, the write outcome."""
        self.observe(turn.sample)
        active = turn.status.get("agent", {}).get("error", {}).get("reason")
        for reason in vocabulary.AgentErrorReason:
            self.error.labels(reason.value).set(1 if reason.value == active else 0)
        self.nvml_calls.inc(turn.nvml_calls)
        for kind in turn.events:
            self.events.labels(str(kind)).inc()
        for gpu, code in turn.xids:
            self.xid(gpu.index, gpu.uuid, code)
        if turn.dcgm_failed:
            self.dcgm_scrape_failures.inc()
        outcome = turn.outcome
        if outcome is not None and outcome.reason is not None:
            if outcome.written:
                self.report_writes.labels(str(outcome.reason)).inc()
                self.last_report.set(turn.now)
            elif outcome.error is not None:
                self.report_failures.inc()

    def observe(self, sample: collector.Sample) -> None:
        self.collection_duration.observe(sample.duration_seconds)
        self.last_collection.set(sample.time)
        self.expected_gpus.set(sample.expected_gpus)
        self.gpus.set(sum(1 for g in sample.gpus if not g.get("lost", False)))
        for (function, error), count in sample.errors.items():
            self.nvml_errors.labels(function, error).inc(count)
        for gpu in sample.gpus:
            self._observe_gpu(gpu)
            self._observe_links(gpu)
        for nic in sample.nics or []:
            self._observe_nic(nic)

    def _observe_links(self, gpu: status.GPUStatus) -> None:
        """NVLink, fabric and AER series of a GPU; a fact the GPU does not have leaves its series unset."""
        if gpu.get("lost"):
            return
        labels = (str(gpu["index"]), gpu.get("uuid", ""))
        nvlink = gpu.get("nvlink")
        if nvlink is not None:
            self.nvlink_links.labels(*labels, "up").set(nvlink.get("linksUp", 0))
            self.nvlink_links.labels(*labels, "down").set(nvlink.get("linksDown", 0))
            for key, kind in NVLINK_ERRORS:
                if key in nvlink:
                    self.nvlink_errors.labels(*labels, kind).set(nvlink[key])  # type: ignore[literal-required]
        fabric = gpu.get("fabric")
        if fabric is not None:
            self.fabric_state.labels(*labels).set(FABRIC_CODES.get(fabric.get("state", ""), -1))
            self.fabric_ok.labels(*labels).set(1 if fabric.get("status") == "Success" else 0)
        aer = gpu.get("pcie", {}).get("aer")
        if aer is not None:
            for key, kind in AER_ERRORS:
                if key in aer:
                    self.aer_errors.labels(*labels, kind).set(aer[key])  # type: ignore[literal-required]

    def _observe_nic(self, nic: status.Nic) -> None:
        labels = (nic.get("name", ""), str(nic.get("port", "")))
        if "state" in nic:
            self.nic_active.labels(*labels).set(1 if nic["state"] == "ACTIVE" else 0)
        if "physState" in nic:
            self.nic_link_up.labels(*labels).set(1 if nic["physState"] == "LinkUp" else 0)
        if "rateGbps" in nic:
            self.nic_rate.labels(*labels).set(nic["rateGbps"])
        for key, kind in NIC_ERRORS:
            if key in nic:
                self.nic_errors.labels(*labels, kind).set(nic[key])  # type: ignore[literal-required]

    def _observe_gpu(self, gpu: status.GPUStatus) -> None:
        labels = (str(gpu["index"]), gpu.get("uuid", ""))
        self.lost.labels(*labels).set(1 if gpu.get("lost") else 0)
        self.unreadable.labels(*labels).set(len(gpu.get("unreadable", [])))
        if gpu.get("lost"):
            return
        for fact in facts.FACTS:
            if fact.metric is None:
                continue
            value: Any = gpu
            for name in fact.path:
                value = value.get(name) if isinstance(value, dict) else None
            family = self.facts.get(fact.metric)
            if value is None or family is None:
                continue
            if fact.type is facts.Type.REASONS:
                active = set(value)
                for name in facts.REASON_BITS:
                    family.labels(*labels, *fact.labels, name).set(1 if name in active else 0)
            elif fact.type is facts.Type.RECOVERY:
                family.labels(*labels, *fact.labels).set(facts.RECOVERY_CODES.get(value, -1))
            else:
                family.labels(*labels, *fact.labels).set(float(value))

    def xid(self, gpu_index: int | None, uuid: str | None, code: int) -> None:
        self.xids.labels(str(gpu_index if gpu_index is not None else ""), uuid or "", str(code)).inc()
