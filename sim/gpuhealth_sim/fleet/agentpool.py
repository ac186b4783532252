"""A simulated GPU fleet in one process: kwok Nodes plus one real agent per node.

A thread per agent would not fit a thousand nodes on a small machine, and
an agent turn is short (a simulated NVML read, a write only on change or
heartbeat), so a small pool of worker threads shares one schedule: a heap
of (due time, node). A worker takes the earliest due node, runs its turn,
and puts it back one interval later; a node is never in two turns at once.
Turns start staggered across the first interval so the API server sees a
steady trickle, not a thundering herd. When the pool falls behind, a late
node is rescheduled from now rather than bursting to catch up, and the
lateness is counted (`Stats`) so a benchmark can tell whether the fleet
keeps up.

All agents share one Kubernetes ApiClient (its connection pool sized for
the workers). Things done to a node from outside (a repair Job's GPU reset
or reboot, `reset_gpus`, `reboot`) wait for the node's next turn and run in
it, before the agent reads its GPUs, so they never race the agent.
`stop()` lets running turns finish and returns; Nodes are left in place
unless `delete_nodes()` is called.
"""

import concurrent.futures
import dataclasses
import heapq
import logging
import threading
import time
from collections.abc import Callable, Sequence

from kubernetes import client

from gpuhealth_agent import release, runner, scenario, simulated
from gpuhealth_sim.fleet import agents, dra, fleetfile, nodes

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 8
MAX_DEFAULT_WORKERS = 64
NODES_PER_WORKER = 16


