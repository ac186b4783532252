"""The agent loop: collect, then hand the turn to each output (GPUNode reporter, metrics).

`Agent.run_once(now)` is one turn and owns no thread, so the fleet simulator
can drive a thousand agents from a small pool (sharing one Kubernetes
ApiClient, metrics disabled). `Agent.run_forever()` is production: a turn
every interval, an early turn when the NVML event thread reports an XID or
double-bit ECC error, and a clean exit on SIGTERM.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from gpuhealth_agent import (
    access_hints,
    changes,
    collector,
    dcgm,
    events,
    health,
    metrics,
    nvml,
    outputs,
    release,
    reporter,
    simulated,
    xids,
)
from gpuhealth_api import __version__, faults, heartbeats, status, timestamps, vocabulary

log = logging.getLogger(__name__)

BACKEND_NVML: Final = "nvml"
BACKEND_SIM: Final = "sim"
_IDENTITY_READS: Final = frozenset({"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"})
"""The reads that make a GPU known to the agent: a GPU none of them answers for is not seen."""


@dataclasses.dataclass(frozen=True)
class Settings:
    node_name: str
    """The Node this agent runs on; also its GPUNode's name."""
    backend: str = BACKEND_NVML
    """nvml (the real driver) or sim (a scenario)."""
    interval_seconds: float = 5.0
    """Collect period."""
    heartbeat_seconds: float = heartbeats.DEFAULT_HEARTBEAT_SECONDS
    """Longest time without a status write when nothing significant changed."""
    slow_period_seconds: float = 10.0
    """Slow counters (aggregate ECC, retired pages, remapped rows, PCIe) are read at most this often."""
    expected_gpus: int | None = None
    """GPUs the node physically has, if known up front (sim: the scenario's); else from the Node's labels."""
    event_thread: bool = True
    """Wait for NVML events on a thread (production); False: poll for them each turn (fleet simulator)."""
    boot_id: str | None = None
    """The kernel's boot ID; a different one in the earlier status means the node rebooted since."""
    boot_time: str | None = None
    """When that boot began (RFC 3339, the node's clock), reported as `status.agent.bootTime`."""
    sysfs_root: str | None = None
    """Where to read PCIe AER and InfiniBand ports (`/sys` in production); None: the simulated
    backend's own tree if it has one (simulated.sysfs_root), else no sysfs facts."""
    gpu_access: access_hints.GpuAccess | None = None
    """How the chart says the pod reaches the GPUs; names the likely fix when the agent sees none."""


@dataclasses.dataclass(frozen=True)
class TurnResult:
    sample: collector.Sample
    status: status.GPUNodeStatus
    outcome: reporter.Outcome | None
    events: int


