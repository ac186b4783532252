"""Synthetic labelled fleet traces: a fleet's history with its ground truth, reproducible by seed.

`generate` writes a trace (`traces`) of a mixed fleet (A100, H100, H200,
L40S; some nodes time-sliced, some in MIG mode) with what a real fleet throws
at the operator:

- fatal faults: uncorrectable ECC (DBE), row-remap failure, XID 79/48/94/95,
  a lost GPU, a driver-requested recovery action; each held until a repair
  (a driver reload that resets the volatile counters) hours later, except a
  row-remap failure or a lost GPU: that node is replaced (REPLACED_FAULTS);
- real stragglers (one job's node 5-30 % slower for hours, under load);
- thermal episodes (one or two GPUs at their slowdown temperature) and
  hardware power-brake episodes (minutes);
- GPU-Boost clock behaviour: every busy GPU's SM clock moves by several
  percent from sample to sample, and software power caps lower a whole node's
  clocks for a few minutes;
- load swings, idle stretches (GPUs idle, clocks down), agent gaps and
  restarts, driver reloads on healthy nodes, and human cordons/uncordons;
- each node's agent pod (`agentpod`, as `record` writes the chart's
  DaemonSet pods): Ready from the node's first sample, NotReady through an
  agent gap (the agent is down, its readiness probe fails), deleted with a
  replaced node.

The statuses are built directly as the agent writes them (the shape of
`gpuhealth_api.status`, the fields the agent reports), not through the
agent's collector: a thousand node-days are a million samples and the
collector's simulated NVML path would take hours. Each node's facts are
sampled every `sample_seconds`, and a sample is written when the agent would
write it: when a significant fact changed (the agent's own
`changes.fingerprint`: counters, XIDs, throttle reasons, crossing the
slowdown temperature, ...; not clocks, utilisation or a degree of
temperature), after `heartbeat_seconds` without a write, and at the agent's
start (the first sample, after an agent gap). `heartbeat_seconds` 0 writes
every sample. Ground truth goes into `truth` records (docs/backtest.md),
written after the header.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import pathlib
import random
from collections.abc import Iterator
from typing import Any, Final

from gpuhealth_agent import changes, simulated
from gpuhealth_api import heartbeats, keys
from gpuhealth_sim.backtest import traces

REVISION: Final = 4
"""Of the generator, in each trace's header: a new one when the same seed writes a different trace
(2: nodes with a row-remap failure or a lost GPU are replaced; 3: agent pods; 4: `--node-faults` draws
more of its own faults), so a cached trace is known stale."""
AGENT_POD_NAMESPACE: Final = "gpu-health"
START: Final = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
"""Traces start at a fixed instant, so the same seed writes the same bytes."""
DAY: Final = 86_400.0


@dataclasses.dataclass(frozen=True)
class Board:
    kind: str
    model: str
    gpus: int
    max_clock: int
    idle_clock: int
    slowdown_celsius: int
    driver: str


BOARDS: Final = {
    "H100": Board("H100", "NVIDIA H100 80GB HBM3", 8, 1980, 345, 87, "570.124.06"),
    "H200": Board("H200", "NVIDIA H200", 8, 1980, 345, 87, "570.124.06"),
    "A100": Board("A100", "NVIDIA A100-SXM4-80GB", 8, 1410, 210, 85, "550.127.05"),
    "L40S": Board("L40S", "NVIDIA L40S", 4, 2520, 210, 88, "550.127.05"),
}
MIX: Final = (("H100", 0.4), ("H200", 0.25), ("A100", 0.2), ("L40S", 0.15))

FATAL_FAULTS: Final = (
    "DBE",
    "RowRemapFailure",
    "XID79",
    "XID48",
    "XID94",
    "XID95",
    "GPULost",
    "RecoveryAction",
)
REPLACED_FAULTS: Final = frozenset({"RowRemapFailure", "GPULost"})
"""Faults whose node is replaced rather than repaired: a row-remap failure sends the GPU back to its
maker, a GPU lost from the bus rarely returns without service. At the fault's end the Node and its
GPUNode are deleted (the fault's `replacedBy` names the new node), and a new node of the same kind
joins PROVISION_SECONDS later, with the rest of the old node's episodes."""
PROVISION_SECONDS: Final = 900.0
DBE_XID: Final = 48
ECC_XIDS: Final = frozenset({DBE_XID, 94, 95})
"""XIDs the driver logs for an uncorrectable ECC error (48 double-bit; 94 contained, 95 uncontained)."""

NODE_FATAL_FAULTS: Final = ("FabricFailed", "PcieFatal")
"""With `Options.node_faults` (issue 27), fatal faults around the GPU core: NVSwitch fabric registration
failed (boards with fabric info only), a fatal PCIe AER error."""
MEMORY_FAULTS: Final = frozenset({"DBE", "RowRemapFailure", "XID48", "XID94", "XID95"})
"""Fatal faults of the GPU's memory: with `Options.node_faults`, WARNED_SHARE of them are preceded by a
MemoryDegrading phase (corrected ECC errors and correctable row remaps growing, XID 92 in some)."""
WARNED_SHARE: Final = 0.6
NODE_FAULT_RATES: Final = {"nvlink": 0.15, "nic": 0.15}
"""With `Options.node_faults`: non-fatal NVLink and NIC episodes per node-day, so that 200 node-days draw
some 20-30 of each (at 0.03 and 0.04 they drew 1 and 6: no test of their rules, issue 47)."""
NODE_FAULTS_FATAL_FACTOR: Final = 3
"""With `Options.node_faults`: fatal faults this many times as often (RATES), so that the node's own
(NODE_FATAL_FAULTS, drawn with the others) come up in every couple of hundred node-days."""
NVLINKS: Final = {"H100": 18, "H200": 18, "A100": 12}
"""NVLinks per GPU of the SXM boards (an L40S has none: its facts carry no `nvlink`)."""
FABRIC_BOARDS: Final = frozenset({"H100", "H200"})
"""Boards whose NVML reports fabric info (NVSwitch systems)."""
NIC_RATE_GBPS: Final = {"H100": 400.0, "H200": 400.0, "A100": 200.0, "L40S": 100.0}

RATES: Final = {
    "fatal": 0.03,
    "straggler": 0.04,
    "thermal": 0.25,
    "powerBrake": 0.1,
    "powerCap": 1.0,
    "idle": 1.0,
    "agentGap": 0.12,
    "driverReload": 0.05,
    "humanCordon": 0.05,
}
"""Episodes per node-day."""

JITTER: Final = 0.035
"""Standard deviation of a busy GPU's clock from sample to sample, as a fraction of its max (GPU Boost)."""


@dataclasses.dataclass(frozen=True)
class Options:
    node_days: float
    seed: int
    nodes: int | None = None
    sample_seconds: float = 60.0
    """How often each node's facts are sampled (the agent collects every 5 s; coarser is cheaper)."""
    heartbeat_seconds: float = float(heartbeats.DEFAULT_HEARTBEAT_SECONDS)
    """The agent's heartbeat: longest time without a write if nothing significant changed (0: write all)."""
    node_faults: bool = False
    """Issue 27's faults and facts: NVLink, fabric, NICs, PCIe AER, memory trends before memory failures.
    Off by default, so a seed writes the trace it wrote before (the benchmarks' figures stay comparable)."""
    creeping_counters: bool = False
    """Issue 52: PCIe AER correctable errors and (SXM boards) NVLink CRC counts creeping up slowly on most
    nodes, as real fleets' do, each well below its rule's rate (never a fault). A creeping counter is a
    change in what a verdict reads, so such a trace is the replay's hard case, which the seed's is not.
    Off by default: a seed writes the trace it wrote before."""


@dataclasses.dataclass
class Episode:
    kind: str
    start: float
    end: float
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def covers(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclasses.dataclass
class NodePlan:
    name: str
    board: Board
    sharing: str | None
    phase: float
    episodes: list[Episode]
    load: float = 0.9
    node_faults: bool = False
    ecc_corrected: int = 0
    boot: int = 0
    joins: float = 0.0
    leaves: float = math.inf
    """When the node is in the fleet: a replaced node leaves, its replacement joins (REPLACED_FAULTS)."""
    creep: list[tuple[int, float, int, float]] | None = None
    """Per GPU with `Options.creeping_counters` (None: no creep): (AER correctable at 0, per hour, NVLink
    CRC errors at 0, per hour)."""


def default_nodes(node_days: float) -> int:
    """Fleet size for a trace: up to 100 nodes (cohorts of at least 5 per model), at least 12."""
    return max(12, min(100, round(math.sqrt(node_days * 10))))


def plan_fleet(options: Options) -> tuple[list[NodePlan], float]:
    """Every node's board and episodes, and the trace's length in seconds."""
    rng = random.Random(options.seed)
    count = options.nodes or default_nodes(options.node_days)
    duration = options.node_days / count * DAY
    plans: list[NodePlan] = []
    for index in range(count):
        kind = _pick_model(index, count)
        board = BOARDS[kind]
        sharing = None
        if index % 17 == 5:
            sharing = "timeSlicing"
        elif index % 23 == 11 and kind in ("A100", "H100"):
            sharing = "mig"
        name = f"gpu-{kind.lower()}-{index:03d}"
        phase = rng.uniform(0, options.sample_seconds)
        episodes = _episodes(rng, duration, board if options.node_faults else None)
        plans.append(NodePlan(name, board, sharing, phase, episodes, node_faults=options.node_faults))
    if options.creeping_counters:
        _plan_creep(
            plans, random.Random(options.seed * 7919 + 52)
        )  # its own stream: the rest stays as it was
    return plans + [r for p in plans if (r := _replacement(p, duration)) is not None], duration


CREEPING_SHARE: Final = 0.8
"""With `Options.creeping_counters`: the share of nodes whose counters creep."""
CREEP_AER_PER_HOUR: Final = (0.5, 12.0)
CREEP_CRC_PER_HOUR: Final = (0.2, 6.0)
"""Creep rates per GPU (uniform in these bounds): far below the rules' 100 per hour (`NvLinkDegraded`)."""


def _plan_creep(plans: list[NodePlan], rng: random.Random) -> None:
    for plan in plans:
        if rng.random() >= CREEPING_SHARE:
            continue
        plan.creep = [
            (
                rng.randrange(500),
                rng.uniform(*CREEP_AER_PER_HOUR),
                rng.randrange(200),
                rng.uniform(*CREEP_CRC_PER_HOUR) if rng.random() < 0.5 else 0.0,
            )
            for _ in range(plan.board.gpus)
        ]


def add_creep(gpu: dict[str, Any], plan: NodePlan, index: int, t: float) -> None:
    """The creeping counters of one GPU at `t` (`Options.creeping_counters`), on top of any episode's."""
    if plan.creep is None:
        return
    aer0, aer_rate, crc0, crc_rate = plan.creep[index]
    aer = gpu["pcie"].setdefault("aer", {"fatal": 0, "nonFatal": 0, "correctable": 0})
    aer["correctable"] = aer.get("correctable", 0) + aer0 + int(aer_rate * t / 3600)
    if plan.board.kind not in NVLINKS:
        return
    nvlink = gpu.setdefault(
        "nvlink",
        {
            "linksUp": NVLINKS[plan.board.kind],
            "linksDown": 0,
            "crcErrors": 0,
            "replayErrors": 0,
            "recoveryErrors": 0,
        },
    )
    nvlink["crcErrors"] += crc0 + int(crc_rate * t / 3600)


def _replacement(plan: NodePlan, duration: float) -> NodePlan | None:
    """The node that replaces `plan`'s after a fault in REPLACED_FAULTS, with the episodes after it
    (None: no such fault, or its node is still faulty when the trace ends)."""
    fatal = next(
        (e for e in plan.episodes if e.kind == "fatal" and e.detail["fault"] in REPLACED_FAULTS), None
    )
    if fatal is None or fatal.end + PROVISION_SECONDS >= duration:
        return None
    new = dataclasses.replace(plan, name=f"{plan.name}-r", joins=fatal.end + PROVISION_SECONDS)
    new.episodes = [e for e in plan.episodes if e.start >= new.joins]
    plan.episodes = [e for e in plan.episodes if e.start < fatal.end]
    plan.leaves = fatal.end
    fatal.detail["replacedBy"] = new.name
    return new


def _pick_model(index: int, count: int) -> str:
    edge = 0.0
    for kind, share in MIX:
        edge += share
        if index < round(edge * count):
            return kind
    return MIX[-1][0]


def _episodes(rng: random.Random, duration: float, board: Board | None = None) -> list[Episode]:
    """A node's episodes: major ones (fatal, straggler, idle, gap, cordon, reload) never overlap. With a
    `board` (`Options.node_faults`), its fatal faults include NODE_FATAL_FAULTS and memory warnings,
    and NVLink and NIC episodes come on top."""
    days = duration / DAY
    major: list[Episode] = []
    wanted = []
    for kind in ("fatal", "straggler", "idle", "agentGap", "humanCordon", "driverReload"):
        rate = RATES[kind] * (NODE_FAULTS_FATAL_FACTOR if board is not None and kind == "fatal" else 1)
        for _ in range(_poisson(rng, rate * days)):
            wanted.append((rng.uniform(600, duration - 600), kind))
    taken: list[tuple[float, float]] = []
    priority = ("fatal", "straggler", "humanCordon", "agentGap", "driverReload", "idle")
    for start, kind in sorted(wanted, key=lambda w: (priority.index(w[1]), w[0])):
        length = _length(rng, kind)
        end = min(start + length, duration)
        if any(start < b + 1800 and a - 1800 < end for a, b in taken):
            continue  # keep a half hour between major episodes so every one is judged on its own
        taken.append((start, end))
        major.append(Episode(kind, start, end, _detail(rng, kind, board)))
    major.sort(key=lambda e: e.start)
    minor: list[Episode] = []
    kinds = ["thermal", "powerBrake", "powerCap"]
    if board is not None:
        kinds += [k for k in NODE_FAULT_RATES if k != "nvlink" or board.kind in NVLINKS]
    for kind in kinds:
        for _ in range(_poisson(rng, {**RATES, **NODE_FAULT_RATES}[kind] * days)):
            start = rng.uniform(0, duration)
            end = start + _length(rng, kind)
            if any(e.start - 600 < end and start < e.end + 600 for e in major):
                continue  # minor episodes on a node otherwise quiet, so the truth stays unambiguous
            minor.append(Episode(kind, start, end, _detail(rng, kind, board)))
    return sorted(major + minor, key=lambda e: e.start)


def _poisson(rng: random.Random, mean: float) -> int:
    count, limit, product = 0, math.exp(-mean), rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


def _length(rng: random.Random, kind: str) -> float:
    minutes = {
        "fatal": (120, 480),
        "straggler": (60, 360),
        "idle": (30, 240),
        "agentGap": (1, 10),
        "humanCordon": (60, 480),
        "driverReload": (1, 2),
        "thermal": (2, 15),
        "powerBrake": (1, 3),
        "powerCap": (1, 4),
        "nvlink": (30, 240),
        "nic": (10, 120),
    }[kind]
    return rng.uniform(*minutes) * 60


def _detail(rng: random.Random, kind: str, board: Board | None = None) -> dict[str, Any]:
    if kind == "fatal" and board is not None:
        extra = NODE_FATAL_FAULTS if board.kind in FABRIC_BOARDS else NODE_FATAL_FAULTS[1:]
        detail: dict[str, Any] = {"fault": rng.choice(FATAL_FAULTS + extra), "gpu": rng.randrange(4)}
        if detail["fault"] in MEMORY_FAULTS and rng.random() < WARNED_SHARE:
            # Corrected errors climbing for hours before the uncorrectable one (the share and the rates
            # are this generator's choice; published fleet studies see most such failures preceded so).
            detail["warning"] = {
                "seconds": round(rng.uniform(1, 12) * 3600, 3),
                "correctedPerHour": rng.randrange(30, 300),
                "xid92": rng.random() < 0.5,
            }
        return detail
    if kind == "fatal":
        return {"fault": rng.choice(FATAL_FAULTS), "gpu": rng.randrange(4)}
    if kind == "nvlink":
        return {"gpu": rng.randrange(8), "mode": rng.choice(("linkDown", "crcErrors")), "perHour": 2000}
    if kind == "nic":
        return {
            "port": rng.randrange(2),
            "mode": rng.choice(("down", "rate", "symbolErrors")),
            "perHour": 2000,
        }
    if kind == "straggler":
        return {"slowdown": round(rng.uniform(0.05, 0.30), 3), "gpus": rng.choice(("one", "all"))}
    if kind == "thermal":
        return {"gpus": rng.sample(range(4), rng.choice((1, 2)))}
    if kind == "powerCap":
        return {"factor": round(rng.uniform(0.85, 0.94), 3)}
    return {}


def _time(seconds: float) -> str:
    moment = START + datetime.timedelta(seconds=round(seconds, 3))
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def node_object(plan: NodePlan, unschedulable: bool) -> dict[str, Any]:
    labels = {
        keys.GPU_PRESENT_LABEL: "true",
        keys.GPU_PRODUCT_LABEL: plan.board.model.replace(" ", "-"),
        keys.GPU_COUNT_LABEL: str(plan.board.gpus),
        "kubernetes.io/hostname": plan.name,
    }
    capacity = plan.board.gpus
    if plan.sharing == "timeSlicing":
        labels["nvidia.com/gpu.replicas"] = "4"
        labels["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
        capacity = plan.board.gpus * 4
    elif plan.sharing == "mig":
        labels["nvidia.com/mig.strategy"] = "single"
        labels["nvidia.com/mig.config"] = "all-1g.10gb"
        capacity = plan.board.gpus * 7
    return {
        "metadata": {"name": plan.name, "labels": labels, "annotations": {}},
        "spec": {"unschedulable": unschedulable, "taints": []},
        "status": {"capacity": {keys.GPU_RESOURCE: str(capacity)}},
    }


def _truth(plan: NodePlan) -> Iterator[dict[str, Any]]:
    yield {
        "kind": "truth",
        "type": "node",
        "node": plan.name,
        "model": plan.board.model,
        "gpus": plan.board.gpus,
        "sharing": plan.sharing,
    }
    for episode in plan.episodes:
        yield {
            "kind": "truth",
            "type": episode.kind,
            "node": plan.name,
            "start": round(episode.start, 3),
            "end": round(episode.end, 3),
            **{k: v for k, v in episode.detail.items() if k != "warning"},
        }
        warning = episode.detail.get("warning")
        if warning is not None:
            yield {
                "kind": "truth",
                "type": "memoryDegrading",
                "node": plan.name,
                "start": round(max(0.0, episode.start - warning["seconds"]), 3),
                "end": round(episode.start, 3),
                "gpu": episode.detail["gpu"],
                "fault": episode.detail["fault"],
            }


class _Sampler:
    """One node's agent status at each sample time, from its plan."""

    def __init__(self, plan: NodePlan, rng: random.Random, period: float) -> None:
        self.plan = plan
        self.period = period
        """The agent's heartbeat as it states it (`heartbeatSeconds`)."""
        self.written: tuple[str, float] | None = None
        """The fingerprint and time of the last write (None: the agent (re)started, it writes at once)."""
        self.rng = rng
        self.observed = [_time(0.0)] * plan.board.gpus
        self.faulted: dict[str, Any] | None = None
        self.previous: dict[str, Any] | None = None

    def sample(self, t: float) -> dict[str, Any]:
        plan, rng, board = self.plan, self.rng, self.plan.board
        active = [e for e in plan.episodes if e.covers(t)]
        kinds = {e.kind: e for e in active}
        if rng.random() < 0.02:
            plan.load = min(1.0, max(0.35, plan.load + rng.uniform(-0.25, 0.25)))  # load swings
        idle = "idle" in kinds
        fatal = kinds.get("fatal")
        straggler = kinds.get("straggler")
        cap = kinds["powerCap"].detail["factor"] if "powerCap" in kinds else 1.0
        gpus = []
        for index in range(board.gpus):
            gpu = self._gpu(index, t, idle, cap, kinds, straggler)
            if plan.node_faults:
                add_node_facts(gpu, plan, index, t)
            if plan.creep is not None:
                add_creep(gpu, plan, index, t)
            if fatal is not None and index == fatal.detail["gpu"] % board.gpus:
                apply_fault(gpu, fatal, t)
            gpus.append(gpu)
        for index, gpu in enumerate(gpus):
            view = (
                gpu["ecc"]["uncorrectedVolatile"],
                gpu["remappedRows"]["failure"],
                len(gpu["xids"]),
                gpu["lost"],
                gpu["recoveryAction"],
                tuple(gpu["clockEventReasons"]),
                gpu["temperatureCelsius"] >= board.slowdown_celsius,
            )
            previous = self.previous["gpus"][index] if self.previous else None
            if previous is not None and previous.get("_view") != view:
                self.observed[index] = _time(t)
            gpu["_view"] = view
            gpu["observedTime"] = self.observed[index]
        status = {
            "agent": {
                "version": "0.1.0",
                "backend": "nvml",
                "driverVersion": board.driver,
                "lastHeartbeatTime": _time(t),
                "heartbeatSeconds": max(1, round(self.period)),
                "expectedGpuCount": board.gpus,
                "bootId": f"boot-{plan.name}-{plan.boot}",
            },
            "summary": {
                "gpuCount": board.gpus,
                "model": board.model,
                "maxTemperatureCelsius": max(g["temperatureCelsius"] for g in gpus),
            },
            "gpus": gpus,
        }
        if plan.node_faults:
            status["nics"] = nics(plan, t)
        self.previous = status
        return status

    def _gpu(  # noqa: PLR0917 - one GPU's inputs
        self,
        index: int,
        t: float,
        idle: bool,
        cap: float,
        kinds: dict[str, Episode],
        straggler: Episode | None,
    ) -> dict[str, Any]:
        plan, rng, board = self.plan, self.rng, self.plan.board
        reasons: list[str] = []
        if idle:
            utilization, clock, temperature = 0, board.idle_clock, 34 + rng.randrange(4)
            reasons.append("GpuIdle")
        else:
            busy = straggler is not None or plan.load
            utilization = min(
                100, max(15, round(100 * (0.97 if straggler is not None else busy) + rng.gauss(0, 5)))
            )
            ratio = min(1.0, max(0.82, 0.975 + rng.gauss(0, JITTER)))
            if cap < 1.0:
                ratio *= cap
                reasons.append("SwPowerCap")
            if straggler is not None and (straggler.detail["gpus"] == "all" or index == 0):
                ratio /= 1 + straggler.detail["slowdown"]
            temperature = 55 + round(20 * utilization / 100) + rng.randrange(4)
            thermal = kinds.get("thermal")
            if thermal is not None and index in thermal.detail["gpus"]:
                temperature = board.slowdown_celsius + rng.randrange(3)
                reasons.append("SwThermalSlowdown")
                ratio *= 0.85
            if "powerBrake" in kinds:
                reasons.append("HwPowerBrakeSlowdown")
                ratio *= 0.8
            clock = round(board.max_clock * ratio / 15) * 15
        plan.ecc_corrected += 1 if rng.random() < 0.001 else 0
        return {
            "index": index,
            "uuid": simulated.gpu_uuid(plan.name, index),  # NVML's form, as the simulated agent reports
            "model": board.model,
            "pciBusId": f"00000000:{index + 0x10:02X}:00.0",
            "temperatureCelsius": temperature,
            "slowdownTemperatureCelsius": board.slowdown_celsius,
            "smClockMHz": clock,
            "maxSmClockMHz": board.max_clock,
            **({} if plan.sharing == "mig" else {"utilizationPercent": utilization}),
            "ecc": {"correctedVolatile": plan.ecc_corrected if index == 0 else 0, "uncorrectedVolatile": 0},
            "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
            "xids": [],
            "clockEventReasons": sorted(reasons),
            "recoveryAction": "None",
            "pcie": {
                "generation": 4 if board.gpus == 4 else 5,
                "maxGeneration": 4 if board.gpus == 4 else 5,
                "width": 16,
                "maxWidth": 16,
            },
            "lost": False,
        }


def apply_fault(gpu: dict[str, Any], fatal: Episode, t: float) -> None:
    """Write a fatal fault into one GPU's facts at trace time `t`, as the agent would read it."""
    fault = fatal.detail["fault"]
    began = _time(fatal.start)
    if fault == "DBE":
        gpu["ecc"]["uncorrectedVolatile"] = 1 + int((t - fatal.start) // 3600)
    elif fault == "RowRemapFailure":
        gpu["remappedRows"] = {"correctable": 3, "uncorrectable": 1, "pending": False, "failure": True}
    elif fault.startswith("XID"):
        code = int(fault[3:])
        gpu["xids"] = [{"code": code, "count": 1, "lastSeen": began}]
        if code in ECC_XIDS:
            # The XID is the driver's log line of an uncorrectable ECC error: the volatile counter
            # counts the same error, and a contained or uncontained one leaves a row to remap.
            gpu["ecc"]["uncorrectedVolatile"] = 1
            if code != DBE_XID:
                gpu["remappedRows"] = {**gpu.get("remappedRows", {}), "pending": True}
    elif fault == "GPULost":
        gpu["lost"] = True
        gpu.pop("utilizationPercent", None)
    elif fault == "RecoveryAction":
        gpu["recoveryAction"] = "GpuReset"
    elif fault == "FabricFailed":
        gpu["fabric"] = {**gpu.get("fabric", {}), "state": "Completed", "status": "Failure"}
    elif fault == "PcieFatal":
        gpu["pcie"]["aer"] = {**gpu["pcie"].get("aer", {}), "fatal": 1, "nonFatal": 2}


def _grown(per_hour: float, start: float, end: float, t: float) -> int:
    """A counter that grew at `per_hour` from `start` to `end` (and kept its value after), at `t`."""
    return 0 if t < start else int(per_hour * (min(t, end) - start) / 3600)


def add_node_facts(gpu: dict[str, Any], plan: NodePlan, index: int, t: float) -> None:
    """Issue 27's facts of one GPU (`Options.node_faults`): NVLink on SXM boards, fabric info on NVSwitch
    ones, PCIe AER everywhere, with the NVLink episodes and memory warnings of `plan` written in."""
    kind = plan.board.kind
    if kind in NVLINKS:
        nvlink = {
            "linksUp": NVLINKS[kind],
            "linksDown": 0,
            "crcErrors": 0,
            "replayErrors": 0,
            "recoveryErrors": 0,
        }
        for episode in plan.episodes:
            if episode.kind != "nvlink" or episode.detail["gpu"] % plan.board.gpus != index:
                continue
            if episode.detail["mode"] == "linkDown" and episode.covers(t):
                nvlink["linksUp"], nvlink["linksDown"] = NVLINKS[kind] - 1, 1
            elif episode.detail["mode"] == "crcErrors":
                nvlink["crcErrors"] += _grown(episode.detail["perHour"], episode.start, episode.end, t)
        gpu["nvlink"] = nvlink
    if kind in FABRIC_BOARDS:
        gpu["fabric"] = {"state": "Completed", "status": "Success", "cliqueId": 0}
    gpu["pcie"]["aer"] = {"fatal": 0, "nonFatal": 0, "correctable": 0}
    for episode in plan.episodes:
        warning = episode.detail.get("warning") if episode.kind == "fatal" else None
        if warning is None or episode.detail["gpu"] % plan.board.gpus != index:
            continue
        began = episode.start - warning["seconds"]
        if not began <= t < episode.end:
            continue
        grown = _grown(warning["correctedPerHour"], began, episode.start, t)
        gpu["ecc"]["correctedVolatile"] += grown
        gpu["remappedRows"]["correctable"] += grown // 50
        if warning["xid92"] and t >= began + warning["seconds"] / 2:
            gpu["xids"] = [{"code": 92, "count": 1, "lastSeen": _time(began + warning["seconds"] / 2)}]


def nics(plan: NodePlan, t: float) -> list[dict[str, Any]]:
    """The node's two InfiniBand/RoCE ports (`Options.node_faults`), with its NIC episodes written in."""
    ports = []
    for port in range(2):
        nic: dict[str, Any] = {
            "name": f"mlx5_{port}",
            "port": 1,
            "state": "ACTIVE",
            "physState": "LinkUp",
            "rateGbps": NIC_RATE_GBPS[plan.board.kind],
            "linkDowned": 0,
            "symbolErrors": 0,
            "rcvErrors": 0,
        }
        for episode in plan.episodes:
            if episode.kind != "nic" or episode.detail["port"] != port or t < episode.start:
                continue
            mode = episode.detail["mode"]
            if mode == "down":
                nic["linkDowned"] += 1
                if episode.covers(t):
                    nic["state"], nic["physState"] = "DOWN", "Disabled"
            elif mode == "rate" and episode.covers(t):
                nic["rateGbps"] /= 2
            elif mode == "symbolErrors":
                nic["symbolErrors"] += _grown(episode.detail["perHour"], episode.start, episode.end, t)
        ports.append(nic)
    return ports


def generate(options: Options, out: pathlib.Path) -> dict[str, int]:
    """Write the trace; counts of what it holds (records, nodes, truth records)."""
    rng = random.Random(options.seed + 1)
    plans, duration = plan_fleet(options)
    present = {p.name for p in plans if p.joins == 0}
    header = {
        "start": START.timestamp(),
        "generator": {
            "revision": REVISION,
            **({"nodeFaults": True} if options.node_faults else {}),
            **({"creepingCounters": True} if options.creeping_counters else {}),
            "nodeDays": options.node_days,
            "seed": options.seed,
            "nodes": len(present),
            "replaced": len(plans) - len(present),
            "sampleSeconds": options.sample_seconds,
            "heartbeatSeconds": options.heartbeat_seconds,
        },
    }
    counts = {"nodes": len(present), "records": 0, "truth": 0}
    period = options.heartbeat_seconds or options.sample_seconds
    samplers = {p.name: _Sampler(p, random.Random(rng.random()), period) for p in plans}
    with traces.Writer(out, header) as writer:
        for plan in plans:
            for truth in _truth(plan):
                writer.write(truth)
                counts["truth"] += 1
        for plan in plans:
            if plan.name in present:
                writer.write({"kind": "node", "t": 0.0, "object": node_object(plan, False)})
        pods: dict[str, bool] = {}
        """Each present node's agent pod: Ready or not."""
        order = sorted(plans, key=lambda p: p.phase)
        last: dict[str, dict[str, Any]] = {}
        cordoned: dict[str, bool] = {p.name: False for p in plans}
        steps = int(duration // options.sample_seconds)
        for step in range(steps + 1):
            for plan in order:
                t = step * options.sample_seconds + plan.phase
                if t >= duration or t < plan.joins:
                    continue
                if t >= plan.leaves or plan.name not in present:
                    counts["records"] += _join_or_leave(writer, plan, t, present, pods)
                if t >= plan.leaves:
                    continue
                counts["records"] += _agent_pod(writer, plan, t, pods)
                counts["records"] += _sample_node(
                    writer, plan, samplers[plan.name], t, last, cordoned, options.heartbeat_seconds
                )
    return counts


def _join_or_leave(
    writer: traces.Writer, plan: NodePlan, t: float, present: set[str], pods: dict[str, bool]
) -> int:
    """A replacement's Node at its first sample; a replaced node's deletion (its Node, then the
    garbage collector's of its GPUNode and its agent pod) at its first sample time after it left."""
    if plan.name not in present and t < plan.leaves:
        present.add(plan.name)
        writer.write({"kind": "node", "t": round(t, 3), "object": node_object(plan, False)})
        return 1
    if plan.name in present and t >= plan.leaves:
        present.discard(plan.name)
        for kind in ("node", "gpunode"):
            writer.write({"kind": kind, "t": round(t, 3), "name": plan.name, "deleted": True})
        if pods.pop(plan.name, None) is not None:
            writer.write({"kind": "agentpod", "t": round(t, 3), "name": _pod_name(plan), "deleted": True})
            return 3
        return 2
    return 0


def _agent_pod(writer: traces.Writer, plan: NodePlan, t: float, pods: dict[str, bool]) -> int:
    """The node's agent pod when its readiness changes: Ready but during an agent gap."""
    ready = not _agent_down(plan, t)
    if pods.get(plan.name) == ready:
        return 0
    pods[plan.name] = ready
    pod = {"name": _pod_name(plan), "node": plan.name, "ready": ready, "since": _time(t)}
    writer.write({"kind": "agentpod", "t": round(t, 3), **pod})
    return 1


def _agent_down(plan: NodePlan, t: float) -> bool:
    """Whether the node's agent is down at `t` (an agent gap): no report, its pod NotReady."""
    return any(e.kind == "agentGap" and e.covers(t) for e in plan.episodes)


def _pod_name(plan: NodePlan) -> str:
    return f"{AGENT_POD_NAMESPACE}/gpu-health-agent-{plan.name}"


def _sample_node(  # noqa: PLR0917 - one sample's inputs
    writer: traces.Writer,
    plan: NodePlan,
    sampler: _Sampler,
    t: float,
    last: dict[str, dict[str, Any]],
    cordoned: dict[str, bool],
    heartbeat_seconds: float,
) -> int:
    written = 0
    human = any(e.kind == "humanCordon" and e.covers(t) for e in plan.episodes)
    if human != cordoned[plan.name]:
        cordoned[plan.name] = human
        writer.write({"kind": "node", "t": round(t, 3), "object": node_object(plan, human)})
        written += 1
    if _agent_down(plan, t):
        sampler.written = None  # the agent is down: no report; when it is back it writes at once
        return written
    for episode in plan.episodes:
        if episode.kind in ("driverReload", "fatal") and episode.end <= t and not episode.detail.get("_done"):
            episode.detail["_done"] = True  # the repair (or the reload) resets volatile counters
            plan.boot += 1
            plan.ecc_corrected = 0
    status = sampler.sample(t)
    clean = {**status, "gpus": [{k: v for k, v in g.items() if k != "_view"} for g in status["gpus"]]}
    if heartbeat_seconds > 0:
        fingerprint = changes.fingerprint(clean)  # type: ignore[arg-type]  # the agent's status shape
        if sampler.written is not None:
            state = changes.WriteState(sampler.written[0], sampler.written[1])
            if changes.write_reason(state, fingerprint, t, heartbeat_seconds) is None:
                return written  # nothing significant changed and the heartbeat is not due: no write
        sampler.written = (fingerprint, t)
    before = last.get(plan.name)
    if before is None:
        writer.write({"kind": "gpunode", "t": round(t, 3), "name": plan.name, "status": clean})
    else:
        writer.write(
            {
                "kind": "gpunode",
                "t": round(t, 3),
                "name": plan.name,
                "patch": traces.status_patch(before, clean),
            }
        )
    last[plan.name] = clean
    return written + 1
