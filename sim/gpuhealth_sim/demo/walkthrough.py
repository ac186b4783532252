"""`gpu-health-sim demo`: the product's main job, end to end, on this machine, in about two minutes.

It starts a local control plane (etcd, kube-apiserver, controller manager,
scheduler, kwok), installs the CRDs and a demo policy with short timers,
creates the demo fleet's simulated H100 nodes (16) running a training Deployment guarded by a
PodDisruptionBudget, has "a human" cordon one node, then starts the real
operator as a subprocess and the simulated fleet (real agent code) with
scripted faults, and the simulator's repair executor, which plays the nodes'
side of the policy's repair Jobs (a GPU reset, a reboot, a validation) and of
its active checks' Jobs as their scenarios say. While the story plays out it shows the fleet live; at the
end it prints what was detected and done, with detection-to-action times
taken from the cluster, and tears everything down (or, with --keep, leaves
it running for kubectl until Ctrl-C).

The steps are plain functions over a `ControlPlane`, so a failure says
which step broke and where the logs are.

With `kubeconfig` (`gpu-health-sim demo --kubeconfig FILE`, `make demo
KUBECONFIG=FILE`) the same story runs on a cluster the user already has:
kwok runs here against it (`controlplane.existing`), the operator and the
agents run here too, and everything the demo created there is removed at the
end, also on Ctrl-C (`borrowed`: what it refuses to touch, and the removal).
"""

import collections
import contextlib
import dataclasses
import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml
from kubernetes import client

from gpuhealth_api import resources
from gpuhealth_sim import waiting, watches
from gpuhealth_sim.backtest import tracerecord
from gpuhealth_sim.controlplane import binaries, existing, local, processes
from gpuhealth_sim.demo import borrowed, checkstory, demotrace, live, operands, record, summary, workload
from gpuhealth_sim.demo.defaults import DEFAULT_DURATION_SECONDS, DEFAULT_FLEET, DEFAULT_POLICY, REPO_ROOT
from gpuhealth_sim.fleet import agentpool, checks, dra, fleetfile, repairs

REFRESH_SECONDS = 1.0
OPERATOR = "gpu-health-operator"
FIELD_MANAGER = "gpu-health-demo"
TRACE = "run.jsonl.gz"
"""The demo's own run, recorded as `gpu-health-sim record` would (in the workdir)."""
TICK_SECONDS = 1.0
"""The backtest's timer, as the demo's operator runs it (its default --tick-seconds)."""


@dataclasses.dataclass(frozen=True)
class Options:
    duration_seconds: float = DEFAULT_DURATION_SECONDS
    """How long the fleet runs before the summary (scenario times count from the fleet's start)."""
    keep: bool = False
    """After the summary, keep everything running until Ctrl-C and print how to reach it."""
    fleet_path: Path = DEFAULT_FLEET
    policy_path: Path = DEFAULT_POLICY
    summary_json: Path | None = None
    """Also write the summary as JSON here (for tests and scripts)."""
    workdir: Path | None = None
    """Where logs and the cluster's state go; default: a fresh temporary directory."""
    tty: bool | None = None
    """Redraw the screen (True) or print lines (False); default: whether stdout is a terminal."""
    width: int | None = None
    kubeconfig: Path | None = None
    """Run on this existing cluster instead of a local control plane (kwok runs here against it)."""
    context: str | None = None
    kwok: Path | None = None
    """The kwok binary for an existing cluster; default: $KWOK, else hack/kwok.sh builds kwok alone."""


Cluster = local.ControlPlane | existing.ExistingCluster


class Stopped(Exception):
    """SIGTERM arrived: unwind and tear down like Ctrl-C."""


def operator_command(kubeconfig: Path) -> list[str]:
    """The installed console script next to this Python, else the module (same code)."""
    script = Path(sys.executable).parent / OPERATOR
    base = [str(script)] if script.exists() else [sys.executable, "-m", "gpuhealth_operator"]
    return [
        *base,
        "--kubeconfig",
        str(kubeconfig),
        "--no-leader-elect",
        "--metrics-port",
        "0",
        "--health-port",
        "0",
        "--log-level",
        "INFO",
    ]


def hardware(spec: fleetfile.Fleet) -> str:
    """The fleet's GPUs in words, one part per kind of node: "7 of 4x NVIDIA A100…, 3 of 8x NVIDIA H100…"."""
    kinds = collections.Counter((plan.gpu_count, plan.gpu_model) for plan in spec.nodes)
    if len(kinds) == 1:
        ((count, model),) = kinds
        return f"{count}x {model}"
    return ", ".join(f"{nodes} of {count}x {model}" for (count, model), nodes in kinds.items())


