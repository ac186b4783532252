"""A cluster the user already has (kind, minikube, k3d, a dev cluster), with kwok run here against it.

The demo needs kubelets that do what kwok's do (Nodes kept Ready, Pods run, deletions finished),
and a cluster the user brings has none for fake Nodes. So kwok runs as a local process, as in the
local control plane, with the user's kubeconfig, and manages only the Nodes annotated
`kwok.x-k8s.io/node: fake` (`--manage-all-nodes=false`): it never touches the cluster's own
nodes. The rest of the demo sees the same surface as `local.ControlPlane`: `kubeconfig`, `env()`,
`kubectl()`, `api_client()`, `server`.

What the demo creates there, and its removal, is the demo's (`gpuhealth_sim.demo.borrowed`); this
module creates nothing in the cluster but kwok's Node Leases.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import yaml
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import components, local, ports, probes, processes

KWOK: Final = "kwok"
KUBECONFIG_NAME: Final = "kubeconfig"


class ExistingCluster:
    """The user's cluster, reached through one self-contained kubeconfig, with a local kwok managing
    the demo's fake Nodes. Use as a context manager; `stop()` stops kwok and removes the kubeconfig
    copy (it holds the user's credentials)."""

    def __init__(
        self,
        source_kubeconfig: Path,
        workdir: Path,
        *,
        kwok: Path,
        context: str | None = None,
        kubectl: str | None = None,
    ) -> None:
        self.source_kubeconfig = Path(source_kubeconfig)
        self.workdir = Path(workdir)
        self.context = context
        self.kwok = Path(kwok)
        found = kubectl or shutil.which("kubectl")
        if found is None:
            raise local.ControlPlaneError("kubectl is not on PATH: the demo on an existing cluster needs it")
        self.kubectl_path = Path(found)
        self.startup_seconds: float | None = None
        self._kwok: processes.ManagedProcess | None = None
        self._server = ""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / KUBECONFIG_NAME

    @property
    def server(self) -> str:
        return self._server

    def start(self, timeout_seconds: float = 60) -> None:
        began = time.monotonic()
        if not os.access(self.kwok, os.X_OK):
            raise local.ControlPlaneError(f"no kwok binary at {self.kwok} (hack/kwok.sh builds one)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        # One file with the chosen context's cluster and credentials embedded: kwok, the operator and
        # the agents all read it, and none of them takes a --context.
        context = ["--context", self.context] if self.context else []
        view = subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.source_kubeconfig), *context, "config", "view",
             "--minify", "--flatten", "--raw"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if view.returncode != 0 or not view.stdout.strip():
            raise local.ControlPlaneError(f"cannot read {self.source_kubeconfig}: {view.stderr.strip()}")
        self.kubeconfig.touch(mode=0o600)
        self.kubeconfig.write_text(view.stdout)
        self._server = yaml.safe_load(view.stdout)["clusters"][0]["cluster"]["server"]
        reach = self.kubectl("get", "--raw", "/version", check=False, timeout=30)
        if reach.returncode != 0:
            raise local.ControlPlaneError(
                f"cannot reach the cluster at {self._server}: {reach.stderr.strip()}"
            )
        (port,) = ports.free_ports(1)
        # Only the kwok port matters to kwok_args; the others name no process here.
        free = components.Ports(0, 0, 0, 0, 0, kwok=port)
        selector = f"{local.KWOK_NODE_ANNOTATION}={local.KWOK_NODE_ANNOTATION_VALUE}"
        args = components.kwok_args(self.workdir, self.kubeconfig, free, node_selector=selector)
        self._kwok = processes.ManagedProcess(
            KWOK, [str(self.kwok), *args], self.workdir / "kwok.log", env=self.env()
        )
        self._kwok.start()
        healthz = f"http://{ports.LOOPBACK}:{port}/healthz"

        def healthy() -> bool:
            if self._kwok is not None and not self._kwok.running():
                raise self._kwok.failure("kwok exited at start")
            return probes.get_ok(healthz, None)

        waiting.wait_until(
            healthy, timeout_seconds=timeout_seconds, interval_seconds=0.2, message="kwok healthy"
        )
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        if self._kwok is not None:
            self._kwok.stop(grace_seconds=5)
            self._kwok = None
        self.kubeconfig.unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def log_path(self, component: str) -> Path:
        return self.workdir / f"{component}.log"

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig), *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise local.CommandError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def api_client(self) -> kube_client.ApiClient:
        configuration = kube_client.Configuration()
        kube_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 16
        return kube_client.ApiClient(configuration)
