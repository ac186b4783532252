"""The chart's alerts and dashboard in a real Prometheus, scraping a real operator and real agents.

A mission run (conftest.py: the chart installed, the operator and the agents
as processes with the chart's service accounts) whose agents serve /metrics,
scraped every second by Debian's `prometheus` (loopback only, a throwaway
storage directory) with the chart's rules loaded as `helm template` renders
them. Through Prometheus's HTTP API the test watches:

- an uncorrectable ECC error: GPUHealthNodesUnhealthy goes pending, then firing;
- an agent that hangs (SIGSTOP): the operator marks its node Unknown
  (GPUHealthAgentsStale) and its /metrics stops answering
  (GPUHealthAgentScrapeDown), each pending then firing;
- recovery (the GPU replaced, the agent resumed): all three resolve;
- every expression of the Grafana dashboard returns data, and every series it
  reads (through the recording rules too) exists: a panel whose only data is
  a rule's `or vector(0)` fallback fails. kube-state-metrics'
  `kube_node_spec_unschedulable` (the cordon and idle records) comes from a
  stand-in that serves it from the Nodes' `spec.unschedulable`.

Timings: the chart's `for:` values are rendered at their minimum (1 minute,
`metrics.prometheusRule.*ForMinutes=1`); rule groups are evaluated every
second instead of the chart's 1 m for the recording rules. Without
`prometheus` installed the test skips, except on CI, where it fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from http import server
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from gpuhealth_api import vocabulary
from gpuhealth_sim.controlplane import binaries, ports, processes

pytestmark = pytest.mark.e2e

ROOT: Final = Path(__file__).resolve().parents[2]
DASHBOARD: Final = ROOT / "charts" / "gpu-health" / "files" / "dashboard.json"
RELEASE: Final = "mission"
"""conftest.py's release: the rules name the agent's scrape job after it."""
MODEL: Final = "NVIDIA H100 80GB HBM3"
BUSY: Final = {"temperatureCelsius": 45, "smClockMHz": 1980, "maxSmClockMHz": 1980, "powerWatts": 520}
DBE: Final = {"eccUncorrectedVolatile": 1, "eccUncorrectedAggregate": 1, "retiredPagesPending": True}
SHORT_FOR: Final = [
    f"metrics.prometheusRule.{key}=1"
    for key in (
        "unhealthyForMinutes",
        "budgetExhaustedForMinutes",
        "staleAgentsForMinutes",
        "agentDownForMinutes",
    )
]
"""The chart's minimum `for:` (its schema allows no less than a minute)."""
INTERVAL: Final = "1s"
FIRING_TIMEOUT_SECONDS: Final = 150.0
"""Fault to firing: detection (30 s for a stale agent) + `for: 1m` + evaluation, on a busy machine."""
SETTLE_TIMEOUT_SECONDS: Final = 90.0
NODE_TABLE: Final = (
    "max by (cluster, policy, node, health, condition) ("
    'gpuhealth_operator_node_unhealthy{cluster=~"$cluster"}'
    ' * on (cluster, instance) group_left () (gpuhealth_operator_leader{cluster=~"$cluster"} == 1))'
)
CHECKS_BY_RESULT: Final = (
    'sum by (result) (increase(gpuhealth_operator_checks_total{cluster=~"$cluster"}[1h]))'
)
CHECKS_OVERDUE: Final = (
    'sum by (policy, check) (gpuhealth_operator_checks_overdue_nodes{cluster=~"$cluster"})'
)
CHECK_GPU_HOURS: Final = (
    'sum(increase(gpuhealth_operator_check_gpu_seconds_total{cluster=~"$cluster"}[24h])) / 3600'
)
NO_CHECKS: Final = "series per policy and check only once a policy has spec.activeChecks; this run's has none"
EMPTY_UNTIL_AN_ERROR: Final[dict[str, str]] = {
    NODE_TABLE: "series only while a node is not Healthy: the sick node recovered before the check"
    " (GPUHealthNodeUnhealthy firing for it proved the series)",
    CHECKS_BY_RESULT: NO_CHECKS,
    CHECKS_OVERDUE: NO_CHECKS,
    CHECK_GPU_HOURS: NO_CHECKS,
}
"""Dashboard expressions allowed to return nothing in a run without failures, and why."""
CLUSTER: Final = "e2e"
"""The `cluster` target label every scrape adds here, as a multi-cluster setup does: $cluster selects it."""


def scenario(timeline: list[dict[str, Any]] | None = None) -> str:
    return yaml.safe_dump(
        {
            "gpus": 8,
            "model": MODEL,
            "driverVersion": "570.124.06",
            "defaults": {**BUSY, "utilizationPercent": 96},
            "timeline": timeline or [],
        },
        sort_keys=False,
    )