def human_cordoned_node(spec: fleetfile.Fleet) -> str:
    """The node "a human" cordons before the operator starts: the last device-plugin node of the
    training job's pool (`start_training`; other pools are idle, for active checks)."""
    plugin = [plan for plan in spec.nodes if not plan.dra]
    training = [p for p in plugin if dict(plugin[0].labels).items() <= p.labels.items()] if plugin else []
    return (training or plugin or spec.nodes)[-1].name


class _Say:
    """Progress lines before and after the live view (the view owns the screen in between)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.began = time.monotonic()

    def __call__(self, message: str) -> None:
        self.out.write(f"[{time.monotonic() - self.began:5.1f}s] {message}\n")
        self.out.flush()


def _apply(plane: Cluster, *documents: dict[str, Any]) -> None:
    plane.kubectl(
        "apply",
        "--server-side",
        f"--field-manager={FIELD_MANAGER}",
        "-f",
        "-",
        input=yaml.safe_dump_all(documents),
    )


def install(plane: Cluster, options: Options) -> None:
    """CRDs, then the demo policy (the CRDs must be Established before a policy is accepted)."""
    crds = sorted((REPO_ROOT / "crds").glob("*.yaml"))
    args = [arg for path in crds for arg in ("-f", str(path))]
    plane.kubectl("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", *args)
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *args)
    plane.kubectl(
        "apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", str(options.policy_path)
    )


def start_training(plane: Cluster, api: client.ApiClient, spec: fleetfile.Fleet) -> int:
    """The Deployment (one whole-node pod per GPU node) and its PDB; returns the replica count."""
    # One pod per node of the first pool's labels: other pools' nodes stay idle (active checks run there).
    plugin = [plan for plan in spec.nodes if not plan.dra]
    selector = dict(plugin[0].labels)
    plugin = [plan for plan in plugin if selector.items() <= plan.labels.items()]
    gpus = min(plan.gpu_count for plan in plugin)
    replicas = len(plugin)
    _apply(plane, *workload.manifests(replicas, gpus, selector))
    dra_gpus = sum(plan.gpu_count for plan in spec.nodes if plan.dra)
    if dra_gpus:  # one-GPU pods with ResourceClaims fill the DRA nodes' GPUs
        _apply(plane, *workload.dra_manifests(dra_gpus, dra.DEVICE_CLASS))
    core = client.CoreV1Api(api)

    def running() -> bool:
        pods = core.list_namespaced_pod(workload.NAMESPACE).items
        return sum(1 for p in pods if p.status and p.status.phase == "Running") >= replicas + dra_gpus

    waiting.wait_until(running, timeout_seconds=90, interval_seconds=0.5, message="training pods Running")
    return replicas + dra_gpus


@contextlib.contextmanager
def _following(api: client.ApiClient, seen: record.Record) -> Iterator[None]:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)

    def gpunodes(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, **kwargs
        )

    followers = [
        watches.Follower("gpunodes", gpunodes, seen.on_gpunode),
        watches.Follower("nodes", core.list_node, seen.on_node),
        watches.Follower("events", core.list_event_for_all_namespaces, seen.on_event),
    ]
    for follower in followers:
        follower.start()
    for follower in followers:
        follower.wait_synced(30)
    try:
        yield
    finally:
        for follower in followers:
            follower.request_stop()
        for follower in followers:
            follower.stop()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Stopped()


def _log_to(path: Path) -> None:
    """Our own and the in-process agents' logs go to a file: the screen belongs to the view."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def run(options: Options, out: TextIO = sys.stdout) -> int:
    """Run the demo; returns the process exit code."""
    say = _Say(out)
    tty = out.isatty() if options.tty is None else options.tty
    spec = fleetfile.load(options.fleet_path)
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="gpu-health-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    _log_to(workdir / "demo.log")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    succeeded = False
    try:
        ctx = _Context(options, spec, workdir, say, out, tty)
        if options.kubeconfig is not None:
            succeeded = _on_existing(ctx, options.kubeconfig)
        else:
            say("locating the control-plane binaries (make testbin builds them once)")
            directory = binaries.locate(cwd=REPO_ROOT)
            say(f"starting etcd, kube-apiserver, controller manager, scheduler and kwok (logs: {workdir})")
            with local.ControlPlane(directory, workdir / "cluster") as plane:
                succeeded = _story(plane, ctx)
    except KeyboardInterrupt:
        say("interrupted; stopped everything")
        return 130
    except Stopped:
        say("terminated; stopped everything")
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
        logging.shutdown()
    say("stopped everything")
    if succeeded and not options.keep and options.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    elif not succeeded:
        say(f"logs kept in {workdir}")
    return 0 if succeeded else 1


