"""The chart's alerts and recording rules, checked by Prometheus's own `promtool`.

The rules are rendered by the real helm (hack/chart_rules.py), then
`promtool check rules` parses them and `promtool test rules` runs the unit
tests in tests/promtool/ (every alert firing and not firing, every
recording rule). Series and label names are checked against what the code
exports: the metric families of the agent's and the operator's
prometheus_client registries, plus the target labels a scrape adds (`job`,
`instance`, and the labels the chart's monitors relabel onto agent series).
A rule, a unit-test input or a dashboard panel naming anything else fails
here. promtool comes from Debian's `prometheus` package (.ci/run installs
it); without it these tests skip, except on CI, where they fail.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Final

import prometheus_client
import pytest
import yaml

from gpuhealth_agent import metrics as agent_metrics
from gpuhealth_api import vocabulary
from gpuhealth_operator.shared import metrics as operator_metrics
from gpuhealth_sim.controlplane import binaries

pytestmark = pytest.mark.e2e

ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = ROOT / "charts" / "gpu-health"
UNIT_TESTS: Final = ROOT / "tests" / "promtool"
DASHBOARD: Final = CHART / "files" / "dashboard.json"
METRICS_DOC: Final = ROOT / "docs" / "metrics.md"
ALERTS_DOC: Final = ROOT / "docs" / "alerts.md"

SAMPLE_SUFFIXES: Final = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
}
SCRAPE_LABELS: Final = frozenset({"job", "instance", "cluster"})
"""Target labels every scraped series carries; `cluster` where a multi-cluster setup adds it (a target or
external label: the records keep it, the dashboard's $cluster selects it; absent, it changes nothing)."""
EXTERNAL: Final = {
    # kube-state-metrics (the cordon and idle records; documented in docs/alerts.md).
    "kube_node_spec_unschedulable": frozenset({"node"}),
}
"""Series the rules read that gpu-health does not export, with their own labels."""
KEYWORDS: Final = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
)
GROUPING: Final = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
TOKEN: Final = re.compile(
    r'"(?:[^"\\]|\\.)*"|[a-zA-Z_:][a-zA-Z0-9_:]*|\d+[smhdwy]|[0-9.]+(?:e[+-]?\d+)?|=~|!~|!=|==|>=|<=|\S'
)


# -- tools -------------------------------------------------------------------------------------------


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed on CI: .ci/run must apt-get install prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return found


def chart_rules_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_rules", ROOT / "hack" / "chart_rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def helm() -> Path:
    return binaries.locate(cwd=ROOT) / "helm"


@pytest.fixture(scope="module")
def rules(helm: Path) -> dict[str, Any]:
    """The chart's rules file as hack/chart_rules.py renders it (ci/monitoring-values.yaml)."""
    rendered: dict[str, Any] = chart_rules_module().render(helm)
    return rendered


@pytest.fixture(scope="module")
def rendered_monitors(helm: Path) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = chart_rules_module().template(helm)
    return [o for o in objects if o["kind"] in {"ServiceMonitor", "PodMonitor"}]


# -- what the code exports -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Exported:
    """Series names a scrape of our processes yields, each with its label names."""

    series: dict[str, frozenset[str]]

    def labels(self, name: str) -> frozenset[str] | None:
        return self.series.get(name)


def registry_series(
    registry: prometheus_client.CollectorRegistry, extra: frozenset[str]
) -> dict[str, frozenset[str]]:
    """Sample names of every family in `registry` with their label names (+ `extra` target labels)."""
    series: dict[str, frozenset[str]] = {}
    for collector in list(registry._collector_to_names):
        labelnames = frozenset(getattr(collector, "_labelnames", ()))
        # A collector without describe() (the process collector) names its families by collecting.
        describe = getattr(collector, "describe", None) or collector.collect
        for family in describe():
            for suffix in SAMPLE_SUFFIXES[family.type]:
                le = {"le"} if suffix == "_bucket" else set()
                series[family.name + suffix] = labelnames | le | extra
    return series


def monitor_target_labels(monitors: list[dict[str, Any]], component: str) -> frozenset[str]:
    """Labels the chart's ServiceMonitor/PodMonitor of `component` relabel onto its series."""
    labels: set[str] = set()
    for monitor in monitors:
        if monitor["metadata"]["labels"].get("app.kubernetes.io/component") != component:
            continue
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"].get("podMetricsEndpoints") or []
        for endpoint in endpoints:
            labels.update(r["targetLabel"] for r in endpoint.get("relabelings") or [] if "targetLabel" in r)
    return frozenset(labels)


@pytest.fixture(scope="module")
def exported(rendered_monitors: list[dict[str, Any]]) -> Exported:
    agent_targets = SCRAPE_LABELS | monitor_target_labels(rendered_monitors, "agent")
    operator_targets = SCRAPE_LABELS | monitor_target_labels(rendered_monitors, "operator")
    agent_registry = prometheus_client.CollectorRegistry()
    agent_metrics.AgentMetrics(agent_registry)
    series = {
        **registry_series(agent_registry, agent_targets),
        **registry_series(operator_metrics.Metrics.create().registry, operator_targets),
        # `up` exists for each of our targets, with the labels of its target.
        "up": agent_targets | operator_targets,
        **{name: labels | SCRAPE_LABELS for name, labels in EXTERNAL.items()},
    }
    return Exported(series)


