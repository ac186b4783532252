"""`gpu-health-agent` command line: `run` (the default) and `check`.

This module wires settings to parts (NVML or a scenario, the Kubernetes
client, metrics, the health endpoint) and is the only place that turns
errors into exit codes: 2 for a bad command line, scenario file or
kubeconfig, 1 when NVML cannot start (run); `check` answers 0 healthy, 1 a
fault, 2 usage, 3 cannot read (`check.EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final

import prometheus_client

from gpuhealth_agent import (
    access_hints,
    check,
    dcgm,
    dcgm_discovery,
    health,
    metrics,
    nvml,
    probe,
    release,
    reporter,
    runner,
    scenario,
    simulated,
    sysfs,
    xids,
)
from gpuhealth_api import __version__, heartbeats, kubeconfig_check, logformat, timestamps

if TYPE_CHECKING:
    from kubernetes import client as k8s

log = logging.getLogger("gpuhealth_agent")

USAGE_ERROR: Final = 2
STARTUP_ERROR: Final = 1
SUBCOMMANDS: Final = ("run", "check")
BOOT_ID_PATH: Final = Path("/proc/sys/kernel/random/boot_id")
PROC_STAT_PATH: Final = Path("/proc/stat")


def _common(parser: argparse.ArgumentParser, log_level: str) -> None:
    parser.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME", ""),
        help="the Node this agent runs on (default: $NODE_NAME)",
    )
    parser.add_argument(
        "--backend",
        choices=[runner.BACKEND_NVML, runner.BACKEND_SIM],
        default=runner.BACKEND_NVML,
        help="read real GPUs through NVML, or simulated ones from --sim-scenario (default: nvml)",
    )
    parser.add_argument("--sim-scenario", metavar="FILE", help="scenario file for --backend sim")
    parser.add_argument(
        "--dcgm-exporter-url", metavar="URL", help="also fold in facts from this dcgm-exporter"
    )
    parser.add_argument(
        "--dcgm-exporter",
        choices=["auto"],
        help="auto: find the dcgm-exporter pod on this node through the API and fold in its facts "
        "(needs list pods; see --dcgm-exporter-selector)",
    )
    parser.add_argument(
        "--dcgm-exporter-selector",
        default=dcgm_discovery.DEFAULT_SELECTOR,
        metavar="LABELS",
        help="label selector of the exporter pods "
        f"(default: {dcgm_discovery.DEFAULT_SELECTOR}, the GPU Operator's)",
    )
    parser.add_argument(
        "--dcgm-exporter-namespace",
        default=dcgm_discovery.DEFAULT_NAMESPACE,
        metavar="NAMESPACE",
        help="namespace of the exporter pods; '' = all namespaces, where a tenant's pod on the node with "
        "the exporter's labels would be scraped "
        f"(default: {dcgm_discovery.DEFAULT_NAMESPACE}, the GPU Operator's)",
    )
    parser.add_argument(
        "--dcgm-exporter-port",
        type=int,
        default=dcgm_discovery.DEFAULT_PORT,
        metavar="PORT",
        help=f"port of the exporter's /metrics on the pod IP (default {dcgm_discovery.DEFAULT_PORT})",
    )
    parser.add_argument(
        "--sysfs-root",
        default=sysfs.DEFAULT_ROOT,
        metavar="DIR",
        help=f"where sysfs is, for PCIe AER and InfiniBand ports (default {sysfs.DEFAULT_ROOT}; "
        "'' reads none; --backend sim uses its own tree)",
    )
    parser.add_argument("--log-level", default=log_level, choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    logformat.add_argument(parser)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="gpu-health-agent", description="Report this node's GPU health facts to its GPUNode."
    )
    top.add_argument("--version", action="version", version=f"gpu-health-agent {__version__}")
    sub = top.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run the agent (default)")
    _common(run, "INFO")
    run.add_argument(
        "--interval", type=float, default=5.0, metavar="SECONDS", help="collect period (default 5)"
    )
    run.add_argument(
        "--heartbeat",
        type=float,
        default=float(heartbeats.DEFAULT_HEARTBEAT_SECONDS),
        metavar="SECONDS",
        help=f"status write period when idle (default {heartbeats.DEFAULT_HEARTBEAT_SECONDS})",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=9101,
        help="port for /metrics and /healthz (default 9101; 0 = any free)",
    )
    run.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    run.add_argument(
        "--gpu-telemetry-metrics",
        choices=["on", "off"],
        default="on",
        help="off: no temperature, power and SM clock series on /metrics, where dcgm-exporter exports "
        "them (fault series and GPUNode facts stay; default on)",
    )
    chk = sub.add_parser(
        "check",
        help="read the GPUs once and print their health",
        description="Read the GPUs once and print their health: a table, or with -o json the status "
        "the agent would report and its verdict.",
        epilog=check.EXIT_CODES,
    )
    _common(chk, "ERROR")  # the table says it all; logs would only interleave with it
    chk.add_argument("-o", "--output", choices=["table", "json"], default="table")
    chk.add_argument(
        "--at",
        type=float,
        metavar="SECONDS",
        help="with --backend sim: scenario time to evaluate (default: the last timeline entry)",
    )
    chk.add_argument(
        "--probe",
        action="store_true",
        help="read-only probe before installing: per field supported / not supported / error, and the "
        "NVML calls per GPU per second and CPU of sampling (never resets a GPU or changes a setting)",
    )
    chk.add_argument(
        "--probe-seconds",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long --probe samples (default 10)",
    )
    chk.add_argument(
        "--probe-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="--probe's sample period (default 5)",
    )
    return top


def _boot_id(path: Path = BOOT_ID_PATH) -> str | None:
    """The kernel's boot ID, or None where the file is not readable (then XIDs always carry over)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _boot_time(path: Path = PROC_STAT_PATH) -> str | None:
    """When the kernel booted (RFC 3339, the node's clock: `btime` of /proc/stat), or None where it cannot be
    read. The operator judges another tool's Node condition after a reboot only on a version written
    since then (issue 45, item 5)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "btime" and value.strip().isdigit():
                return timestamps.render(datetime.datetime.fromtimestamp(int(value), datetime.UTC))
    except OSError:
        return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or (
        args_list[0] not in SUBCOMMANDS and args_list[0] not in {"-h", "--help", "--version"}
    ):
        args_list.insert(0, "run")
    args = parser().parse_args(args_list)
    logformat.configure(args.log_level, args.log_format)
    plan = None
    if args.backend == runner.BACKEND_SIM:
        if not args.sim_scenario:
            print("gpu-health-agent: --backend sim needs --sim-scenario FILE", file=sys.stderr)
            return USAGE_ERROR
        try:
            plan = scenario.load(args.sim_scenario)
        except scenario.ScenarioError as exc:
            print(f"gpu-health-agent: bad scenario: {exc}", file=sys.stderr)
            return USAGE_ERROR
    if args.dcgm_exporter_url and args.dcgm_exporter:
        print("gpu-health-agent: give --dcgm-exporter-url or --dcgm-exporter auto, not both", file=sys.stderr)
        return USAGE_ERROR
    if plan is not None and (args.dcgm_exporter_url or args.dcgm_exporter):
        # Simulated GPUs have made-up UUIDs: a real exporter's records match none of them.
        print(
            "gpu-health-agent: warning: --backend sim with a dcgm-exporter: only records whose UUID "
            "is a simulated GPU's are folded in (a real exporter's are not)",
            file=sys.stderr,
        )
    if args.command == "check" and args.probe:
        return _probe(args, plan)
    if args.command == "check":
        return _check(args, plan)
    return _run(args, plan)


def _check(args: argparse.Namespace, plan: scenario.Scenario | None) -> int:
    node = args.node_name or "localhost"
    try:
        source = _dcgm(args, node_name=node)
    except Exception as exc:  # --dcgm-exporter auto without a usable Kubernetes configuration
        said = kubeconfig_check.one_line(exc)
        print(f"gpu-health-agent: cannot look up the dcgm-exporter: {said}", file=sys.stderr)
        return check.CANNOT_READ_EXIT
    base = time.time()
    if plan is not None:
        at = plan.end_seconds if args.at is None else args.at
        moment = [0.0]
        lib = simulated.library(
            plan, clock=lambda: moment[0], start=0.0, sleep=lambda _: None, identity_seed=node
        )
        settings = runner.Settings(
            node, runner.BACKEND_SIM, expected_gpus=plan.expected_gpus, event_thread=False
        )
        dcgm_source = source
        agent = runner.Agent(settings, lib, clock=lambda: base + moment[0], dcgm_source=dcgm_source)
        agent.start(base)
        # Step through the timeline as a running agent would, so resets, recoveries and
        # throttledSince come out as they would have been observed live.
        steps = sorted({e.after_seconds for e in plan.timeline if 0 < e.after_seconds < at} | {at})
        try:
            for step in steps:
                moment[0] = step
                if step == steps[-1]:
                    agent.collector.request_full_sample()  # what the GPUs say at `at`, slow counters too
                turn = agent.run_once()
        finally:
            agent.close()
    else:
        settings = runner.Settings(
            node, runner.BACKEND_NVML, event_thread=False, sysfs_root=args.sysfs_root or None
        )
        dcgm_source = source
        agent = runner.Agent(settings, nvml.real(), dcgm_source=dcgm_source)
        try:
            agent.start(base)
            turn = agent.run_once()
        except nvml.NVMLError as exc:
            print(f"gpu-health-agent: cannot use NVML: {exc}", file=sys.stderr)
            return check.CANNOT_READ_EXIT
        finally:
            agent.close()
    cannot_read = None
    if dcgm_source is not None and dcgm_source.last_error is not None:
        # Asked for and not read: "healthy" on half the evidence would be a lie (exit 3, not 0);
        # a fatal fault NVML shows is still a fault (exit 1).
        cannot_read = (
            f"the dcgm-exporter at {dcgm_source.url}: {kubeconfig_check.one_line(dcgm_source.last_error)}"
        )
        print(f"gpu-health-agent: cannot read {cannot_read}", file=sys.stderr)
    code, text = check.render(turn.status, xids.Catalogue.packaged(), args.output, cannot_read)
    sys.stdout.write(text)
    return code


def _probe(args: argparse.Namespace, plan: scenario.Scenario | None) -> int:
    """`check --probe`: the read-only probe (probe.py) of this node's NVML, or of a scenario's GPUs."""
    lib = (
        nvml.real() if plan is None else simulated.library(plan, identity_seed=args.node_name or "localhost")
    )
    try:
        report = probe.run(lib, seconds=args.probe_seconds, interval=args.probe_interval)
    except nvml.NVMLError as exc:
        print(f"gpu-health-agent: cannot use NVML: {exc}", file=sys.stderr)
        return check.CANNOT_READ_EXIT
    sys.stdout.write(probe.render(report, args.output))
    return check.HEALTHY_EXIT


def _dcgm(
    args: argparse.Namespace, api_client: k8s.ApiClient | None = None, node_name: str = ""
) -> dcgm.DcgmSource | None:
    if args.dcgm_exporter == "auto":
        if api_client is None:
            api_client = _api_client(getattr(args, "kubeconfig", None))
        locator = dcgm_discovery.Locator(
            dcgm_discovery.ApiPodLister(api_client),
            node_name or args.node_name,
            selector=args.dcgm_exporter_selector,
            namespace=args.dcgm_exporter_namespace or None,
            port=args.dcgm_exporter_port,
        )
        return dcgm.DcgmSource(locator=locator)
    return dcgm.DcgmSource(args.dcgm_exporter_url) if args.dcgm_exporter_url else None


def _api_client(kubeconfig: str | None) -> k8s.ApiClient:
    from kubernetes import client as k8s  # noqa: PLC0415 - only `run` needs the Kubernetes client
    from kubernetes import config as k8s_config  # noqa: PLC0415

    configuration = k8s.Configuration()
    if kubeconfig:
        _usable(kubeconfig)
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            _usable(str(kubeconfig_check.default_path()))
            k8s_config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return k8s.ApiClient(configuration)


class KubeconfigError(Exception):
    """A kubeconfig that cannot be used, said in one line that names the file."""


def _usable(path: str) -> None:
    problem = kubeconfig_check.problem(path)
    if problem is not None:
        raise KubeconfigError(problem)


def _run(args: argparse.Namespace, plan: scenario.Scenario | None) -> int:
    if not args.node_name:
        print("gpu-health-agent: --node-name (or $NODE_NAME) is required", file=sys.stderr)
        return USAGE_ERROR
    if args.interval <= 0 or args.heartbeat <= 0:
        print("gpu-health-agent: --interval and --heartbeat must be positive", file=sys.stderr)
        return USAGE_ERROR
    if args.heartbeat > heartbeats.MAX_HEARTBEAT_SECONDS:
        print(
            f"gpu-health-agent: --heartbeat must be at most {heartbeats.MAX_HEARTBEAT_SECONDS}s "
            "(the GPUNode schema's maximum)",
            file=sys.stderr,
        )
        return USAGE_ERROR
    if plan is not None:
        lib = simulated.library(plan, identity_seed=args.node_name)
        expected = plan.expected_gpus
    else:
        lib, expected = nvml.real(), None
    settings = runner.Settings(
        node_name=args.node_name,
        backend=args.backend,
        interval_seconds=args.interval,
        heartbeat_seconds=args.heartbeat,
        expected_gpus=expected,
        # The simulation is single-threaded by design; poll its events each turn instead.
        event_thread=plan is None,
        boot_id=_boot_id(),
        boot_time=_boot_time(),
        sysfs_root=(args.sysfs_root or None) if plan is None else None,
        gpu_access=access_hints.from_environment(),
    )
    registry = prometheus_client.CollectorRegistry()
    try:
        api_client = _api_client(args.kubeconfig)
    except Exception as exc:  # missing file, bad YAML, no in-cluster token: all end the same way
        said = kubeconfig_check.one_line(exc)
        print(f"gpu-health-agent: no usable Kubernetes configuration: {said}", file=sys.stderr)
        return USAGE_ERROR
    cluster = reporter.GPUNodeClient(api_client, args.node_name)
    agent = runner.Agent(
        settings,
        lib,
        report=reporter.Reporter(cluster, heartbeat_seconds=args.heartbeat),
        agent_metrics=metrics.AgentMetrics(registry, gpu_telemetry=args.gpu_telemetry_metrics == "on"),
        dcgm_source=_dcgm(args, api_client, args.node_name),
    )
    if plan is None:  # the operator may ask it to let go of NVML for a GPU reset (`release`)
        watch = release.GPUNodeWatch(api_client, args.node_name, wake=agent.wake.set, stop=agent.stop)
        agent.release = watch
        watch.start()
    server = health.HealthServer(args.metrics_port, agent.liveness, registry).start()
    log.info(
        "gpu-health-agent %s on node %s: backend %s, interval %.1fs, heartbeat %.0fs, metrics/healthz on :%d",
        __version__,
        args.node_name,
        args.backend,
        args.interval,
        args.heartbeat,
        server.port,
    )

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("received signal %d; stopping", signum)
        agent.stop.set()
        agent.wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        agent.run_forever()
    except nvml.NVMLError as exc:
        log.error("cannot use NVML: %s", exc)
        return STARTUP_ERROR
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