TOKEN: Final = re.compile(
    r'"(?:[^"\\]|\\.)*"|[a-zA-Z_:][a-zA-Z0-9_:]*|\d+[smhdwy]|[0-9.]+(?:e[+-]?\d+)?|=~|!~|!=|==|>=|<=|\S'
)
GROUPING: Final = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
PROMQL_WORDS: Final = GROUPING | {"bool", "and", "or", "unless", "offset"}


def series_read(expr: str, records: dict[str, str]) -> set[str]:
    """The raw series `expr` reads, through the recording rules it names (`records`: record → its
    expression): names neither called nor PromQL words, outside label matchers, ranges and groupings
    (test_alert_rules.py's reader, cut down)."""
    tokens = TOKEN.findall(expr)
    names: set[str] = set()
    i = 0
    while i < len(tokens):
        token, following = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in ("[", "{"):  # a range, or a selector's matchers
            i = tokens.index("]" if token == "[" else "}", i) + 1
            continue
        if token in GROUPING and following == "(":
            i = tokens.index(")", i) + 1
            continue
        named = re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", token) and token not in PROMQL_WORDS
        if named and following != "(" and following not in GROUPING:
            names |= series_read(records[token], records) if token in records else {token}
        i += 1
    return names


def test_series_read_follows_the_records_and_skips_words_and_strings() -> None:
    records = {"a:b:sum": 'sum(x_total{y="z"}) or vector(0)'}
    read = series_read("sum by (le) (rate(h_bucket[5m])) * on (node) group_left () a:b:sum > bool 1", records)
    assert read == {"h_bucket", "x_total"}


