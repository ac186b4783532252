"""Agent overhead: what one gpu-health-agent costs a GPU node.

Runs the real `gpu-health-agent run` command (simulated 8-GPU node, 1 s
interval, 60 s heartbeat) against a real kube-apiserver and measures, over
the steady-state window after a warm-up:

- RSS of the agent process (mean and peak, from /proc/<pid>/status),
- CPU in millicores (utime+stime from /proc/<pid>/stat over wall time),
- NVML calls per GPU per second (the agent's own gpuhealth_agent_nvml_calls_total),
- GPUNode status writes vs heartbeats (gpuhealth_agent_report_writes_total).

Budget (issue 3): RSS ≤ 64 MiB, CPU ≤ 10 mCPU, NVML ≤ 10 calls/GPU/s, steady writes = 1 per heartbeat.

`--backend nvml` runs the production backend instead: real pynvml over the simulated NVML library
(hack/simnvml.sh, docs/simulated-nvml.md), the agent started by `python -m gpuhealth_agent.simnvml`
with LD_LIBRARY_PATH at the library. Its figures include the simulation's own replay in the process
(the driver's sync before each NVML call), so they bound what pynvml over a real driver costs.

    python bench/agent_overhead.py              # 10 minutes
    python bench/agent_overhead.py --quick      # 60 s
    python bench/agent_overhead.py --duration 300 --record   # append the result to bench/RESULTS.md

Without --kubeconfig it starts a local control plane (binaries from
$KUBEBUILDER_ASSETS or hack/testbin.sh) and applies crds/.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import common
from prometheus_client import parser

from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local

ROOT = common.ROOT
NODE = "bench-agent-0"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE = 1024


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / CLOCK_TICKS


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def total(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and want <= set(ls))


@contextlib.contextmanager
def cluster(kubeconfig: str | None) -> Iterator[tuple[Path, local.ControlPlane | None]]:
    if kubeconfig:
        yield Path(kubeconfig), None
        return
    with local.ControlPlane(binaries.locate(cwd=ROOT)) as plane:
        common.install_crds(plane)
        yield plane.kubeconfig, plane


def kubectl(kubeconfig: Path, plane: local.ControlPlane | None, *args: str, stdin: str | None = None) -> str:
    if plane is not None:
        return plane.kubectl(*args, input=stdin).stdout
    result = subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        text=True,
        capture_output=True,
        check=True,
    )
    return result.stdout


def node_manifest(gpus: int) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"type": "kwok"},
            },
            "status": {
                "capacity": {"nvidia.com/gpu": str(gpus)},
                "allocatable": {"nvidia.com/gpu": str(gpus)},
            },
        }
    )


def scenario(gpus: int, facts: str = "all") -> str:
    """A healthy busy node; `all` turns every optional fact on (issue 27): 18 NVLinks per GPU, fabric
    info, PCIe AER in sysfs and one 400G InfiniBand port per GPU; `core` the NVML facts of before."""
    defaults = "temperatureCelsius: 48, utilizationPercent: 97, powerWatts: 540"
    nics = ""
    if facts == "all":
        defaults += ", fabricState: Completed, fabricCliqueId: 1, pcieAerCorrectable: 0"
        nics = "nics:\n" + "".join(f"- {{name: mlx5_{i}, port: 1, rateGbps: 400}}\n" for i in range(gpus))
    return (
        f"description: agent overhead benchmark, healthy busy node\ngpus: {gpus}\n"
        f"defaults: {{{defaults}}}\n{nics}timeline: []\n"
    )


def run(args: argparse.Namespace) -> dict[str, object]:
    duration = 60.0 if args.quick else args.duration
    with cluster(args.kubeconfig) as (kubeconfig, plane), tempfile.TemporaryDirectory() as scratch:
        kubectl(kubeconfig, plane, "apply", "-f", "-", stdin=node_manifest(args.gpus))
        plan = Path(scratch) / "scenario.yaml"
        plan.write_text(scenario(args.gpus, args.facts))
        port = free_port()
        agent_args = [
            "run", "--node-name", NODE, "--interval", str(args.interval),
            "--heartbeat", str(args.heartbeat), "--metrics-port", str(port), "--kubeconfig", str(kubeconfig),
            "--log-level", "WARNING",
        ]  # fmt: skip
        env = dict(os.environ)
        if args.backend == "nvml":
            built = subprocess.run(
                [str(ROOT / "hack" / "simnvml.sh")], capture_output=True, text=True, check=True
            ).stdout.strip()
            env["LD_LIBRARY_PATH"] = str(Path(built) / "full")
            launcher = ["-m", "gpuhealth_agent.simnvml", "--scenario", str(plan), "--node-name", NODE, "--"]
            command = [sys.executable, *launcher, *agent_args, "--backend", "nvml"]
        else:
            command = [sys.executable, "-m", "gpuhealth_agent.cli", *agent_args]
            command += ["--backend", "sim", "--sim-scenario", str(plan)]
        agent = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
        try:
            waiting.wait_until(
                lambda: total(scrape(port), "gpuhealth_agent_report_writes_total") >= 1,
                timeout_seconds=60,
                message="the agent's first GPUNode write",
                transient=(OSError,),
            )
            # Warm-up: first write, lazy imports, TLS session; then measure.
            time.sleep(args.warmup)
            before, cpu_before, started = scrape(port), cpu_seconds(agent.pid), time.monotonic()
            rss_samples = []
            while time.monotonic() - started < duration:
                rss_samples.append(rss_kib(agent.pid))
                time.sleep(min(5.0, max(0.0, duration - (time.monotonic() - started))))
            after, cpu_after, ended = scrape(port), cpu_seconds(agent.pid), time.monotonic()
            rss_samples.append(rss_kib(agent.pid))
        finally:
            agent.terminate()
            _, stderr = agent.communicate(timeout=30)
        kubectl(kubeconfig, plane, "delete", "node", NODE, "--wait=false")
    wall = ended - started
    calls = total(after, "gpuhealth_agent_nvml_calls_total") - total(
        before, "gpuhealth_agent_nvml_calls_total"
    )
    writes = {
        reason: total(after, "gpuhealth_agent_report_writes_total", reason=reason)
        - total(before, "gpuhealth_agent_report_writes_total", reason=reason)
        for reason in ("first", "change", "heartbeat", "retry")
    }
    failures = total(after, "gpuhealth_agent_report_failures_total") - total(
        before, "gpuhealth_agent_report_failures_total"
    )
    return {
        "duration_seconds": round(wall, 1),
        "gpus": args.gpus,
        "backend": args.backend,
        "facts": args.facts,
        "interval_seconds": args.interval,
        "heartbeat_seconds": args.heartbeat,
        "rss_mib_mean": round(sum(rss_samples) / len(rss_samples) / PAGE, 1),
        "rss_mib_peak": round(max(rss_samples) / PAGE, 1),
        "cpu_millicores": round((cpu_after - cpu_before) / wall * 1000, 2),
        "nvml_calls_per_gpu_per_second": round(calls / args.gpus / wall, 2),
        "writes": {k: int(v) for k, v in writes.items()},
        "write_failures": int(failures),
        "heartbeats_in_window": round(wall / args.heartbeat, 2),
        "agent_exit_code": agent.returncode,
        "agent_stderr_tail": stderr.strip().splitlines()[-3:],
    }


def verdict(result: dict[str, object]) -> list[str]:
    writes = result["writes"]
    assert isinstance(writes, dict)
    steady = sum(writes.values())
    heartbeats = float(str(result["heartbeats_in_window"]))
    checks = [
        ("RSS peak ≤ 64 MiB", float(str(result["rss_mib_peak"])) <= 64),
        ("CPU ≤ 10 mCPU", float(str(result["cpu_millicores"])) <= 10),
        ("NVML ≤ 10 calls/GPU/s", float(str(result["nvml_calls_per_gpu_per_second"])) <= 10),
        (
            "steady writes = heartbeats (±1)",
            writes.get("change", 0) == 0 and abs(steady - heartbeats) <= 1,
        ),
    ]
    return [f"{'PASS' if ok else 'FAIL'} {name}" for name, ok in checks]


def markdown(result: dict[str, object], argv: list[str]) -> str:
    machine = (
        f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.platform()}"
    )
    lines = [
        f"## agent_overhead — {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        f"- machine: {machine}",
        f"- command: `python bench/agent_overhead.py {' '.join(argv)}`",
        f"- setup: simulated {result['gpus']} GPUs ({result['facts']} facts, backend {result['backend']}), "
        f"interval {result['interval_seconds']} s, heartbeat "
        f"{result['heartbeat_seconds']} s, real kube-apiserver, "
        f"measured window {result['duration_seconds']} s after warm-up",
        "",
        "| measure | value | budget |",
        "|---|---|---|",
        f"| RSS mean / peak | {result['rss_mib_mean']} / {result['rss_mib_peak']} MiB | ≤ 64 MiB |",
        f"| CPU | {result['cpu_millicores']} mCPU | ≤ 10 mCPU |",
        f"| NVML calls | {result['nvml_calls_per_gpu_per_second']} per GPU per s | ≤ 10 |",
        f"| status writes in window | {result['writes']} (failures {result['write_failures']}) "
        f"| {result['heartbeats_in_window']} heartbeats |",
        "",
        *(f"- {line}" for line in verdict(result)),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--duration", type=float, default=600.0, help="measured seconds (default 600)")
    cli.add_argument("--quick", action="store_true", help="measure 60 s")
    cli.add_argument(
        "--warmup", type=float, default=10.0, help="seconds after the first write before measuring"
    )
    cli.add_argument("--gpus", type=int, default=8)
    cli.add_argument(
        "--facts",
        choices=["all", "core"],
        default="all",
        help="all: NVLink, fabric, PCIe AER and InfiniBand ports too (default); core: the NVML facts only",
    )
    cli.add_argument(
        "--backend",
        choices=["sim", "nvml"],
        default="sim",
        help="sim: the Python backend (default); nvml: real pynvml over the simulated NVML library",
    )
    cli.add_argument("--interval", type=float, default=1.0)
    cli.add_argument("--heartbeat", type=float, default=60.0)
    cli.add_argument("--kubeconfig", help="use this cluster (CRDs installed) instead of starting one")
    cli.add_argument("--record", action="store_true", help="append the result to bench/RESULTS.md")
    args = cli.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    text = markdown(result, sys.argv[1:])
    print(text)
    if args.record:
        with (ROOT / "bench" / "RESULTS.md").open("a") as results:
            results.write("\n" + text)
    return 0 if all(line.startswith("PASS") for line in verdict(result)) else 1


if __name__ == "__main__":
    sys.exit(main())
