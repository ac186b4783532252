"""Backtest two weeks nobody recorded: `trace import` from a real Prometheus, then `backtest`.

Fourteen days of two nodes' agent series are loaded into Debian's
`prometheus` (loopback only, a throwaway storage directory) with Prometheus'
own backfill (`promtool tsdb create-blocks-from openmetrics`), as if its
scrapes of the agents had stored them. The series are the agent's own: each
sample's names, labels and values come from the agent's metrics
(`AgentMetrics.observe` of a GPU status), with the `node` label the chart's
ServiceMonitor adds. On day 10 one GPU of `sick` reports an uncorrectable
ECC error, until a repair six hours later resets it.

Then, as a user would: `gpu-health-sim trace import --prometheus URL
--since 14d --step 15m` (three query_range chunks per series), and
`gpu-health-sim backtest` of the trace under a draining policy: it drains
`sick` on day 10 and uncordons it after the repair, and leaves `well` alone.
A second test takes the live path: two simulated agents serve /metrics (no
API server: their writes fail, their metrics do not), Prometheus scrapes them
every second, one GPU reports the error a few scrapes in, and `trace import
--since 2m --step 1s` of what Prometheus stored backtests to the same drain.

Without `prometheus` or `promtool` installed the tests skip, except on CI,
where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any, Final

import prometheus_client
import pytest
import yaml

from gpuhealth_agent import metrics
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import ports, processes

pytestmark = pytest.mark.e2e

ROOT: Final = Path(__file__).resolve().parents[2]
BIN: Final = Path(sys.executable).parent
DAY: Final = 86_400
DAYS: Final = 14
SAMPLE_SECONDS: Final = 900
"""The backfilled samples' spacing (a slow scrape, to keep the history small); the import's step."""
FAULT_AT: Final = 10 * DAY
REPAIRED_AT: Final = FAULT_AT + 6 * 3600
NODES: Final = ("sick", "well")
GPUS: Final = 2
POLICY: Final = {
    "apiVersion": "gpuhealth.io/v1alpha1",
    "kind": "GPUHealthPolicy",
    "metadata": {"name": "drain-ecc"},
    "spec": {
        "nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}},
        "dryRun": False,
        "maxUnavailable": 1,
        "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
        "recovery": {"uncordon": True, "healthyForSeconds": 600},
    },
}


def _prometheus_module() -> types.ModuleType:
    """test_prometheus.py's `Prometheus` (a process on the loopback and a client of its API)."""
    spec = importlib.util.spec_from_file_location(
        "e2e_prometheus", Path(__file__).with_name("test_prometheus.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed on CI: .ci/run must apt-get install prometheus")
        pytest.skip(f"{name} not installed (apt-get install prometheus)")
    return found


def gpu_status(node: str, index: int, t: float) -> dict[str, Any]:
    faulty = node == "sick" and index == 1 and FAULT_AT <= t < REPAIRED_AT
    return {
        "index": index,
        "uuid": f"GPU-{node}-{index}",
        "temperatureCelsius": 60 + index,
        "slowdownTemperatureCelsius": 87,
        "smClockMHz": 1980,
        "maxSmClockMHz": 1980,
        "utilizationPercent": 97,
        "powerWatts": 520.0,
        "ecc": {"uncorrectedVolatile": 1 if faulty else 0, "correctedVolatile": 0},
        "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": faulty, "failure": False},
        "clockEventReasons": [],
        "recoveryAction": "None",
    }


def exposition(node: str, t: float) -> list[Any]:
    """The agent's metric families after one collection at trace time `t` (its own registry)."""
    registry = prometheus_client.CollectorRegistry()
    agent = metrics.AgentMetrics(registry)
    gpus = [gpu_status(node, i, t) for i in range(GPUS)]
    sample = types.SimpleNamespace(
        time=t,
        gpus=gpus,
        nics=None,
        expected_gpus=GPUS,
        errors=Counter(),
        duration_seconds=0.01,
        driver_version=None,
    )
    agent.observe(sample)  # type: ignore[arg-type]  # the fields observe reads
    return list(registry.collect())


