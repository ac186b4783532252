"""The Helm chart renders what it promises, for every ci/*-values.yaml variant.

`helm lint --strict` and `helm template` run the real helm; the rendered
objects then go to the local kube-apiserver with a server-side dry-run, so
schemas, CEL expressions (the ValidatingAdmissionPolicy) and Pod Security
labels are checked by the code that will check them in production. Values
the chart must refuse are refused with a message naming them, and every
value is documented and in values.schema.json.
"""

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml

from gpuhealth_agent import cli as agent_cli
from gpuhealth_agent import metrics as agent_metrics
from gpuhealth_api import __version__, resources
from gpuhealth_operator.runtime import cli as operator_cli
from gpuhealth_operator.shared import metrics as operator_metrics
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
VARIANTS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
RELEASE = "render"
# helm template checks the chart's kubeVersion against this, not against a cluster.
KUBE_VERSION = "1.36.0"
# Kinds served by the Prometheus Operator's CRDs, which the local cluster does
# not have; their content is asserted from the rendered YAML instead.
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def render(cp: local.ControlPlane, *args: str, namespace: str = "gpu-health") -> list[dict[str, Any]]:
    out = cp.helm(
        "template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION, *args
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_ci_variants_exist() -> None:
    assert {
        "minimal-values.yaml",
        "monitoring-values.yaml",
        "default-policy-values.yaml",
        "vap-off-values.yaml",
    } <= set(VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_is_clean(control_plane: local.ControlPlane, variant: str) -> None:
    result = control_plane.helm("lint", "--strict", str(CHART), "-f", str(CHART / "ci" / variant))
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_are_labelled_and_selectors_are_stable(
    control_plane: local.ControlPlane, variant: str
) -> None:
    objects = render(control_plane, "-f", str(CHART / "ci" / variant))
    assert objects
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/instance") == RELEASE, obj["metadata"]["name"]
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", obj["metadata"]["name"]
    for workload in by_kind(objects, "Deployment") + by_kind(objects, "DaemonSet"):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert "helm.sh/chart" not in selector
        assert "app.kubernetes.io/version" not in selector
        assert selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_default_install_is_hardened_and_wired(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane)
    (operator,) = by_kind(objects, "Deployment")
    (agent,) = by_kind(objects, "DaemonSet")
    for workload in (operator, agent):
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["image"] == f"ghcr.io/gpu-health/gpu-health:{__version__}"
        assert not [v for v in pod.get("volumes", []) if "hostPath" in v]

    op_pod = operator["spec"]["template"]["spec"]
    op_container = op_pod["containers"][0]
    assert op_container["command"] == ["gpu-health-operator"]
    assert "--leader-elect" in op_container["args"]
    assert "--lease-namespace=$(POD_NAMESPACE)" in op_container["args"]
    # client-go's timings: a leader that cannot renew for 10 s stops writing, 5 s before a standby may start.
    timings = {"--lease-duration-seconds=15", "--lease-renew-deadline-seconds=10", "--lease-retry-seconds=2"}
    assert timings <= set(op_container["args"])
    assert op_container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = {e["name"]: e for e in op_container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert operator["spec"]["replicas"] == 2
    assert by_kind(objects, "PodDisruptionBudget")

    ag_pod = agent["spec"]["template"]["spec"]
    ag_container = ag_pod["containers"][0]
    assert ag_container["command"] == ["gpu-health-agent", "run"]
    assert "--backend=nvml" in ag_container["args"]
    env = {e["name"]: e for e in ag_container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # GPU nodes by each platform's label, ORed (test_chart_platforms.py): no nodeSelector to AND them.
    assert "nodeSelector" not in ag_pod
    assert ag_pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in ag_pod["tolerations"]
    assert ag_pod["priorityClassName"] == "system-node-critical"
    assert "runtimeClassName" not in ag_pod
    assert ag_container["ports"] == [{"name": "metrics", "containerPort": 9101, "protocol": "TCP"}]
    # Readiness is the agent's liveness for the operator (NVML loop and API contact); liveness only the loop.
    assert ag_container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert ag_container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--heartbeat=300" in ag_container["args"]
    # The operator watches exactly this DaemonSet's pods.
    (selector,) = [a.split("=", 1)[1] for a in op_container["args"] if a.startswith("--agent-pod-selector=")]
    assert dict(pair.split("=") for pair in selector.split(",")) == agent["spec"]["selector"]["matchLabels"]
    assert f"--agent-pod-namespace={agent['metadata']['namespace']}" in op_container["args"]
    # The agent watches every GPU without taking one from the workloads.
    for amounts in ag_container["resources"].values():
        assert "nvidia.com/gpu" not in amounts

    assert by_kind(objects, "ValidatingAdmissionPolicy")
    assert not by_kind(objects, resources.POLICY_KIND), "the default policy is off by default"
    assert not (MONITORING_KINDS & {o["kind"] for o in objects})


@pytest.mark.parametrize("variant", VARIANTS)
def test_entry_points_accept_the_rendered_arguments(control_plane: local.ControlPlane, variant: str) -> None:
    objects = render(control_plane, "-f", str(CHART / "ci" / variant))
    (operator,) = by_kind(objects, "Deployment")
    (agent,) = by_kind(objects, "DaemonSet")
    op_container = operator["spec"]["template"]["spec"]["containers"][0]
    config = operator_cli.parse_args(op_container["args"])
    assert config.metrics_port == op_container["ports"][0]["containerPort"]
    ag_container = agent["spec"]["template"]["spec"]["containers"][0]
    args = agent_cli.parser().parse_args(ag_container["command"][1:] + ag_container["args"])
    assert args.metrics_port == ag_container["ports"][0]["containerPort"]
    assert args.command == "run"


def test_default_policy_is_dry_run(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane, "-f", str(CHART / "ci" / "default-policy-values.yaml"))
    (policy,) = by_kind(objects, resources.POLICY_KIND)
    assert policy["apiVersion"] == resources.API_VERSION
    assert policy["spec"]["dryRun"] is True
    assert policy["spec"]["maxUnavailable"] == "10%"
    assert {r["condition"] for r in policy["spec"]["rules"]} >= {"EccUncorrectable", "XidCritical"}
    (agent,) = by_kind(objects, "DaemonSet")
    container = agent["spec"]["template"]["spec"]["containers"][0]
    assert "--backend=sim" in container["args"]
    (scenario,) = [o for o in by_kind(objects, "ConfigMap") if "scenario.yaml" in o.get("data", {})]
    assert yaml.safe_load(scenario["data"]["scenario.yaml"])["gpus"] == 8


OUR_METRIC = re.compile(r"\bgpuhealth_(?:agent|operator)_[a-z0-9_]+")
SERIES_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_metric_names() -> set[str]:
    """Series names the agent's and the operator's metric modules expose."""
    agent_registry = prometheus_client.CollectorRegistry()
    agent_metrics.AgentMetrics(agent_registry)
    names: set[str] = set()
    for registry in (agent_registry, operator_metrics.Metrics.create().registry):
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SERIES_SUFFIXES.get(family.type, ("",)))
    return names


def test_monitoring_objects(control_plane: local.ControlPlane) -> None:
    objects = render(control_plane, "-f", str(CHART / "ci" / "monitoring-values.yaml"))
    monitors = by_kind(objects, "ServiceMonitor")
    assert len(monitors) == 2
    assert all(m["metadata"]["labels"]["release"] == "kube-prometheus-stack" for m in monitors)
    (rule,) = by_kind(objects, "PrometheusRule")
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    alerts = {r["alert"] for r in rules if "alert" in r}
    assert {
        "GPUHealthNodesUnhealthy",
        "GPUHealthDrainFailed",
        "GPUHealthBudgetExhausted",
        "GPUHealthAgentsStale",
        "GPUHealthAgentScrapeDown",
    } <= alerts
    records = {r["record"] for r in rules if "record" in r}
    assert {
        "gpuhealth:gpus_healthy:ratio",
        "gpuhealth:nodes_healthy:ratio",
        "gpuhealth:gpus_cordoned:sum",
        "gpuhealth:gpu_hours_lost_to_cordon:24h",
        "gpuhealth:gpus_idle:count",
    } <= records
    scrape_down = next(r for r in rules if r.get("alert") == "GPUHealthAgentScrapeDown")
    assert f'job="{RELEASE}-gpu-health-agent-metrics"' in scrape_down["expr"]
    # Every gpu-health metric a rule reads is one the agent or operator exports.
    used = {name for r in rules for name in OUR_METRIC.findall(r["expr"])}
    assert used, "the rules read no gpu-health metric"
    assert used <= exported_metric_names(), used - exported_metric_names()
    (dashboard,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    panels = json.loads(dashboard["data"]["gpu-health.json"])["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    used = {name for expr in exprs for name in OUR_METRIC.findall(expr)}
    assert used <= exported_metric_names(), used - exported_metric_names()
    records_used = {name for expr in exprs for name in re.findall(r"gpuhealth:[a-z_:0-9]+", expr)}
    assert records_used <= records, records_used - records


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_pass_server_side_dry_run(
    crds: local.ControlPlane, namespace: str, variant: str
) -> None:
    crds.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    objects = render(crds, "-f", str(CHART / "ci" / variant), namespace=namespace)
    # `helm test` hooks are created only by `helm test` (test_chart_day2.py checks its pod).
    checked = [
        o
        for o in objects
        if o["kind"] not in MONITORING_KINDS and "helm.sh/hook" not in o["metadata"].get("annotations", {})
    ]
    manifest = yaml.safe_dump_all(checked)
    result = crds.kubectl(
        "apply", "--dry-run=server", "--server-side", "--field-manager=chart-test", "-f", "-", input=manifest
    )
    applied = [line for line in result.stdout.splitlines() if "serverside-applied" in line]
    assert len(applied) == len(checked), result.stdout
    # Pod Security admission warns about workloads whose pods it would reject.
    assert "would violate PodSecurity" not in result.stderr, result.stderr


CONTRADICTIONS = [
    (
        ["--set", "defaultPolicy.enabled=true", "--set-json", "defaultPolicy.rules=[]"],
        "defaultPolicy.rules is empty",
    ),
    (["--set", "agent.backend=sim"], "agent.backend=sim needs a scenario"),
    (
        [
            "--set",
            "agent.backend=sim",
            "--set",
            "agent.sim.scenario=gpus: 1",
            "--set",
            "agent.sim.existingConfigMap=x",
        ],
        "are exclusive",
    ),
    (["--set", "agent.sim.existingConfigMap=x"], "agent.backend is not sim"),
    (
        ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true"],
        "exclusive",
    ),
    (
        ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"],
        "needs metrics.service.enabled",
    ),
    (["--set", "metrics.prometheusRule.enabled=true"], "agent's scrape job"),
    (
        ["--set", "operator.leaderElection.enabled=false"],
        "operator.replicas > 1 needs operator.leaderElection",
    ),
    (
        ["--set", "operator.leaderElection.renewDeadlineSeconds=15"],
        "renewDeadlineSeconds must be less than leaseDurationSeconds",
    ),
    (["--set", "operator.leaderElection.retryPeriodSeconds=9"], "must exceed 1.2 x retryPeriodSeconds"),
    # The schema: wrong types, unknown keys, values outside their sets.
    (["--set", "agent.backend=dcgm"], "/agent/backend"),
    (["--set", "operator.replicas=0"], "/operator/replicas"),
    (["--set", "operator.leaderElection.retryPeriodSeconds=0"], "retryPeriodSeconds"),
    (["--set", "agent.intervalSecs=5"], "intervalSecs"),
    (["--set", "defaultPolicy.maxUnavailable=lots"], "maxUnavailable"),
]


@pytest.mark.parametrize(("args", "message"), CONTRADICTIONS, ids=[m for _, m in CONTRADICTIONS])
def test_contradictory_values_are_refused(
    control_plane: local.ControlPlane, args: list[str], message: str
) -> None:
    result = control_plane.helm(
        "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *args, check=False
    )
    assert result.returncode != 0, f"rendered although {message!r} should fail it"
    assert message in result.stderr, result.stderr


def test_single_replica_operator_recreates(control_plane: local.ControlPlane) -> None:
    objects = render(
        control_plane, "--set", "operator.replicas=1", "--set", "operator.leaderElection.enabled=false"
    )
    (operator,) = by_kind(objects, "Deployment")
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    assert "--no-leader-elect" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not by_kind(objects, "PodDisruptionBudget")
    assert not [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]


def test_the_operators_lease_renewals_have_their_own_priority_level(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane)
    (schema,) = by_kind(objects, "FlowSchema")
    (account,) = [
        o for o in by_kind(objects, "ServiceAccount") if o["metadata"]["name"].endswith("-operator")
    ]
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": "leader-election"}
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [
        {
            "kind": "ServiceAccount",
            "serviceAccount": {"name": account["metadata"]["name"], "namespace": "gpu-health"},
        }
    ]
    assert rule["resourceRules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
            "namespaces": ["gpu-health"],
        }
    ]
    assert not by_kind(render(control_plane, "--set", "operator.leaderElection.priorityLevel="), "FlowSchema")


def test_one_release_per_node_pool_passes_its_selector_to_the_operator(
    control_plane: local.ControlPlane,
) -> None:
    (default,) = by_kind(render(control_plane), "Deployment")
    assert not [a for a in default["spec"]["template"]["spec"]["containers"][0]["args"] if "node-sel" in a]
    selector = "gpuhealth.io/pool in (a,b),!gpuhealth.io/exclude"
    objects = render(
        control_plane, "--set-string", f"operator.nodePoolSelector={selector.replace(',', chr(92) + ',')}"
    )
    (operator,) = by_kind(objects, "Deployment")
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--node-selector={selector}" in args
    assert operator_cli.parse_args(args).node_selector == selector


# -- values.yaml documentation and schema coverage (no cluster needed) -----------------------------

KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<rest>.*)$")


def documented_keys(text: str) -> dict[str, bool]:
    """Chart keys (dotted paths) in values.yaml -> whether a `# --` comment precedes them.

    Only lines at a nesting that the chart defines count as keys; the content
    of free-form values (resources, nodeSelector, rules...) is skipped by the
    caller, which knows from the schema where chart keys end.
    """
    keys: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in text.splitlines():
        match = KEY_LINE.match(line)
        if match and not line.lstrip().startswith("-"):
            indent = len(match["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            path = ".".join([k for _, k in stack] + [match["key"]])
            keys[path] = previous.strip().startswith("# --")
            stack.append((indent, match["key"]))
        if line.strip():
            previous = line
    return keys


def schema_leaves(schema: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    leaves: dict[str, dict[str, Any]] = {}
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        if "properties" in sub:
            leaves.update(schema_leaves(sub, f"{path}."))
        else:
            leaves[path] = sub
    return leaves


def test_every_value_is_documented_and_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    leaves = schema_leaves(schema)
    keys = documented_keys((CHART / "values.yaml").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def default(path: str) -> Any:
        value: Any = defaults
        for part in path.split("."):
            value = value[part]
        return value

    in_values = {path for path in keys if path in leaves}
    assert set(leaves) - {"global"} == in_values, "schema and values.yaml disagree"
    undocumented = sorted(path for path in in_values if not keys[path])
    assert undocumented == [], f"values without a '# --' comment: {undocumented}"
    # A key under a chart-defined object that the schema does not know is a typo or a gap.
    objects = (
        {""}
        | {p for p in keys if p not in leaves and "." not in p}
        | {".".join(p.split(".")[:-1]) for p in leaves if "." in p}
    )
    unknown = sorted(
        p for p in keys if p.rpartition(".")[0] in objects and p not in leaves and p not in objects
    )
    assert unknown == [], f"values.yaml keys missing from values.schema.json: {unknown}"
    for path in in_values:
        assert default(path) is not None or path == "defaultPolicy.drain.gracePeriodSeconds", path
    assert schema["additionalProperties"] is False


def test_docs_values_table_is_current() -> None:
    # Run as a script, so the test needs nothing on sys.path beyond the venv.
    script = ROOT / "hack" / "chart_values_table.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    doc = (ROOT / "docs" / "chart.md").read_text()
    assert result.stdout.strip() in doc, "docs/chart.md is stale: run hack/chart_values_table.py --write"


# -- NetworkPolicies: who may reach the metrics endpoints ------------------------------------------


def network_policies(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The rendered NetworkPolicies by the component of the pods they select."""
    return {
        p["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]: p
        for p in by_kind(objects, "NetworkPolicy")
    }


def admitted(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """Port → the peers admitted to it (None: any source)."""
    ports: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            ports[port["port"]] = rule.get("from")
    return ports


def test_default_install_admits_only_the_metrics_and_probe_ports(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane)
    (operator,) = by_kind(objects, "Deployment")
    (agent,) = by_kind(objects, "DaemonSet")
    policies = network_policies(objects)
    assert set(policies) == {"operator", "agent"}, "on by default"
    for workload, component in ((operator, "operator"), (agent, "agent")):
        policy = policies[component]
        assert policy["spec"]["podSelector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
        assert policy["spec"]["policyTypes"] == ["Ingress"], "egress (the API server, DCGM) untouched"
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        listening = {p["containerPort"] for p in container["ports"]}
        assert set(admitted(policy)) == listening, "every port the pod serves, and nothing else"
    # Nothing narrower configured: the metrics ports admit any source (a scrape from anywhere works).
    assert admitted(policies["operator"]) == {8080: None, 8081: None}
    assert admitted(policies["agent"]) == {9101: None}


def test_metrics_from_narrows_the_metrics_ports_to_the_given_peers(
    control_plane: local.ControlPlane,
) -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    objects = render(control_plane, "--set-json", f"networkPolicy.metrics.from=[{json.dumps(monitoring)}]")
    policies = network_policies(objects)
    assert admitted(policies["operator"]) == {8080: [monitoring], 8081: None}, "probes come from the kubelet"
    assert admitted(policies["agent"]) == {9101: [monitoring]}


def test_network_policies_can_be_turned_off(control_plane: local.ControlPlane) -> None:
    assert not by_kind(render(control_plane, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")


def test_the_monitoring_variant_admits_scrapes_from_its_prometheus_namespace_only(
    control_plane: local.ControlPlane,
) -> None:
    objects = render(control_plane, "-f", str(CHART / "ci" / "monitoring-values.yaml"))
    policies = network_policies(objects)
    for component, port in (("operator", 8080), ("agent", 9101)):
        peers = admitted(policies[component])[port]
        assert peers and all("namespaceSelector" in p for p in peers), peers
