"""dcgm-exporter done right: find the exporter pod on this node, the counter set to enable, a real payload."""

from __future__ import annotations

import http.server
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_agent import cli, dcgm, dcgm_discovery, simulated
from gpuhealth_api import status

ROOT = Path(__file__).resolve().parents[3]
COUNTERS = ROOT / "examples" / "gpu-operator" / "dcgm-exporter-counters.yaml"
UUID0 = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
UUID1 = "GPU-2a3e6b5e-1b6d-4b5c-8f0e-7d6c5b4a3f21"

# What dcgm-exporter 3.x/4.x serves (format of its public README and default counters, GPU Operator
# deployment: Kubernetes pod labels empty on an idle GPU), with the agent's counter set enabled.
REAL_PAYLOAD = (Path(__file__).parent / "fixtures" / "dcgm-exporter-metrics.txt").read_text()


# -- a canned real payload ------------------------------------------------------------------------


def test_a_real_exporter_payload_parses_by_uuid() -> None:
    facts = dcgm.parse_text(REAL_PAYLOAD)
    assert set(facts) == {UUID0, UUID1}
    assert facts[UUID0] == dcgm.GpuFacts(
        uuid=UUID0,
        index=0,
        last_xid=0,
        dbe_volatile=3,
        remap_failure=False,
        thermal_violation=0,
        power_violation=0,
    )
    assert (facts[UUID1].last_xid, facts[UUID1].remap_failure, facts[UUID1].thermal_violation) == (
        79,
        True,
        123456,
    )


def test_a_real_payload_folds_into_nvml_facts() -> None:
    gpus = [
        status.GPUStatus(index=0, uuid=UUID0, ecc={"uncorrectedVolatile": 0}),
        status.GPUStatus(index=1, uuid=UUID1, remappedRows={"failure": False}),
    ]
    assert dcgm.fold(gpus, dcgm.parse_text(REAL_PAYLOAD), {}) == []  # first scrape: baseline
    assert gpus[0]["ecc"]["uncorrectedVolatile"] == 3
    assert gpus[1]["remappedRows"]["failure"] is True


# -- the counter set to enable ----------------------------------------------------------------------


def counters_csv() -> str:
    docs = [d for d in yaml.safe_load_all(COUNTERS.read_text()) if d]
    [configmap] = [d for d in docs if d.get("kind") == "ConfigMap"]
    [csv] = configmap["data"].values()
    return str(csv)


def test_the_shipped_counter_set_names_every_field_the_agent_reads() -> None:
    rows = [
        line.split(",") for line in counters_csv().splitlines() if line.strip() and not line.startswith("#")
    ]
    assert all(len(row) >= 3 for row in rows), "dcgm-exporter needs FIELD, type, help on every line"
    names = {row[0].strip() for row in rows}
    assert names >= dcgm.FIELDS, f"missing: {sorted(dcgm.FIELDS - names)}"
    # Whatever the module reads is in FIELDS (a new DCGM_FI_ constant must be added to both).
    read = set(re.findall(r"DCGM_FI_[A-Z_]+", (ROOT / "agent/gpuhealth_agent/dcgm.py").read_text()))
    assert read <= names


def test_the_docs_show_the_cluster_policy_snippet() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert "dcgm-exporter-counters.yaml" in operations
    assert "dcgmExporter:" in operations and "config:" in operations


# -- finding the exporter pod on this node ---------------------------------------------------------