class Agent:
    def __init__(
        self,
        settings: Settings,
        lib: nvml.Library,
        *,
        report: reporter.Reporter | None = None,
        agent_metrics: metrics.AgentMetrics | None = None,
        dcgm_source: dcgm.DcgmSource | None = None,
        clock: Callable[[], float] = time.time,
        catalogue: xids.Catalogue | None = None,
        release_source: release.Source | None = None,
    ) -> None:
        self.settings = settings
        self.release = release_source
        """What the operator asks to release (`release`); None: the agent is never asked (no canRelease)."""
        self._released: str | None = None
        """The ask the agent answered by shutting NVML down (`status.agent.released`); None: NVML is open."""
        self._last_sample: collector.Sample | None = None
        self.lib, self.nvml_counter = nvml.counting(lib)
        self._calls_reported = 0
        self.reporter = report
        self.outputs: list[outputs.Output] = []
        """Where each turn goes, in order (the reporter first, so metrics see its outcome)."""
        if report is not None:
            self.outputs.append(outputs.ReportOutput(report))
        if agent_metrics is not None:
            self.outputs.append(agent_metrics)
        self._xids: list[tuple[collector.Gpu, int]] = []
        self._events: list[events.Kind] = []
        self._dcgm_failed = False
        self.dcgm = dcgm_source
        self.clock = clock
        self.catalogue = catalogue if catalogue is not None else xids.Catalogue.packaged()
        """XID meanings; a fleet of agents can share one copy."""
        self.collector = collector.Collector(
            self.lib,
            expected_gpus=settings.expected_gpus,
            slow_period_seconds=settings.slow_period_seconds,
            enrich=self._enrich if dcgm_source is not None else None,
            sysfs_root=Path(settings.sysfs_root) if settings.sysfs_root else simulated.sysfs_root(lib),
        )
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.watcher = events.EventWatcher(self.lib, wake=self.wake.set)
        self.liveness = health.Liveness(settings.interval_seconds, clock=clock, started_at=clock())
        self._started = False
        self._threads: list[threading.Thread] = []
        self._error_since: str | None = None
        self._nvml_ready = False
        self._nvml_failure: str | None = None
        """The pynvml error name of the last failed nvmlInit, None once NVML started."""
        """When the agent's current error (`status.agent.error`) began, None while it has none."""

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self, now: float | None = None) -> None:
        """Initialise NVML, read the GPUs once and subscribe to their events.

        With a GPUNode to report to, an NVML that cannot start (no library injected, no driver
        loaded) is the agent's error, said on the GPUNode and retried every turn; exiting only
        restarted the pod in a loop, and the node went stale with no word of why. Without one
        (`check`), it raises.
        """
        if self._started:
            return
        now = self.clock() if now is None else now
        self._start_nvml(now)
        self._started = True
        if self.reporter is not None and self.reporter.try_prepare(now):
            self._restore()

    def _start_nvml(self, now: float) -> bool:
        """nvmlInit, learn the GPUs, subscribe to their events; False (and `_nvml_failure`) if it fails."""
        if self._nvml_ready:
            return True
        try:
            self.lib.nvmlInit()
        except nvml.NVMLError as exc:
            if self.reporter is None:
                raise
            if self._nvml_failure is None:
                log.error("cannot use NVML: %s; reporting an agent error and trying again each turn", exc)
            self._nvml_failure = nvml.error_name(exc)
            return False
        if self._nvml_failure is not None:
            log.info("NVML started after failing with %s", self._nvml_failure)
        self._nvml_ready, self._nvml_failure = True, None
        self.collector.sample(now)  # learn the GPUs (handles) before registering for their events
        registered = self.watcher.open(self.collector.handles())
        log.info("watching %d GPUs for XID and double-bit ECC events", registered)
        if self.settings.event_thread:
            self._session_stop = threading.Event()  # ends this NVML session's event thread (a release)
            self._threads.append(self.watcher.start_thread(self._session_stop))
        return True

    def _let_go(self, asked: str) -> None:
        """Shut NVML down for the operator's reset (`release`): the event thread first, its set, then
        nvmlShutdown. The facts sampled last are reported meanwhile, marked `released`."""
        session = getattr(self, "_session_stop", None)
        if session is not None:
            session.set()
        for thread in self._threads:
            thread.join(timeout=2 * events.WAIT_MILLISECONDS / 1000)
        self._threads = []
        self.watcher.close()
        if self._nvml_ready:
            self._nvml_ready = False
            try:
                self.lib.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)
        self.collector.forget_handles()
        self._released = asked
        log.info("NVML shut down for a GPU reset (release %s)", asked)

    def close(self) -> None:
        self.stop.set()
        self.wake.set()
        session = getattr(self, "_session_stop", None)
        if session is not None:
            session.set()
        for thread in self._threads:
            thread.join(timeout=2 * events.WAIT_MILLISECONDS / 1000)
        self.watcher.close()
        if self._started and self._nvml_ready:
            self._nvml_ready = False
            try:
                self.lib.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)
            self._started = False

    # --- one turn --------------------------------------------------------------------------------------

    def run_once(self, now: float | None = None) -> TurnResult:
        now = self.clock() if now is None else now
        asked = self.release.wanted() if self.release is not None else None
        if asked is not None and asked != self._released and self._started:
            self._let_go(asked)
        elif asked is None and self._released is not None:
            log.info("GPU release %s ended: initialising NVML again", self._released)
            self._released = None  # NVML starts again below, and this turn's report goes out at once
        if not self._started:
            self.start(now)
        elif not self._nvml_ready and self._released is None:
            self._start_nvml(now)
        if not self.settings.event_thread and self._released is None:
            self.watcher.poll()
        received = self._take_events(now)
        self._expect_from_node()
        if self._released is not None and self._last_sample is not None:
            sample = dataclasses.replace(self._last_sample, time=now)  # NVML is shut: the facts it had
        elif self._nvml_ready:
            sample = self.collector.sample(now)
            self._last_sample = sample
        else:
            sample = self.collector.blind(
                now, collections.Counter({("nvmlInit", self._nvml_failure or "?"): 1})
            )
        self._watch_new_gpus()
        calls = self.nvml_counter.calls
        turn = outputs.Turn(
            now,
            sample,
            self.build_status(sample),
            xids=self._xids,
            events=self._events,
            nvml_calls=calls - self._calls_reported,
            dcgm_failed=self._dcgm_failed,
        )
        self._calls_reported = calls
        self._xids, self._events, self._dcgm_failed = [], [], False
        for output in self.outputs:
            output.export(turn)
        if self.reporter is not None:
            self._restore()  # when the API was down at start, the GPUNode is first read here
            self._expect_from_node()
        if self.reporter is not None:  # a failed write or read leaves the backoff counting failures
            self.liveness.api_contact(self.reporter.retry.failures == 0, now)
        self.liveness.completed(self.clock())
        return TurnResult(sample, turn.status, turn.outcome, received)

    def _expect_from_node(self) -> None:
        """The GPUs the Node's labels say it has, once the reporter has read the Node (before a sample)."""
        known = self.reporter.expected_gpus if self.reporter is not None else None
        if known is not None and self.collector.expected_gpus is None:
            self.collector.expected_gpus = known

    def _watch_new_gpus(self) -> None:
        """Register for events of GPUs that answer now but did not at start (one that came back)."""
        handles = self.collector.handles()
        if len(handles) > self.watcher.registered:
            before = self.watcher.registered
            if self.watcher.register(handles) > before:
                log.info("watching %d GPUs for XID and double-bit ECC events", self.watcher.registered)

    def _restore(self) -> None:
        assert self.reporter is not None
        previous = self.reporter.take_previous()
        seen = previous.get("agent", {}).get("maxGpuCountSeen") if previous is not None else None
        if isinstance(seen, int) and seen > 0:  # a GPU gone since then is still missed, over a reboot too
            self.collector.max_gpus_seen = min(faults.MAX_GPUS, max(self.collector.max_gpus_seen, seen))
        earlier_boot = previous.get("agent", {}).get("bootId") if previous is not None else None
        if earlier_boot and self.settings.boot_id and earlier_boot != self.settings.boot_id:
            # A reboot resets every GPU, and some XIDs (NVLink 74, GSP 119/120) leave no other
            # trace a reset would clear: without this they would outlive the repair for ever.
            log.info("node rebooted since the GPUNode's earlier status: XIDs start from zero")
            return
        if previous is not None:
            restored = self.collector.restore(previous.get("gpus", []))
            if restored:
                log.info("carried over XIDs of %d GPU(s) from the GPUNode's earlier status", restored)

    def _take_events(self, now: float) -> int:
        taken = self.watcher.drain()
        for event in taken:
            gpu = self.collector.identify(event.handle)  # handle -> index -> UUID, once per event
            if event.kind is events.Kind.XID:
                info = self.catalogue.lookup(event.code)
                log.warning(
                    "XID %d on GPU %s: %s (%s, action %s)",
                    event.code,
                    gpu.index,
                    info.description,
                    "critical" if info.critical else "not critical",
                    info.action,
                )
                if self.dcgm is None or self.dcgm.claim_nvml_xid(gpu.uuid, event.code, now):
                    self._record_xid(gpu, event.code, now)
            else:
                log.warning("double-bit ECC error on GPU %s", gpu.index)
                self.collector.request_full_sample()
            self._events.append(event.kind)
        return len(taken)

    def _record_xid(self, gpu: collector.Gpu, code: int, now: float) -> None:
        self.collector.record_xid(gpu, code, now)
        self._xids.append((gpu, code))

    def _enrich(self, gpus: list[status.GPUStatus], now: float) -> None:
        assert self.dcgm is not None
        ok = self.dcgm.apply(
            gpus, lambda index, uuid, code: self._record_xid(collector.Gpu(index, uuid), code, now), now
        )
        self._dcgm_failed = self._dcgm_failed or not ok

    def build_status(self, sample: collector.Sample) -> status.GPUNodeStatus:
        agent = status.AgentInfo(
            version=__version__,
            backend=self.settings.backend,
            heartbeatSeconds=max(1, round(self.settings.heartbeat_seconds)),
        )
        if sample.driver_version:
            agent["driverVersion"] = sample.driver_version
        if sample.expected_gpus:
            agent["expectedGpuCount"] = sample.expected_gpus
        if sample.max_gpus_seen:
            agent["maxGpuCountSeen"] = sample.max_gpus_seen
        if self.settings.boot_id:
            agent["bootId"] = self.settings.boot_id
        if self.settings.boot_time:
            agent["bootTime"] = self.settings.boot_time
        if self.release is not None:
            agent["canRelease"] = True
        if self._released is not None:
            agent["released"] = self._released
        error = self._error(sample)
        if error is not None:
            agent["error"] = error
        node = status.GPUNodeStatus(agent=agent, summary=changes.summarize(sample.gpus), gpus=sample.gpus)
        if sample.nics is not None:
            node["nics"] = sample.nics
        return node

    def _error(self, sample: collector.Sample) -> status.AgentError | None:
        """The agent's own error for this sample (`status.agent.error`), or None; since when it holds."""
        if not sample.blind:
            self._error_since = None
            return None
        if self._error_since is None:
            self._error_since = timestamps.rfc3339(sample.time)
            log.error("NVML shows no GPU on this GPU node: reporting an agent error, no GPU as lost")
        failed = sorted({error for function, error in sample.errors if function == "nvmlDeviceGetCount"})
        unread = sorted({error for function, error in sample.errors if function in _IDENTITY_READS})
        seen = "NVML lists no GPU"
        if self._nvml_failure is not None:
            seen = f"NVML cannot start ({self._nvml_failure})"
        elif failed:
            seen = f"NVML cannot count GPUs ({', '.join(failed)})"
        elif unread:
            seen = f"NVML lists GPUs but cannot open any ({', '.join(unread)})"
        should = (
            f"the node has {sample.expected_gpus}" if sample.expected_gpus else "the agent runs on a GPU node"
        )
        return status.AgentError(
            reason=vocabulary.AgentErrorReason.NO_GPUS_VISIBLE.value,
            message=(
                f"{seen} since the agent started, but {should}: the container runtime likely hides the "
                f"GPUs from the agent: {access_hints.hint(self.settings.gpu_access)}. "
                "No GPU is judged until the agent sees them."
            ),
            since=self._error_since,
        )

    # --- production loop -------------------------------------------------------------------------------

    def run_forever(self) -> None:
        """Turn every interval (earlier on an NVML event) until `stop` is set (SIGTERM)."""
        self.start()
        next_turn = self.clock()
        while not self.stop.is_set():
            try:
                self.run_once()
            except Exception:
                # A bug in one turn must not end the agent; /healthz notices if turns keep failing.
                log.exception("agent turn failed")
            next_turn += self.settings.interval_seconds
            now = self.clock()
            if next_turn < now:  # we fell behind (slow NVML, suspended process): don't burst to catch up
                next_turn = now + self.settings.interval_seconds
            self.wake.wait(timeout=next_turn - now)
            self.wake.clear()
        log.info("stopping at %s", timestamps.rfc3339(self.clock()))
        self.close()
