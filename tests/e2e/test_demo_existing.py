"""`gpu-health-sim demo --kubeconfig FILE` (`make demo KUBECONFIG=FILE`): the demo on a cluster the user
already has, and nothing of it left there afterwards, also after Ctrl-C.

The user's cluster is a second local control plane started here without kwok (a cluster has none
for fake Nodes): the demo must bring kwok itself. It holds a Node and a namespace of the user's, which
the demo must leave as they were.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from gpuhealth_api import keys, resources
from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, local

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
SIM = Path(sys.executable).parent / "gpu-health-sim"
DEMO_NODES = [f"gpu-node-{i}" for i in range(16)]
USERS_NODE = "users-node-1"
USERS_NAMESPACE = "team-a"
CRDS = [f"{resources.GPUNODE_PLURAL}.{resources.GROUP}", f"{resources.POLICY_PLURAL}.{resources.GROUP}"]


@pytest.fixture(scope="module")
def users_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.ControlPlane]:
    directory = binaries.locate(cwd=ROOT)
    with local.ControlPlane(directory, tmp_path_factory.mktemp("users-cluster"), with_kwok=False) as plane:
        api = plane.api_client()
        core = client.CoreV1Api(api)
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=USERS_NODE, labels={"team": "a"})))
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=USERS_NAMESPACE)))
        api.close()
        yield plane


@pytest.fixture
def k8s(users_cluster: local.ControlPlane) -> Iterator[client.ApiClient]:
    api = users_cluster.api_client()
    yield api
    api.close()


class Demo:
    """The demo as a user starts it: its own process, kubectl on PATH, the cluster's kubeconfig."""

    def __init__(self, plane: local.ControlPlane, tmp_path: Path, duration: float) -> None:
        self.summary = tmp_path / "summary.json"
        env = dict(os.environ)
        env["PATH"] = f"{plane.binaries}{os.pathsep}{env.get('PATH', '')}"  # the user's kubectl
        env["KWOK"] = str(plane.binaries / "kwok")
        env.pop("KUBECONFIG", None)
        command = [str(SIM), "demo", "--kubeconfig", str(plane.kubeconfig), "--plain"]
        command += ["--duration", str(duration), "--summary-json", str(self.summary)]
        command += ["--workdir", str(tmp_path / "demo")]
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float = 400) -> int:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            raise
        self._reader.join(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


def left_behind(api: client.ApiClient) -> list[str]:
    """Anything of the demo's in the user's cluster."""
    core, extensions = client.CoreV1Api(api), client.ApiextensionsV1Api(api)
    found = [
        f"Node {n.metadata.name}" for n in core.list_node().items if n.metadata.name.startswith("gpu-node-")
    ]
    found += [
        f"namespace {ns.metadata.name}"
        for ns in core.list_namespace().items
        if ns.metadata.name in ("training", "gpu-health-repair")
    ]
    found += [
        f"CRD {c.metadata.name}"
        for c in extensions.list_custom_resource_definition().items
        if c.metadata.name.endswith(".gpuhealth.io")
    ]
    found += [
        f"Lease {lease.metadata.name}"
        for lease in client.CoordinationV1Api(api).list_namespaced_lease("kube-node-lease").items
        if lease.metadata.name in DEMO_NODES
    ]
    found += [
        f"Event {e.metadata.name} about {e.involved_object.name}"
        for e in core.list_namespaced_event("default").items
        if e.involved_object.name in (*DEMO_NODES, "demo")
    ]
    objects = client.CustomObjectsApi(api)
    slices = objects.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    found += [f"ResourceSlice {s['metadata']['name']}" for s in slices]
    classes = objects.list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")["items"]
    found += [f"DeviceClass {c['metadata']['name']}" for c in classes]
    return found


def assert_users_objects_untouched(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    node = core.read_node(USERS_NODE)
    assert not node.spec.unschedulable and not node.spec.taints
    assert node.metadata.labels == {"team": "a"}
    assert not [k for k in (node.metadata.annotations or {}) if k.startswith(keys.PREFIX)]
    assert core.read_namespace(USERS_NAMESPACE).status.phase == "Active"


def gone(api: client.ApiClient) -> None:
    # The API server finishes some deletions (GC of owned objects) a moment after the demo exits.
    waiting.wait_until(
        lambda: not left_behind(api), timeout_seconds=60, interval_seconds=0.5, message="clean"
    )


def test_the_demo_runs_on_an_existing_cluster_and_leaves_nothing(
    users_cluster: local.ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    demo = Demo(users_cluster, tmp_path, duration=60)
    code = demo.wait()
    text = demo.text
    assert code == 0, text
    result = json.loads(demo.summary.read_text())["nodes"]

    def did(node: str) -> list[str]:
        return [a["what"] for a in result[node]["actions"]]

    ecc, thermal, xid, straggler, human = (f"gpu-node-{i}" for i in (3, 5, 7, 9, 11))
    assert "EccUncorrectable" in result[ecc]["detected"], text
    assert {"cordoned", "drained"} <= set(did(ecc)), text
    assert {"cordoned", "drained", "validation passed", "uncordoned"} <= set(did(xid)), text
    assert "thermal-throttled set" in did(thermal), text
    assert "straggler set" in did(straggler), text
    assert result[human]["humanCordoned"] and did(human) == [], text
    assert did("gpu-node-12") == ["GPU isolated"], text
    assert "removed what the demo created" in text, text
    assert left_behind(k8s) == [], text  # the demo waited for it all to go before it exited
    assert_users_objects_untouched(k8s)
    assert not (tmp_path / "demo" / "cluster" / "kubeconfig").exists()  # the copy of the credentials


def test_ctrl_c_mid_demo_removes_everything(
    users_cluster: local.ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    demo = Demo(users_cluster, tmp_path, duration=300)
    waiting.wait_until(
        lambda: "started the simulated fleet" in demo.text or demo.process.poll() is not None,
        timeout_seconds=180,
        interval_seconds=0.5,
        message="the demo's fleet running",
    )
    assert demo.process.poll() is None, demo.text
    nodes = client.CoreV1Api(k8s).list_node(label_selector="gpuhealth.io/demo=true").items
    assert len(nodes) == len(DEMO_NODES), demo.text
    demo.process.send_signal(signal.SIGINT)
    code = demo.wait(timeout=240)
    assert code == 130, demo.text
    assert "removed what the demo created" in demo.text, demo.text
    gone(k8s)
    assert_users_objects_untouched(k8s)


def test_the_demo_refuses_a_cluster_where_gpu_health_is_installed(
    users_cluster: local.ControlPlane, k8s: client.ApiClient, tmp_path: Path
) -> None:
    crds = sorted((ROOT / "crds").glob("*.yaml"))
    users_cluster.kubectl("apply", "--server-side", *[a for p in crds for a in ("-f", str(p))])
    try:
        demo = Demo(users_cluster, tmp_path, duration=30)
        code = demo.wait(timeout=120)
        assert code == 1, demo.text
        assert "refusing to run here: CRD gpunodes.gpuhealth.io exists" in demo.text, demo.text
        assert client.CoreV1Api(k8s).list_node(label_selector="gpuhealth.io/demo=true").items == []
        extensions = client.ApiextensionsV1Api(k8s)
        assert {c.metadata.name for c in extensions.list_custom_resource_definition().items} >= set(CRDS)
    finally:
        users_cluster.kubectl("delete", *[a for p in crds for a in ("-f", str(p))], "--wait")