def pod(
    name: str,
    ip: str | None = "10.1.2.3",
    *,
    phase: str = "Running",
    ready: bool = True,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "gpu-operator"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    st: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        st["podIP"] = ip
    return {"metadata": meta, "status": st}


class Pods:
    """The pods the API server lists, and what it was asked."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = list(pods)
        self.calls: list[tuple[str | None, str, str]] = []
        self.error: Exception | None = None

    def list_pods(
        self, namespace: str | None, label_selector: str, field_selector: str
    ) -> list[dict[str, Any]]:
        self.calls.append((namespace, label_selector, field_selector))
        if self.error is not None:
            raise self.error
        return list(self.pods)


def test_defaults_are_the_gpu_operators_exporter() -> None:
    # assets/state-dcgm-exporter/0800_daemonset.yaml: labels app=nvidia-dcgm-exporter, containerPort 9400.
    assert dcgm_discovery.DEFAULT_SELECTOR == "app=nvidia-dcgm-exporter"
    assert dcgm_discovery.DEFAULT_PORT == 9400


def test_it_asks_for_the_exporter_pods_on_its_own_node_and_scrapes_the_ready_one() -> None:
    pods = Pods(pod("a", "10.0.0.1", ready=False), pod("b", "10.0.0.2"), pod("c", "10.0.0.3", deleting=True))
    locator = dcgm_discovery.Locator(pods, "gpu-node-1", namespace="gpu-operator")
    assert locator.url() == "http://10.0.0.2:9400/metrics"
    assert pods.calls == [("gpu-operator", "app=nvidia-dcgm-exporter", "spec.nodeName=gpu-node-1")]
    assert locator.url() == "http://10.0.0.2:9400/metrics"
    assert len(pods.calls) == 1  # cached until a scrape fails or it is old


def test_ipv6_pod_ips_are_bracketed_and_the_port_is_configurable() -> None:
    locator = dcgm_discovery.Locator(Pods(pod("a", "fd00::7")), "n", port=9500, selector="app=dcgm")
    assert locator.url() == "http://[fd00::7]:9500/metrics"


@pytest.mark.parametrize(
    "pods",
    [
        Pods(),
        Pods(pod("pending", phase="Pending")),
        Pods(pod("no-ip", None)),
        Pods(pod("not-ready", ready=False)),
    ],
)
def test_no_running_ready_exporter_is_a_clear_error(pods: Pods) -> None:
    locator = dcgm_discovery.Locator(pods, "gpu-node-1")
    with pytest.raises(dcgm_discovery.NotFoundError, match=r"app=nvidia-dcgm-exporter.*gpu-node-1"):
        locator.url()


def test_an_api_error_is_a_clear_error() -> None:
    pods = Pods()
    pods.error = RuntimeError("403 Forbidden: cannot list pods")
    with pytest.raises(dcgm_discovery.NotFoundError, match="403 Forbidden"):
        dcgm_discovery.Locator(pods, "n").url()


class Forbidden(Exception):
    """What the Kubernetes client raises when RBAC refuses (an ApiException's attributes)."""

    status = 403
    reason = "Forbidden"
    body = (
        '{"kind":"Status","message":"pods is forbidden: User '
        '\\"system:serviceaccount:gpu-health:agent\\" cannot list resource \\"pods\\""}'
    )

    def __str__(self) -> str:
        return (
            "(403)\nReason: Forbidden\nHTTP response headers: HTTPHeaderDict({...})\nHTTP response body: ..."
        )


def test_an_rbac_refusal_is_one_line_that_says_what_is_missing() -> None:
    pods = Pods()
    pods.error = Forbidden()
    with pytest.raises(dcgm_discovery.NotFoundError) as caught:
        dcgm_discovery.Locator(pods, "n").url()
    said = str(caught.value)
    assert "\n" not in said
    assert "HTTP 403 Forbidden" in said and 'cannot list resource "pods"' in said


def test_it_looks_again_after_a_while_and_when_told_the_pod_failed() -> None:
    now = [0.0]
    pods = Pods(pod("a", "10.0.0.1"))
    locator = dcgm_discovery.Locator(pods, "n", clock=lambda: now[0])
    assert locator.url() == "http://10.0.0.1:9400/metrics"
    pods.pods = [pod("a2", "10.0.0.9")]  # the exporter was rolled: new pod, new IP
    locator.forget()
    assert locator.url() == "http://10.0.0.9:9400/metrics"
    pods.pods = [pod("a3", "10.0.0.10")]
    now[0] = dcgm_discovery.REDISCOVER_SECONDS + 1
    assert locator.url() == "http://10.0.0.10:9400/metrics"


@pytest.fixture
def exporter() -> Iterator[tuple[str, list[int]]]:
    hits: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(1)
            body = REAL_PAYLOAD.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def test_a_source_with_discovery_scrapes_the_pod_found_and_looks_again_when_it_fails(
    exporter: tuple[str, list[int]],
) -> None:
    address, hits = exporter
    host, port = address.split(":")
    pods = Pods(pod("gone", "127.0.0.1"))
    locator = dcgm_discovery.Locator(pods, "n", port=1)  # port 1: nothing listens, the old pod is gone
    source = dcgm.DcgmSource(locator=locator)
    assert source.scrape() is None
    assert source.last_error is not None
    locator.port = int(port)  # the new pod serves
    assert source.scrape() is not None
    assert source.url == f"http://{host}:{port}/metrics"
    assert source.last_error is None
    assert len(pods.calls) == 2  # the failed scrape made it look again
    assert hits


def test_a_source_with_no_exporter_found_says_so(caplog: pytest.LogCaptureFixture) -> None:
    source = dcgm.DcgmSource(locator=dcgm_discovery.Locator(Pods(), "gpu-node-1"))
    with caplog.at_level(logging.WARNING):
        assert not source.apply([], lambda *_: None, 0.0)
    assert source.failures == 1
    assert source.last_error is not None and "no Running, Ready pod" in source.last_error
    assert "gpu-node-1" in caplog.text


def test_an_exporter_of_none_of_this_nodes_gpus_is_said(caplog: pytest.LogCaptureFixture) -> None:
    # E.g. --backend sim against a real exporter, or an exporter of another node: nothing folds in.
    source = dcgm.DcgmSource("http://unused.invalid/metrics")
    source.scrape = lambda: dcgm.parse_text(REAL_PAYLOAD)  # type: ignore[method-assign]
    gpus = [status.GPUStatus(index=0, uuid=simulated.gpu_uuid("n", 0))]
    with caplog.at_level(logging.WARNING):
        source.apply(gpus, lambda *_: None, 0.0)
    assert "none of this node's GPUs" in caplog.text


def test_a_payload_without_the_agents_fields_is_said(caplog: pytest.LogCaptureFixture) -> None:
    # The stock counter set has XID but not the ECC/row-remap/violation fields.
    stock = "\n".join(line for line in REAL_PAYLOAD.splitlines() if "DEV_SM_CLOCK" in line or "XID" in line)
    source = dcgm.DcgmSource("http://unused.invalid/metrics")
    source.scrape = lambda: dcgm.parse_text(stock + "\n")  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        source.apply([status.GPUStatus(index=0, uuid=UUID0)], lambda *_: None, 0.0)
    assert dcgm.DBE_VOLATILE in caplog.text and "dcgm-exporter-counters.yaml" in caplog.text


# -- the command line ---------------------------------------------------------------------------------


def test_the_cli_takes_discovery_flags() -> None:
    args = cli.parser().parse_args(
        [
            "run",
            "--dcgm-exporter",
            "auto",
            "--dcgm-exporter-namespace",
            "gpu-operator",
            "--dcgm-exporter-port",
            "9500",
        ]
    )
    assert (args.dcgm_exporter, args.dcgm_exporter_namespace, args.dcgm_exporter_port) == (
        "auto",
        "gpu-operator",
        9500,
    )
    assert args.dcgm_exporter_selector == dcgm_discovery.DEFAULT_SELECTOR


def test_sim_backend_with_a_dcgm_exporter_warns_at_start(tmp_path: Path) -> None:
    plan = tmp_path / "s.yaml"
    plan.write_text("gpus: 1\n")
    done = cli_check(
        [
            "check",
            "--backend",
            "sim",
            "--sim-scenario",
            str(plan),
            "--dcgm-exporter-url",
            "http://127.0.0.1:1/metrics",
        ]
    )
    assert "--backend sim" in done and "dcgm" in done


def cli_check(argv: list[str]) -> str:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run(
        [sys.executable, "-m", "gpuhealth_agent.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    return done.stderr


# -- the chart ---------------------------------------------------------------------------------------


def helm_template(*values: str) -> list[dict[str, Any]]:
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    assets = os.environ.get("KUBEBUILDER_ASSETS", "")
    helm = Path(assets) / "helm"
    if not assets or not helm.exists():
        pytest.skip("helm not in $KUBEBUILDER_ASSETS")
    done = subprocess.run(
        [
            str(helm),
            "template",
            "t",
            str(ROOT / "charts" / "gpu-health"),
            "--kube-version",
            "1.31.0",
            *values,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def agent_objects(objects: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    [daemonset] = [o for o in objects if o["kind"] == "DaemonSet"]
    [container] = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    [role] = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-agent")]
    return container["args"], role["rules"]


def test_by_default_only_the_gpu_operators_namespace_is_searched() -> None:
    """A tenant's pod on the node labelled app=nvidia-dcgm-exporter must not become the node's exporter."""
    parsed = cli.parser().parse_args(["run", "--dcgm-exporter", "auto"])
    assert parsed.dcgm_exporter_namespace == "gpu-operator"
    args, _ = agent_objects(helm_template("--set", "agent.dcgmExporterDiscovery.enabled=true"))
    assert cli.parser().parse_args(["run", *args]).dcgm_exporter_namespace == "gpu-operator"
    # All namespaces stays possible, said explicitly: the chart passes the empty value through.
    args, _ = agent_objects(
        helm_template(
            "--set", "agent.dcgmExporterDiscovery.enabled=true",
            "--set", "agent.dcgmExporterDiscovery.namespace=",
        )
    )  # fmt: skip
    assert cli.parser().parse_args(["run", *args]).dcgm_exporter_namespace == ""


def test_the_chart_gives_discovery_its_flags_and_list_pods_only_when_enabled() -> None:
    args, rules = agent_objects(helm_template())
    assert not any("pods" in r["resources"] for r in rules)
    assert not any(a.startswith("--dcgm-exporter") for a in args)
    args, rules = agent_objects(
        helm_template(
            "--set",
            "agent.dcgmExporterDiscovery.enabled=true",
            "--set",
            "agent.dcgmExporterDiscovery.namespace=gpu-operator",
        )
    )
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]} in rules
    parsed = cli.parser().parse_args(["run", *args])
    assert (parsed.dcgm_exporter, parsed.dcgm_exporter_namespace, parsed.dcgm_exporter_port) == (
        "auto",
        "gpu-operator",
        9400,
    )
    assert parsed.dcgm_exporter_selector == dcgm_discovery.DEFAULT_SELECTOR


def run_cli(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    done = subprocess.run(
        [sys.executable, "-m", "gpuhealth_agent.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
        env={**os.environ, **(env or {})},
    )
    return done.returncode, done.stderr


def test_a_url_and_auto_together_is_a_usage_error() -> None:
    code, err = run_cli(["check", "--dcgm-exporter-url", "http://x:9400/metrics", "--dcgm-exporter", "auto"])
    assert code == 2 and "not both" in err


def test_check_auto_without_a_cluster_cannot_read(tmp_path: Path) -> None:
    plan = tmp_path / "s.yaml"
    plan.write_text("gpus: 1\n")
    code, err = run_cli(
        ["check", "--backend", "sim", "--sim-scenario", str(plan), "--dcgm-exporter", "auto"],
        env={"KUBECONFIG": str(tmp_path / "missing"), "KUBERNETES_SERVICE_HOST": ""},
    )
    assert code == 3, err
    assert "cannot look up the dcgm-exporter" in err