@dataclasses.dataclass(frozen=True)
class _Context:
    options: Options
    spec: fleetfile.Fleet
    workdir: Path
    say: _Say
    out: TextIO
    tty: bool


def _kwok_binary(options: Options, say: _Say) -> Path:
    if options.kwok is not None:
        return options.kwok
    say("locating kwok (hack/kwok.sh builds it alone once, a few minutes; no Kubernetes build)")
    found = subprocess.run(
        [str(REPO_ROOT / "hack" / "kwok.sh")], capture_output=True, text=True, check=False, timeout=1800
    )
    if found.returncode != 0:
        raise local.ControlPlaneError(f"hack/kwok.sh failed: {found.stderr.strip()}")
    return Path(found.stdout.strip())


def _on_existing(ctx: _Context, kubeconfig: Path) -> bool:
    """The story on the user's cluster: refuse what would meet someone else's objects, remove ours after."""
    options, say = ctx.options, ctx.say
    kwok = _kwok_binary(options, say)
    say(f"reaching the cluster of {kubeconfig}; kwok runs here for the demo's nodes (logs: {ctx.workdir})")
    policy = yaml.safe_load(options.policy_path.read_text())["metadata"]["name"]
    with existing.ExistingCluster(
        kubeconfig, ctx.workdir / "cluster", kwok=kwok, context=options.context
    ) as cluster:
        api = cluster.api_client()
        try:
            plan = borrowed.preflight(api, ctx.spec)
            for problem in plan.problems:
                say(f"refusing to run here: {problem}")
            if plan.problems:
                return False
            for note in plan.notes:
                say(note)
            try:
                return _story(cluster, dataclasses.replace(ctx, spec=plan.spec))
            finally:
                # A second Ctrl-C (or a SIGTERM) must not leave half of it behind.
                interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
                terminate = signal.signal(signal.SIGTERM, signal.SIG_IGN)
                try:
                    say("removing what the demo created on the cluster")
                    borrowed.clean(cluster, api, plan, policy, say)
                finally:
                    signal.signal(signal.SIGINT, interrupt)
                    signal.signal(signal.SIGTERM, terminate)
        finally:
            api.close()  # type: ignore[no-untyped-call]