def openmetrics(start: float, path: Path) -> int:
    """The history as OpenMetrics text with timestamps (each family's samples together, each series in
    time order, as promtool wants them); returns the samples written."""
    steps = [i * SAMPLE_SECONDS for i in range(DAYS * DAY // SAMPLE_SECONDS + 1)]
    # Two states per node (healthy, faulty): collect each once, then write it at its times.
    states = {
        node: {faulty: exposition(node, FAULT_AT if faulty else 0) for faulty in (False, True)}
        for node in NODES
    }
    written = 0
    with path.open("w") as out:
        for family in states[NODES[0]][False]:
            if family.type not in ("gauge", "counter"):
                continue  # the histogram of collection times: nothing the import reads
            out.write(f"# TYPE {family.name} {family.type}\n")
            for node in NODES:
                by_state = {
                    faulty: {
                        (s.name, tuple(sorted(s.labels.items()))): s.value
                        for f in states[node][faulty]
                        if f.name == family.name
                        for s in f.samples
                        if not s.name.endswith("_created")
                    }
                    for faulty in (False, True)
                }
                for key in by_state[False]:
                    name, labels = key
                    text = ",".join(f'{k}="{v}"' for k, v in (*labels, ("node", node)))
                    for t in steps:
                        value = by_state[FAULT_AT <= t < REPAIRED_AT][key]
                        out.write(f"{name}{{{text}}} {value} {start + t:.3f}\n")
                        written += 1
        out.write("# EOF\n")
    return written


def sim(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "gpu-health-sim"), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_two_weeks_in_prometheus_import_as_a_trace_whose_backtest_drains_the_faulty_node(
    tmp_path: Path,
) -> None:
    binary, promtool = tool("prometheus"), tool("promtool")
    # The last sample well in the past, so no block of the backfill is still the head's time.
    end = math.floor(time.time() / SAMPLE_SECONDS) * SAMPLE_SECONDS - 2 * SAMPLE_SECONDS
    start = end - DAYS * DAY
    history = tmp_path / "history.om"
    assert openmetrics(start, history) > 0
    backfill = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--quiet",
            # Blocks of the whole history: in 2 h blocks (the default) promtool takes a minute.
            f"--max-block-duration={(DAYS + 2) * 24}h",
            str(history),
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert backfill.returncode == 0, backfill.stderr[-2000:]
    history.unlink()

    prometheus = _prometheus_module().Prometheus(binary, tmp_path, {"global": {}}, {"groups": []})
    prometheus.process.start()
    try:
        waiting.wait_until(prometheus.ready, timeout_seconds=60, message="Prometheus ready")
        trace = tmp_path / "two-weeks.jsonl.gz"
        imported = sim(
            "trace", "import", "--prometheus", prometheus.url, "--since", f"{DAYS}d", "--until", str(end),
            "--step", f"{SAMPLE_SECONDS}s", "--out", str(trace), timeout=300,
        )  # fmt: skip
        assert imported.returncode == 0, imported.stderr
        assert "2 nodes" in imported.stdout, imported.stdout
        assert "covered" in imported.stderr  # progress
    except BaseException:
        print(f"----- prometheus ({prometheus.process.log_path}) -----\n{prometheus.process.log_tail(30)}")
        raise
    finally:
        prometheus.process.stop(grace_seconds=10)

    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    replayed = sim("backtest", "--policy", str(policy), "--trace", str(trace), "-o", "json", timeout=300)
    assert replayed.returncode == 0, replayed.stderr
    (report,) = json.loads(replayed.stdout)["policies"]
    actions = [
        (a["node"], a["action"], a["t"]) for a in report["nodeActions"] if not a["action"].startswith("Label")
    ]
    drained = [t for node, action, t in actions if (node, action) == ("sick", "Drain")]
    assert drained, actions
    assert FAULT_AT <= drained[0] <= FAULT_AT + SAMPLE_SECONDS + 60, actions  # at the first step showing it
    uncordoned = [t for node, action, t in actions if (node, action) == ("sick", "Uncordon")]
    assert uncordoned and uncordoned[0] >= REPAIRED_AT + 600, actions
    assert not [a for a in actions if a[0] == "well"], actions


UNREACHABLE_KUBECONFIG: Final = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""
"""The agents only serve /metrics here: their GPUNode writes fail (and are retried), their metrics do not."""


def scenario(timeline: list[dict[str, Any]]) -> str:
    defaults = {"temperatureCelsius": 45, "smClockMHz": 1980, "maxSmClockMHz": 1980, "powerWatts": 520}
    return yaml.safe_dump(
        {
            "gpus": GPUS,
            "model": "NVIDIA H100 80GB HBM3",
            "driverVersion": "570.124.06",
            "defaults": {**defaults, "utilizationPercent": 96},
            "timeline": timeline,
        }
    )


def test_live_scrapes_of_real_agents_import_and_backtest_to_the_drain(tmp_path: Path) -> None:
    binary = tool("prometheus")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE_KUBECONFIG)
    agent_ports = dict(zip(NODES, ports.free_ports(len(NODES)), strict=True))
    agents = []
    for node, port in agent_ports.items():
        # The DBE comes a few scrapes in, so Prometheus has seen the GPU healthy first.
        timeline = (
            [{"after": "12s", "gpu": 1, "set": {"eccUncorrectedVolatile": 1}}] if node == "sick" else []
        )
        (tmp_path / f"{node}.yaml").write_text(scenario(timeline))
        argv = [
            str(BIN / "gpu-health-agent"), "run", f"--node-name={node}", "--backend=sim",
            f"--sim-scenario={tmp_path / f'{node}.yaml'}", "--interval=1", f"--metrics-port={port}",
            f"--kubeconfig={kubeconfig}", "--log-level=ERROR",
        ]  # fmt: skip
        agents.append(processes.ManagedProcess(f"agent-{node}", argv, tmp_path / f"agent-{node}.log"))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "gpu-health-agent",
                # The node label the chart's ServiceMonitor relabels from the pod's node.
                "static_configs": [
                    {"targets": [f"{ports.LOOPBACK}:{port}"], "labels": {"node": node}}
                    for node, port in agent_ports.items()
                ],
            }
        ],
    }
    prometheus = _prometheus_module().Prometheus(binary, tmp_path, config, {"groups": []})
    dbe = 'gpuhealth_agent_gpu_ecc_errors{node="sick",gpu="1",kind="uncorrected",scope="volatile"}'
    trace = tmp_path / "scraped.jsonl"
    for agent in agents:
        agent.start()
    prometheus.process.start()
    try:
        waiting.wait_until(prometheus.ready, timeout_seconds=60, message="Prometheus ready")
        # Twenty seconds of the error scraped (the replay's drain needs a few samples of it).
        waiting.wait_until(
            lambda: prometheus.query(f"count_over_time(({dbe} == 1)[5m:1s]) >= 20"),
            timeout_seconds=120,
            interval_seconds=1,
            message="20 s of the DBE in Prometheus",
        )
        imported = sim(
            "trace", "import", "--prometheus", prometheus.url, "--since", "2m", "--step", "1s",
            "--heartbeat-seconds", "10", "--selector", 'job="gpu-health-agent"', "--out", str(trace),
            timeout=120,
        )  # fmt: skip
        assert imported.returncode == 0, imported.stderr
        assert "2 nodes" in imported.stdout, imported.stdout
    except BaseException:
        print(f"----- prometheus ({prometheus.process.log_path}) -----\n{prometheus.process.log_tail(30)}")
        raise
    finally:
        prometheus.process.stop(grace_seconds=10)
        for agent in agents:
            agent.stop(grace_seconds=5)

    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    replayed = sim(
        "backtest", "--policy", str(policy), "--trace", str(trace), "--tick-seconds", "1", "-o", "json",
        timeout=120,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    (report,) = json.loads(replayed.stdout)["policies"]
    actions = [(a["node"], a["action"]) for a in report["nodeActions"] if not a["action"].startswith("Label")]
    assert ("sick", "Drain") in actions, actions
    assert not [a for a in actions if a[0] == "well"], actions