def test_exported_series_come_from_the_registries(exported: Exported) -> None:
    # A sanity check of the derivation, not a hand list: families of both components, with suffixes.
    assert "gpuhealth_agent_gpu_ecc_errors" in exported.series
    assert {"gpu", "uuid", "kind", "scope", "node"} <= exported.series["gpuhealth_agent_gpu_ecc_errors"]
    assert "gpuhealth_operator_drain_duration_seconds_count" in exported.series
    assert "node" not in exported.series["gpuhealth_operator_nodes"], "operator series carry no node"


# -- reading PromQL ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Uses:
    """What a PromQL expression reads: series with the labels it matches on, and grouping labels."""

    selectors: list[tuple[str, dict[str, str]]] = dataclasses.field(default_factory=list)
    grouping: set[str] = dataclasses.field(default_factory=set)


def uses(expr: str) -> Uses:
    """Series selectors and grouping labels of `expr` (a small PromQL reader: enough for our rules)."""
    tokens = TOKEN.findall(expr)
    found = Uses()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token == "[":  # a range or subquery duration
            i = tokens.index("]", i) + 1
            continue
        if token in GROUPING and following == "(":
            end = tokens.index(")", i)
            found.grouping.update(t for t in tokens[i + 2 : end] if t != ",")
            i = end + 1
            continue
        # A name not called, and not an aggregation followed by its grouping (`sum by (x) (...)`).
        is_name = re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", token) and token not in KEYWORDS
        if is_name and following != "(" and following not in GROUPING:
            matchers: dict[str, str] = {}
            i += 1
            if following == "{":
                end = tokens.index("}", i)
                inner = [t for t in tokens[i + 1 : end] if t != ","]
                for label, _op, value in zip(inner[::3], inner[1::3], inner[2::3], strict=True):
                    matchers[label] = json.loads(value)
                i = end + 1
            found.selectors.append((token, matchers))
            continue
        i += 1
    return found


def test_promql_reader_finds_selectors_and_grouping_labels() -> None:
    read = uses(
        'sum by (policy) (increase(m_total{result="failed", a=~"x.*"}[30m])) * on (node) group_left () '
        "(max(b) or vector(0)) > bool 0 unless c offset 5m"
    )
    assert read.selectors == [("m_total", {"result": "failed", "a": "x.*"}), ("b", {}), ("c", {})]
    assert read.grouping == {"policy", "node"}


def rule_list(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rules["groups"] for rule in group["rules"]]


def record_labels(rules: dict[str, Any], exported: Exported) -> dict[str, frozenset[str]]:
    """Labels each recording rule's output can carry: its grouping labels that its inputs have."""
    recorded: dict[str, frozenset[str]] = {}
    for rule in rule_list(rules):
        if "record" in rule:
            read = uses(rule["expr"])
            known = {**exported.series, **recorded}
            inputs = {label for name, _ in read.selectors for label in known.get(name, ())}
            recorded[rule["record"]] = frozenset(read.grouping & inputs)
    return recorded


def unknown_names(expr: str, exported: Exported, recorded: dict[str, frozenset[str]]) -> list[str]:
    """Series and labels `expr` names that neither the code, a scrape, nor a recording rule provides."""
    known = {**exported.series, **recorded}
    read = uses(expr)
    problems: list[str] = []
    available: set[str] = set()
    for name, matchers in read.selectors:
        labels = known.get(name)
        if labels is None:
            problems.append(f"series {name} is exported by nothing")
            continue
        available |= labels
        problems += [f"{name} has no label {label}" for label in matchers if label not in labels]
        health = matchers.get("health")
        if (
            name == "gpuhealth_operator_nodes"
            and health
            and health not in {h.value for h in vocabulary.Health}
        ):
            problems.append(f"health={matchers['health']} is not a Health the operator reports")
    for label in read.grouping - available:
        problems.append(f"grouping label {label} is on none of {[n for n, _ in read.selectors]}")
    return problems


# -- the tests --------------------------------------------------------------------------------


def test_promtool_checks_the_rendered_rules(rules: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_list(rules))} rules found" in result.stdout, result.stdout


def test_rules_name_only_exported_series_and_labels(rules: dict[str, Any], exported: Exported) -> None:
    recorded = record_labels(rules, exported)
    problems = {
        rule.get("alert") or rule["record"]: unknown
        for rule in rule_list(rules)
        if (unknown := unknown_names(rule["expr"], exported, recorded))
    }
    assert not problems, problems