def _story(plane: Cluster, ctx: _Context) -> bool:
    options, spec, workdir, say, out, tty = ctx.options, ctx.spec, ctx.workdir, ctx.say, ctx.out, ctx.tty
    say(f"cluster ready in {plane.startup_seconds or 0:.1f}s at {plane.server}")
    install(plane, options)
    if isinstance(plane, existing.ExistingCluster):
        borrowed.mark_crds(plane)  # ours to remove at the end (and to adopt, if a run was killed)
    say(f"installed the CRDs and policy {options.policy_path.name}")
    api = plane.api_client()
    checkstory.ensure_priority_class(api, borrowed.labels())  # the chart's, for the policy's check pods
    sim = agentpool.Fleet(spec, api)
    namespace = client.V1Namespace(
        metadata=client.V1ObjectMeta(name=repairs.DEFAULT_NAMESPACE, labels=borrowed.labels())
    )
    client.CoreV1Api(api).create_namespace(namespace)
    executor = repairs.Executor(api, sim, namespace=repairs.DEFAULT_NAMESPACE)
    checker = checks.Executor(
        api, sim, seconds=checkstory.CHECK_SECONDS, node_seconds=checkstory.NODE_SECONDS
    )
    arrival = checkstory.Arrival(api, spec, say)
    human = human_cordoned_node(spec)
    operator = processes.ManagedProcess(
        OPERATOR, operator_command(plane.kubeconfig), workdir / "operator.log", env=plane.env()
    )
    recorder_api = plane.api_client()
    recorder = tracerecord.Recorder(  # the demo's own run, as `gpu-health-sim record` would write it
        recorder_api, workdir / TRACE, generator={"demo": options.fleet_path.name}
    )
    try:
        recorder.start()
        sim.create_nodes()
        say(f"created {len(spec.nodes)} kwok GPU nodes ({hardware(spec)})")
        replicas = start_training(plane, api, spec)
        plane.kubectl("label", "--overwrite", "namespace", workload.NAMESPACE, *borrowed.label_args())
        say(f"namespace {workload.NAMESPACE}: {replicas} training pods Running, PDB maxUnavailable 2")
        held = operands.start(api, spec)
        plane.kubectl("label", "--overwrite", "namespace", operands.NAMESPACE, *borrowed.label_args())
        say(
            f"namespace {operands.NAMESPACE}: {held} GPU Operator operand pods (device plugin, dcgm-exporter)"
        )
        plane.kubectl("cordon", human)
        human_at = time.time() - recorder.started_at
        say(f"a human cordoned {human} (kubectl cordon: no gpu-health annotation)")
        operator.start()
        say(f"started {OPERATOR} (log: {operator.log_path})")
        seen = record.Record(started_at=time.time())
        with _following(api, seen):
            sim.start()
            executor.start()
            checker.start()
            arrival.start()
            assert sim.started_at is not None
            seen.started_at = sim.started_at
            say(f"started the simulated fleet: faults are scripted in {options.fleet_path.name}")
            say(f"repair Jobs in namespace {repairs.DEFAULT_NAMESPACE} end as the nodes' scenarios say")
            view = live.Live(seen, out, tty=tty, width=options.width)
            _watch(view, sim, operator, options.duration_seconds)
            result = summary.build(
                seen,
                time.time(),
                human_cordoned={human},
                gpus={plan.name: plan.gpu_count for plan in spec.nodes},
            )
            if not tty:
                view.table()
            out.write("\n" + "\n".join(summary.render(result)) + "\n\n")
            for line in operands.coordinated(seen.events()):  # issue 48: what each reset waited for
                out.write(line + "\n")
            if options.summary_json is not None:
                options.summary_json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
            offset, end = sim.started_at - recorder.started_at, time.time() - recorder.started_at
            for truth in demotrace.truth(spec, offset, end, (human, human_at)):
                recorder.write(truth)
            recorder.stop()
            dra_nodes = {plan.name for plan in spec.nodes if plan.dra}
            out.write(demotrace.verdict(recorder.out, options.policy_path, TICK_SECONDS, dra_nodes) + "\n\n")
            if not operator.running():
                say(f"the operator exited early; last lines of its log:\n{operator.log_tail(20)}")
                return False
            if options.keep:
                _keep(plane, view, out, tty)
        return True
    finally:
        executor.stop()
        checker.stop()
        arrival.stop()
        sim.stop()
        recorder.stop()
        operator.stop(grace_seconds=5)
        api.close()  # type: ignore[no-untyped-call]
        recorder_api.close()  # type: ignore[no-untyped-call]


def _watch(
    view: live.Live, sim: agentpool.Fleet, operator: processes.ManagedProcess, duration: float
) -> None:
    assert sim.started_at is not None
    nodes = len(sim.spec.nodes)
    model = sim.spec.nodes[0].gpu_model.removeprefix("NVIDIA ")
    title = f"gpu-health demo: {nodes} simulated {model} nodes, scripted faults, the real operator"
    while (elapsed := time.time() - sim.started_at) < duration:
        state = "running" if operator.running() else f"EXITED ({operator.returncode()})"
        status = f"t={elapsed:5.1f}s of {duration:.0f}s  operator: {state}  fleet turns: {sim.stats.turns}"
        view.refresh(title, status)
        time.sleep(REFRESH_SECONDS)
    view.refresh(title, "done")


def _keep(plane: Cluster, view: live.Live, out: TextIO, tty: bool) -> None:
    kubectl = (
        plane.kubectl_path if isinstance(plane, existing.ExistingCluster) else plane.binaries / "kubectl"
    )
    out.write(
        "The demo cluster keeps running (Ctrl-C stops it). In another terminal:\n\n"
        f"  export KUBECONFIG={plane.kubeconfig}\n"
        f"  alias kubectl={kubectl}\n"
        "  kubectl get gpunodes\n"
        "  kubectl get nodes -L gpuhealth.io/health,gpuhealth.io/thermal-throttled,gpuhealth.io/straggler\n"
        "  kubectl get events -A --sort-by=.lastTimestamp\n"
        "  kubectl describe gpunode gpu-node-3\n"
        "  kubectl get ghp demo -o yaml\n"
        f"  kubectl -n {workload.NAMESPACE} get pods -o wide\n"
        f"  kubectl -n {repairs.DEFAULT_NAMESPACE} get jobs,pods\n\n"
    )
    out.flush()
    try:
        while True:
            if not tty:
                view.refresh("", "")
            time.sleep(REFRESH_SECONDS)
    except (KeyboardInterrupt, Stopped):
        # The way a kept demo ends: tear down and exit 0.
        out.write("\nstopping the demo cluster\n")