def default_workers(nodes: int) -> int:
    """Threads for a fleet of `nodes`: 8 for small fleets, one per 16 nodes up to 64.

    Turns are short CPU work, but a status write waits on the API server; on a
    busy API server (a second per write) a thousand nodes keep ~17 writes in
    flight, and with too few threads those waits starve every other node's
    collection. Waiting threads cost no CPU, so err on the side of more.
    """
    return max(DEFAULT_WORKERS, min(MAX_DEFAULT_WORKERS, nodes // NODES_PER_WORKER))


STOP_TIMEOUT_SECONDS = 30.0


@dataclasses.dataclass
class Stats:
    """How the fleet is keeping up (cumulative since start)."""

    turns: int = 0
    failed_turns: int = 0
    writes: int = 0
    write_failures: int = 0
    late_turns: int = 0
    """Turns that started more than one interval after they were due."""
    max_lateness_seconds: float = 0.0
    busy_seconds: float = 0.0
    """Sum of turn durations across workers."""


class Schedule:
    """Due times of nodes (indices), earliest first; not thread-safe (the fleet holds its lock)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, index: int, due: float) -> None:
        heapq.heappush(self._heap, (due, index))

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, int]:
        return heapq.heappop(self._heap)


def next_due(due: float, finished: float, interval: float) -> float:
    """When a node runs next: an interval after it was due, or after now if it fell an interval behind."""
    following = due + interval
    return following if following > finished else finished + interval


class Fleet:
    """Creates a fleet's Nodes and drives one agent per node (see module docstring)."""

    def __init__(
        self,
        spec: fleetfile.Fleet,
        api_client: client.ApiClient,
        *,
        workers: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.api_client = api_client
        self.workers = workers or spec.workers or default_workers(len(spec.nodes))
        self.clock = clock
        self.started_at: float | None = None
        """Scenario time 0 (epoch seconds): when start() was called."""
        self.agents: list[runner.Agent | None] = []
        """One per node, built by a worker on the node's first turn (so the first nodes report at once)."""
        self.libs: list[simulated.SimulatedNvml | None] = []
        """Each node's simulated GPUs, built with its first agent; a reboot keeps them."""
        self.boots: list[int] = []
        """Reboots of each node so far (its agent's bootId follows, agents.boot_id)."""
        self._index = {plan.name: i for i, plan in enumerate(spec.nodes)}
        self._pending: dict[int, list[tuple[str, Sequence[int] | None, concurrent.futures.Future[None]]]] = {}
        self._builder: agents.Builder | None = None
        self.stats = Stats()
        self._schedule = Schedule()
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- Nodes -----------------------------------------------------------------------------------

    def create_nodes(self) -> None:
        """Create (or adopt) every Node with its GPU labels and capacity, and DRA pools' slices."""
        core = client.CoreV1Api(self.api_client)
        with concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="fleet-nodes") as pool:
            for future in [pool.submit(nodes.ensure, core, plan) for plan in self.spec.nodes]:
                future.result()
        dra.ensure(self.api_client, self.spec.nodes)

    def delete_nodes(self) -> None:
        """Delete the fleet's Nodes; their GPUNodes go with them (owner references)."""
        core = client.CoreV1Api(self.api_client)
        names = [plan.name for plan in self.spec.nodes]
        batches = [names[i :: self.workers] for i in range(self.workers)]
        with concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="fleet-nodes") as pool:
            for future in [pool.submit(nodes.delete, core, batch) for batch in batches]:
                future.result()
        dra.delete(self.api_client, [plan.name for plan in self.spec.nodes if plan.dra])

    # -- agents ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Build the agents and start the workers; scenario time starts now."""
        if self._threads:
            raise RuntimeError("the fleet is already running")
        self.started_at = self.clock()
        self._builder = agents.Builder(self.spec, self.api_client, started_at=self.started_at)
        count = len(self.spec.nodes)
        self.agents = [None] * count
        self.libs = [None] * count
        self.boots = [0] * count
        interval = self.spec.interval_seconds
        with self._lock:
            for index in range(count):
                self._schedule.push(index, self.started_at + interval * index / max(1, count))
        self._stopping.clear()
        self._threads = [
            threading.Thread(target=self._work, name=f"fleet-worker-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()
        log.info("fleet started: %d nodes, %d workers, interval %.1fs", count, self.workers, interval)

    def stop(self, timeout_seconds: float = STOP_TIMEOUT_SECONDS) -> None:
        """Let running turns finish, stop the workers, close the agents; idempotent."""
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        deadline = time.monotonic() + timeout_seconds
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        self._threads = []
        with self._lock:
            abandoned = [done for asked in self._pending.values() for _, _, done in asked]
            self._pending.clear()
        for done in abandoned:
            done.set_exception(RuntimeError("the fleet stopped"))
        for agent in self.agents:
            if agent is None:
                continue
            try:
                agent.close()
            except Exception as error:  # closing a simulated NVML cannot matter enough to stop the others
                log.debug("closing agent %s: %s", agent.settings.node_name, error)

    def last_writes(self) -> list[float | None]:
        """Per node, when its agent last wrote its GPUNode successfully (epoch seconds; None: not yet)."""
        return [
            agent.reporter.state.written_at if agent is not None and agent.reporter is not None else None
            for agent in list(self.agents)
        ]

    def has_node(self, node: str) -> bool:
        return node in self._index

    def scenario(self, node: str) -> scenario.Scenario:
        """The node's scenario as its agent replays it (its `repair` says how repair Jobs turn out)."""
        if self._builder is None:
            raise RuntimeError("the fleet is not running")
        return self._builder.scenario_for(self.spec.nodes[self._index[node]])

    def ask_release(self, node: str, value: str | None) -> None:
        """The operator's GPU release ask on the node's GPUNode (None: none), for its agent's next turn."""
        index = self._index.get(node)
        agent = self.agents[index] if index is not None and index < len(self.agents) else None
        source = agent.release if agent is not None else None
        if isinstance(source, release.Fixed) and source.value != value:
            source.value = value

    def holds_gpus(self, node: str) -> bool:
        """Whether the node's agent has NVML open (a reset meanwhile fails: the GPU is in use)."""
        index = self._index.get(node)
        if index is None or self._builder is None:
            return False
        return bool(getattr(self._lib(index), "initialized", False))

    def reset_gpus(self, node: str, gpus: Sequence[int]) -> concurrent.futures.Future[None]:
        """Reset these GPUs (scenario indexes) of `node` at its next turn, as `nvidia-smi --gpu-reset`;
        the future is done once the reset is in place (the agent reads it in that very turn)."""
        return self._enqueue(node, "reset", gpus)

    def reboot(self, node: str) -> concurrent.futures.Future[None]:
        """Reboot `node` at its next turn: every GPU reset, its agent restarted with a new bootId."""
        return self._enqueue(node, "reboot", None)

    def _enqueue(self, node: str, what: str, gpus: Sequence[int] | None) -> concurrent.futures.Future[None]:
        index = self._index[node]  # KeyError: not a node of this fleet
        if not self._threads:
            raise RuntimeError("the fleet is not running")
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            self._pending.setdefault(index, []).append((what, gpus, done))
        return done

    def _perform(self, index: int) -> None:
        """Run what was asked of the node since its last turn (called by the worker that owns it now)."""
        with self._lock:
            asked = self._pending.pop(index, [])
        for what, gpus, done in asked:
            try:
                lib = self._lib(index)
                if what == "reset":
                    lib.reset_gpus(gpus)
                else:
                    old = self.agents[index]
                    if old is not None:
                        old.close()
                    lib.reset_gpus(None)
                    self.boots[index] += 1
                    assert self._builder is not None
                    self.agents[index] = self._builder.build(self.spec.nodes[index], lib, self.boots[index])
                    log.info("%s rebooted (boot %d)", self.spec.nodes[index].name, self.boots[index])
            except Exception as error:
                done.set_exception(error)
            else:
                done.set_result(None)

    def _lib(self, index: int) -> simulated.SimulatedNvml:
        lib = self.libs[index]
        if lib is None:
            assert self._builder is not None
            lib = self.libs[index] = self._builder.library(self.spec.nodes[index])
        return lib

    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def _take(self) -> tuple[float, int] | None:
        with self._lock:
            while not self._stopping.is_set():
                due = self._schedule.next_due()
                now = self.clock()
                if due is not None and due <= now:
                    return self._schedule.pop()
                self._lock.wait(timeout=None if due is None else min(1.0, due - now))
            return None

    def _work(self) -> None:
        interval = self.spec.interval_seconds
        while (taken := self._take()) is not None:
            due, index = taken
            began = self.clock()
            failed = written = write_failed = False
            try:
                self._perform(index)
                agent = self.agents[index]
                if agent is None:
                    assert self._builder is not None
                    plan = self.spec.nodes[index]
                    agent = self._builder.build(plan, self._lib(index), self.boots[index])
                    self.agents[index] = agent
                result = agent.run_once(began)
                if result.outcome is not None:
                    written = result.outcome.written
                    write_failed = result.outcome.error is not None
            except Exception:
                failed = True
                log.exception("agent turn of %s failed", self.spec.nodes[index].name)
            finished = self.clock()
            with self._lock:
                stats = self.stats
                stats.turns += 1
                stats.failed_turns += failed
                stats.writes += written
                stats.write_failures += write_failed
                lateness = began - due
                stats.max_lateness_seconds = max(stats.max_lateness_seconds, lateness)
                stats.late_turns += lateness > interval
                stats.busy_seconds += finished - began
                self._schedule.push(index, next_due(due, finished, interval))
                self._lock.notify()


def run(
    spec: fleetfile.Fleet,
    api_client: client.ApiClient,
    stop: threading.Event,
    *,
    workers: int | None = None,
    delete_nodes: bool = False,
    companions: Sequence[Callable[[Fleet], Callable[[], None]]] = (),
) -> Fleet:
    """Create the Nodes, run the agents until `stop` is set, then stop (and optionally delete the Nodes).

    `companions`: each is started with the running fleet and returns how to stop it (the repair executor).
    """
    fleet = Fleet(spec, api_client, workers=workers)
    fleet.create_nodes()
    fleet.start()
    stoppers: list[Callable[[], None]] = []
    try:
        stoppers = [start(fleet) for start in companions]
        stop.wait()
    finally:
        for stop_companion in reversed(stoppers):
            stop_companion()
        fleet.stop()
        if delete_nodes:
            fleet.delete_nodes()
    return fleet