def test_a_misspelt_metric_or_label_is_caught(rules: dict[str, Any], exported: Exported) -> None:
    recorded = record_labels(rules, exported)
    assert unknown_names('sum by (policy) (gpuhealth_operator_node{health="Unhealthy"})', exported, recorded)
    assert unknown_names('sum by (policy) (gpuhealth_operator_nodes{helth="Unhealthy"})', exported, recorded)
    assert unknown_names('sum by (policy) (gpuhealth_operator_nodes{health="Sick"})', exported, recorded)
    assert unknown_names("max by (node) (gpuhealth_operator_leader)", exported, recorded)
    assert unknown_names("gpuhealth:no_such:record", exported, recorded)


@pytest.fixture
def unit_test_dir(rules: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    for test in UNIT_TESTS.glob("*.test.yaml"):
        shutil.copy(test, tmp_path / test.name)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    yield tmp_path


def unit_tests() -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in sorted(UNIT_TESTS.glob("*.test.yaml"))]


def test_promtool_unit_tests_pass(unit_test_dir: Path) -> None:
    files = sorted(p.name for p in unit_test_dir.glob("*.test.yaml"))
    assert files, f"no promtool unit tests in {UNIT_TESTS}"
    result = subprocess.run(
        [promtool(), "test", "rules", *files], cwd=unit_test_dir, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test(rules: dict[str, Any]) -> None:
    alerts = {rule["alert"] for rule in rule_list(rules) if "alert" in rule}
    fired: set[str] = set()
    quiet: set[str] = set()
    for suite in unit_tests():
        for test in suite["tests"]:
            for case in test.get("alert_rule_test", []):
                (fired if case["exp_alerts"] else quiet).add(case["alertname"])
    assert alerts - fired == set(), f"alerts no unit test fires: {alerts - fired}"
    assert alerts - quiet == set(), f"alerts no unit test keeps quiet: {alerts - quiet}"
    records = {rule["record"] for rule in rule_list(rules) if "record" in rule}
    tested = {
        case["expr"]
        for suite in unit_tests()
        for t in suite["tests"]
        for case in t.get("promql_expr_test", [])
    }
    assert records <= tested, f"recording rules without a unit test: {records - tested}"


TROUBLESHOOTING: Final = ROOT / "docs" / "troubleshooting.md"


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the Markdown headings: lower case, punctuation dropped, spaces to hyphens."""
    anchors: set[str] = set()
    for heading in re.findall(r"(?m)^#{1,6} (.+)$", markdown):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def test_every_alert_links_its_runbook_section(rules: dict[str, Any]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    base = values["metrics"]["prometheusRule"]["runbookBaseUrl"]
    assert base.endswith("/docs/troubleshooting.md"), base
    anchors = heading_anchors(TROUBLESHOOTING.read_text())
    problems: list[str] = []
    for rule in rule_list(rules):
        if "alert" not in rule:
            continue
        url = rule.get("annotations", {}).get("runbook_url", "")
        page, _, anchor = url.partition("#")
        if page != base or anchor != rule["alert"].lower() or anchor not in anchors:
            problems.append(f"{rule['alert']}: runbook_url {url!r}")
    assert not problems, "\n".join(problems)


SERIES: Final = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$")


def test_unit_test_inputs_are_series_the_code_exports(exported: Exported) -> None:
    problems: list[str] = []
    for suite in unit_tests():
        for test in suite["tests"]:
            for series in test["input_series"]:
                match = SERIES.match(series["series"].strip())
                assert match, series["series"]
                name = match["name"]
                labels = set(re.findall(r'(\w+)\s*=\s*"', match["labels"] or ""))
                known = exported.labels(name)
                if known is None:
                    problems.append(f"{test['name']}: {name} is exported by nothing")
                elif labels - known:
                    problems.append(f"{test['name']}: {name} has no label(s) {sorted(labels - known)}")
    assert not problems, "\n".join(problems)


# -- the dashboard --------------------------------------------------------------------------------


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", []) if t.get("expr")]
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        if variable.get("type") == "query" and text:
            # label_values(SELECTOR, label): the selector must match series.
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", text)
            exprs.append(inner.group(1) if inner else text)
    return exprs


def test_dashboard_panels_read_only_documented_exported_series(
    rules: dict[str, Any], exported: Exported
) -> None:
    recorded = record_labels(rules, exported)
    documented = set(re.findall(r"`(gpuhealth_[a-z0-9_]+)`", METRICS_DOC.read_text()))
    documented |= set(re.findall(r"`(gpuhealth:[a-z0-9_:]+)`", ALERTS_DOC.read_text()))
    problems: list[str] = []
    for expr in dashboard_exprs():
        text = re.sub(r"\$\{?(\w+)\}?", ".*", expr)
        problems += [f"{expr}: {p}" for p in unknown_names(text, exported, recorded)]
        for name, _ in uses(text).selectors:
            family = re.sub(r"_(bucket|count|sum)$", "", name) if name not in documented else name
            if name != "up" and name not in documented and family not in documented:
                problems.append(f"{expr}: {name} is not documented in docs/metrics.md or docs/alerts.md")
    assert not problems, "\n".join(problems)