class KubeStateMetrics:
    """A stand-in for kube-state-metrics: `kube_node_spec_unschedulable` of the mission's Nodes."""

    def __init__(self, cordoned: Callable[[str], bool], nodes: list[str]) -> None:
        metrics = self

        class Handler(server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = metrics.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.cordoned, self.nodes = cordoned, nodes
        self.http = server.ThreadingHTTPServer((ports.LOOPBACK, 0), Handler)
        self.port = self.http.server_address[1]

    def exposition(self) -> str:
        lines = ["# TYPE kube_node_spec_unschedulable gauge"]
        lines += [f'kube_node_spec_unschedulable{{node="{n}"}} {int(self.cordoned(n))}' for n in self.nodes]
        return "\n".join(lines) + "\n"

    def serving(self) -> Iterator[None]:
        thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.http.shutdown()
            self.http.server_close()


def chart_rules(helm: Path) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("chart_rules", ROOT / "hack" / "chart_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rules: dict[str, Any] = module.render(helm, SHORT_FOR, release=RELEASE)
    for group in rules["groups"]:
        group.pop("interval", None)  # every group at the global evaluation interval
    return rules


class Prometheus:
    """A Prometheus process on the loopback and a small client of its HTTP API."""

    def __init__(self, binary: str, workdir: Path, config: dict[str, Any], rules: dict[str, Any]) -> None:
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        (workdir / "prometheus.yaml").write_text(yaml.safe_dump({**config, "rule_files": ["rules.yaml"]}))
        (self.port,) = ports.free_ports(1)
        self.url = f"http://{ports.LOOPBACK}:{self.port}"
        argv = [
            binary,
            f"--config.file={workdir / 'prometheus.yaml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={ports.LOOPBACK}:{self.port}",
            "--log.level=warn",
        ]
        self.process = processes.ManagedProcess("prometheus", argv, workdir / "prometheus.log")

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        if not self.process.running():
            raise self.process.failure("exited")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=expr)["result"]
        return result

    def alerts(self, name: str, **labels: str) -> list[dict[str, Any]]:
        """Active alerts (pending or firing) named `name` whose labels include `labels`."""
        return [
            a
            for a in self.get("/api/v1/alerts")["alerts"]
            if a["labels"].get("alertname") == name and labels.items() <= a["labels"].items()
        ]

    def state(self, name: str, **labels: str) -> str | None:
        """ "firing", "pending", or None while the alert is inactive."""
        states = {a["state"] for a in self.alerts(name, **labels)}
        return "firing" if "firing" in states else next(iter(states), None)


@pytest.fixture
def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed on CI: .ci/run must apt-get install prometheus")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    return found


def test_alerts_fire_and_resolve_and_every_dashboard_query_has_data(
    mission: Any, prometheus_binary: str, tmp_path: Path
) -> None:
    rules = chart_rules(binaries.locate(cwd=ROOT) / "helm")
    alert_rules = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    agent_job = re.search(r'up\{job="([^"]+)"\}', alert_rules["GPUHealthAgentScrapeDown"]["expr"])
    assert agent_job, alert_rules["GPUHealthAgentScrapeDown"]["expr"]

    sick, hung, spare = mission.add_nodes("sick", "hung", "spare")
    mission.bare_pod(sick)  # something for the drain to evict
    policy = mission.policy(
        dryRun=False,
        maxUnavailable=1,
        rules=[{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
        drain={"timeoutSeconds": 60, "force": True},  # the sick node's pod is bare
        recovery={"uncordon": True, "healthyForSeconds": 2},
    )
    agent_ports = dict(zip((sick, hung, spare), ports.free_ports(3), strict=True))
    # The DBE comes a few scrapes in, so Prometheus has seen the GPU healthy first.
    mission.start_agent(
        sick, scenario([{"after": "5s", "gpu": 3, "set": DBE}]), metrics_port=agent_ports[sick]
    )
    for node in (hung, spare):
        mission.start_agent(node, scenario(), metrics_port=agent_ports[node])
    state_metrics = KubeStateMetrics(mission.cordoned, [sick, hung, spare])

    config = {
        "global": {"scrape_interval": INTERVAL, "scrape_timeout": INTERVAL, "evaluation_interval": INTERVAL},
        "scrape_configs": [
            {
                "job_name": agent_job.group(1),
                # The node label the chart's ServiceMonitor relabels from the pod's node.
                "static_configs": [
                    {"targets": [f"{ports.LOOPBACK}:{port}"], "labels": {"node": node, "cluster": CLUSTER}}
                    for node, port in agent_ports.items()
                ],
            },
            {
                "job_name": f"{RELEASE}-gpu-health-operator-metrics",
                "static_configs": [
                    {
                        "targets": [f"{ports.LOOPBACK}:{mission.operator.metrics_port}"],
                        "labels": {"cluster": CLUSTER},
                    }
                ],
            },
            {
                "job_name": "kube-state-metrics",
                "static_configs": [
                    {"targets": [f"{ports.LOOPBACK}:{state_metrics.port}"], "labels": {"cluster": CLUSTER}}
                ],
            },
        ],
    }
    prometheus = Prometheus(prometheus_binary, tmp_path, config, rules)
    prometheus.process.start()
    serving = contextlib.contextmanager(state_metrics.serving)
    try:
        with serving():
            run(mission, prometheus, policy, sick, hung, agent_ports, rules)
    except BaseException:
        print(f"----- prometheus ({prometheus.process.log_path}) -----\n{prometheus.process.log_tail(30)}")
        raise
    finally:
        prometheus.process.stop(grace_seconds=10)


def run(
    mission: Any,
    prometheus: Prometheus,
    policy: str,
    sick: str,
    hung: str,
    agent_ports: dict[str, int],
    rules: dict[str, Any],
) -> None:
    def wait(predicate: Any, message: str, timeout: float = SETTLE_TIMEOUT_SECONDS) -> Any:
        def check() -> Any:
            if not prometheus.process.running():
                raise prometheus.process.failure("exited")
            return predicate()

        return mission.wait(check, message, timeout)

    wait(prometheus.ready, "Prometheus ready")
    groups = prometheus.get("/api/v1/rules")["groups"]
    assert {r["health"] for g in groups for r in g["rules"]} <= {"ok", "unknown"}, groups
    wait(
        lambda: (
            len([t for t in prometheus.get("/api/v1/targets")["activeTargets"] if t["health"] == "up"]) == 5
        ),
        "every agent, the operator and kube-state-metrics scraped",
    )

    # A DBE: the node is Unhealthy, the alert goes pending (for: 1m), then fires; nothing else fires.
    hung_agent = mission.agents.pop(hung)  # a stopped agent must not fail mission.wait()
    try:
        wait(
            lambda: prometheus.state("GPUHealthNodesUnhealthy", policy=policy) == "pending",
            "GPUHealthNodesUnhealthy pending",
        )
        # The agent on `hung` hangs: no heartbeat, no /metrics.
        hung_agent.signal(signal.SIGSTOP)
        wait(
            lambda: prometheus.state("GPUHealthAgentScrapeDown", node=hung) == "pending",
            "GPUHealthAgentScrapeDown pending for the hung agent",
        )
        wait(
            lambda: prometheus.state("GPUHealthNodesUnhealthy", policy=policy) == "firing",
            "GPUHealthNodesUnhealthy firing",
            FIRING_TIMEOUT_SECONDS,
        )
        (alert,) = prometheus.alerts("GPUHealthNodesUnhealthy", policy=policy)
        assert alert["labels"]["severity"] == "warning"
        assert alert["annotations"]["summary"] == f"1 GPU node(s) Unhealthy under policy {policy}"
        # The per-node alert names the node (a series only for it: the healthy nodes have none).
        wait(
            lambda: (
                prometheus.state("GPUHealthNodeUnhealthy", node=sick, condition="EccUncorrectable")
                == "firing"
            ),
            "GPUHealthNodeUnhealthy firing for the sick node",
            FIRING_TIMEOUT_SECONDS,
        )
        assert {a["labels"]["node"] for a in prometheus.alerts("GPUHealthNodeUnhealthy", policy=policy)} == {
            sick
        }
        wait(
            lambda: prometheus.state("GPUHealthAgentsStale", policy=policy) == "pending",
            "GPUHealthAgentsStale pending (three missed heartbeats)",
        )
        wait(
            lambda: (
                prometheus.state("GPUHealthAgentScrapeDown", node=hung) == "firing"
                and prometheus.state("GPUHealthAgentsStale", policy=policy) == "firing"
            ),
            "GPUHealthAgentScrapeDown and GPUHealthAgentsStale firing",
            FIRING_TIMEOUT_SECONDS,
        )
        assert mission.gpunode_status(hung)["health"] == vocabulary.Health.UNKNOWN
        for quiet in ("GPUHealthOperatorNotLeading", "GPUHealthBudgetExhausted", "GPUHealthDrainFailed"):
            assert prometheus.state(quiet) is None, prometheus.alerts(quiet)
        assert prometheus.state("GPUHealthAgentScrapeDown", node=sick) is None
    finally:
        hung_agent.signal(signal.SIGCONT)
        mission.agents[hung] = hung_agent

    status = mission.gpunode_status(sick)
    assert status["health"] == vocabulary.Health.UNHEALTHY, status
    wait(
        lambda: mission.gpunode_status(sick).get("action") == vocabulary.NodeAction.DRAINED,
        "the sick node cordoned and drained",
    )

    # Recovery: the sick node's GPU replaced (its agent restarted healthy), the hung agent resumed.
    sick_agent = mission.agents.pop(sick)
    sick_agent.stop(grace_seconds=10)
    mission.start_agent(sick, scenario(), metrics_port=agent_ports[sick])
    wait(lambda: not mission.cordoned(sick), "the sick node uncordoned after its repair")
    for name, labels in (
        ("GPUHealthNodesUnhealthy", {"policy": policy}),
        ("GPUHealthNodeUnhealthy", {"node": sick}),
        ("GPUHealthAgentsStale", {"policy": policy}),
        ("GPUHealthAgentScrapeDown", {"node": hung}),
    ):
        wait(lambda name=name, labels=labels: prometheus.state(name, **labels) is None, f"{name} resolved")

    # Every dashboard query, its variables substituted as Grafana would, returns data from real series.
    records = {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    check_dashboard(prometheus, wait, records)


def check_dashboard(prometheus: Prometheus, wait: Any, records: dict[str, str]) -> None:
    board = json.loads(DASHBOARD.read_text())
    variables: dict[str, str] = {}
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", variable["query"]["query"])
        assert match, variable
        values = wait(
            lambda match=match: sorted({s["metric"][match[2]] for s in prometheus.query(match[1])}),
            f"values of ${variable['name']}",
        )
        variables[variable["name"]] = "|".join(values)  # a multi-value selection, as Grafana expands it
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", []) if t.get("expr")]
    assert exprs
    empty: dict[str, str] = {}
    for expr in exprs:
        query = re.sub(r"\$\{?(\w+)\}?", lambda m: variables[m[1]], expr)
        if expr in EMPTY_UNTIL_AN_ERROR:
            prometheus.query(query)  # valid PromQL, data or not
            continue
        try:
            wait(lambda query=query: prometheus.query(query), f"dashboard query {query} returns data", 20)
        except TimeoutError:
            empty[expr] = query
    assert not empty, f"dashboard queries without data: {empty}"
    # Data is not enough: `or vector(0)` in a record answers 0 with none of its series scraped.
    missing = {
        expr: sorted(name for name in series_read(expr, records) if not prometheus.query(f"group({name})"))
        for expr in exprs
        if expr not in EMPTY_UNTIL_AN_ERROR
    }
    missing = {expr: names for expr, names in missing.items() if names}
    assert not missing, f"dashboard queries whose series Prometheus does not have: {missing}"
