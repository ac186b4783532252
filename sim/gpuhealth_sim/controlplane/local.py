"""A real Kubernetes control plane on loopback ports, for tests, development and the demo.

etcd, kube-apiserver (RBAC, service-account token signing), kube-controller-
manager, kube-scheduler and kwok run as child processes of the caller. kwok
stands in for kubelets: Nodes annotated `kwok.x-k8s.io/node: fake` are kept
Ready, their Pods run and their deletions complete, so drains and evictions
behave as on a real cluster without containers.

How each component is configured, and where it deliberately differs from a
production cluster, is in `components`; docs/local-control-plane.md has the
user's view.

Everything runs as children of the caller; `stop()` (also run by the context
manager and at interpreter exit) tears it all down, and the children die with
the thread that started them if it dies first (see `processes`), so call
start() and start_apiserver() from the main thread or one as long-lived.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from kubernetes import client as kube_client

from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import binaries, components, kubeconfigs, pki, ports, probes, processes

KWOK_NODE_ANNOTATION: Final = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE: Final = "fake"
KWOK_STATUS_ANNOTATION: Final = "kwok.x-k8s.io/status"
"""Nodes and Pods with this annotation (any value) keep the status their creator writes (kwok-stages.yaml)."""
ADMIN_USER: Final = "gpu-health-admin"
# kube-apiserver 1.36 stops listening at once on SIGTERM but then often waits on in-flight
# requests for far longer; its state is in etcd, so a short grace then SIGKILL loses nothing.
STOP_GRACE_SECONDS: Final = 2.0
PORT_ATTEMPTS: Final = 3

ETCD: Final = "etcd"
APISERVER: Final = "kube-apiserver"
CONTROLLER_MANAGER: Final = "kube-controller-manager"
SCHEDULER: Final = "kube-scheduler"
KWOK: Final = "kwok"


class ControlPlaneError(RuntimeError):
    """The control plane could not start or is not running; the message says why."""


class CommandError(subprocess.CalledProcessError):
    """A kubectl or helm command failed; unlike its base class, str() includes stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr:\n{self.stderr}\nstdout:\n{self.stdout}"


@dataclasses.dataclass
class _Running:
    """What exists while the control plane is up."""

    workdir: Path
    owns_workdir: bool
    ports: components.Ports
    keys: pki.Pki
    admin: pki.CertKey
    kubeconfig: Path
    processes: dict[str, processes.ManagedProcess]

    @property
    def server(self) -> str:
        return f"https://{ports.LOOPBACK}:{self.ports.apiserver}"


class ControlPlane:
    """etcd + kube-apiserver (+ controller manager, scheduler, kwok) on free loopback ports.

    Use as a context manager, or call start() and stop(). `workdir` receives
    the logs, certificates, kubeconfigs and etcd data; when not given a
    temporary directory is used and removed by stop(), otherwise stop() keeps
    it but for etcd's data.
    """

    def __init__(
        self,
        binaries_dir: Path,
        workdir: Path | None = None,
        *,
        with_kwok: bool = True,
        with_scheduler: bool = True,
        with_controller_manager: bool = True,
        device_taint_rules: bool = True,
        kwok_lease_seconds: int = components.KWOK_NODE_LEASE_SECONDS,
    ) -> None:
        """`device_taint_rules=False`: a cluster without the DeviceTaintRule API (no gate, v1beta2 off).

        `kwok_lease_seconds`: the Nodes' Lease duration (renewed every quarter of it; 0: no Leases,
        for benchmarks of thousands of Nodes, where nothing here reads them: the node-lifecycle
        controller is off)."""
        self.binaries = Path(binaries_dir)
        self._kwok_lease_seconds = kwok_lease_seconds
        self._workdir = workdir
        self._device_taint_rules = device_taint_rules
        self._with = {CONTROLLER_MANAGER: with_controller_manager, SCHEDULER: with_scheduler, KWOK: with_kwok}
        self._running: _Running | None = None
        self.startup_seconds: float | None = None
        """How long the last start() took, for reports."""

    # -- lifecycle -------------------------------------------------------------------------------

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

    def start(self, timeout_seconds: float = 120) -> None:
        """Start every component and wait until the cluster is usable (default service account exists)."""
        if self._running is not None:
            raise ControlPlaneError("the control plane is already running")
        needed = [ETCD, APISERVER, "kubectl", *(name for name, on in self._with.items() if on)]
        absent = binaries.missing(self.binaries, needed)
        if absent:
            raise ControlPlaneError(
                f"{self.binaries} lacks {', '.join(absent)}; run 'make testbin' "
                f"or point ${binaries.ASSETS_ENV} at a directory that has them"
            )
        began = time.monotonic()
        deadline = began + timeout_seconds
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_once(deadline)
                break
            except processes.ProcessError as error:
                # Free ports are picked before the components bind them; if someone else
                # took one meanwhile, start over on fresh ports.
                if attempt == PORT_ATTEMPTS or "address already in use" not in str(error):
                    raise
        self.startup_seconds = time.monotonic() - began

    def _start_once(self, deadline: float) -> None:
        if self._workdir is None:
            workdir, owned = Path(tempfile.mkdtemp(prefix="gpuhealth-cp-")), True
        else:
            workdir, owned = self._workdir.resolve(), False
            workdir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            self._running = self._prepare(workdir, owned)
            self._boot(self._running, deadline)
        except BaseException:
            self.stop()
            if owned:
                shutil.rmtree(workdir, ignore_errors=True)
            raise

    def stop(self) -> None:
        """Stop every component (SIGTERM, then SIGKILL after a grace period); idempotent."""
        running, self._running = self._running, None
        atexit.unregister(self.stop)
        if running is None:
            return
        # Dependents first so they do not log a storm of connection errors, but signal all
        # at once and share one grace period: a test cluster has no state worth a slow exit.
        children = list(reversed(running.processes.values()))
        for child in children:
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in children:
            child.wait_stopped(grace_seconds=max(0.1, deadline - time.monotonic()))
        if running.owns_workdir:
            shutil.rmtree(running.workdir, ignore_errors=True)
        else:
            # Keep the logs for whoever asked for this workdir, not etcd's preallocated files.
            shutil.rmtree(running.workdir / "etcd", ignore_errors=True)

    def stop_apiserver(self) -> None:
        """Stop only kube-apiserver (an outage); etcd and the other components keep running."""
        self._process(APISERVER).stop(grace_seconds=STOP_GRACE_SECONDS)

    def kill_apiserver(self) -> None:
        """SIGKILL only kube-apiserver (a crash: its watches end without a goodbye); see `start_apiserver`."""
        apiserver = self._process(APISERVER)
        apiserver.signal(signal.SIGKILL)
        apiserver.wait_stopped(grace_seconds=STOP_GRACE_SECONDS)

    def start_apiserver(self, timeout_seconds: float = 60, *, restart_dependents: bool = True) -> None:
        """Start kube-apiserver again on the same port with the same keys, and wait until it is ready.

        Unless `restart_dependents` is false, the controller manager, scheduler and kwok
        are then restarted too: after an outage their client-go watches retry with an
        exponential backoff of up to about 30 s, which would leave the shared cluster
        half-working (pods not scheduled, run or removed; PDBs stale) long after the
        API server is back. The old kwok's node Leases are deleted first, or the new
        kwok (another holder) would wait for them to expire before running pods.
        """
        running = self._require()
        deadline = time.monotonic() + timeout_seconds
        apiserver = self._process(APISERVER)
        apiserver.start()
        self._wait(
            "kube-apiserver /readyz after restart",
            lambda: probes.get_ok(f"{running.server}/readyz", self._admin_tls()),
            deadline,
            [running.processes[ETCD], apiserver],
        )
        if restart_dependents:
            dependents = [p for name, p in running.processes.items() if name not in (ETCD, APISERVER)]
            for child in dependents:
                child.stop(grace_seconds=STOP_GRACE_SECONDS)
            if KWOK in running.processes:
                self.kubectl("delete", "leases", "--namespace=kube-node-lease", "--all", "--wait=false")
            for child in dependents:
                child.start()
            self._wait_dependents_healthy(running, deadline)

    # -- access ----------------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """Logs (`<component>.log`), certificates (`pki/`), kubeconfigs and etcd data."""
        return self._require().workdir

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig for an administrator (group system:masters) that verifies the server's TLS."""
        return self._require().kubeconfig

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON object per line for every write (components.AUDIT_POLICY)."""
        return self._require().workdir / components.AUDIT_LOG

    @property
    def server(self) -> str:
        """The API server's URL, https://127.0.0.1:<port>."""
        return self._require().server

    @property
    def ca_cert(self) -> Path:
        """The CA that signed the API server's certificate (for kubeconfigs of other identities)."""
        return self._require().keys.ca.cert

    def log_path(self, component: str) -> Path:
        """The log file of `component` (e.g. "kube-apiserver", "kwok")."""
        return self._process(component).log_path

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG, the binaries first on PATH, and helm state kept in the workdir."""
        running = self._require()
        env = dict(os.environ)
        env["KUBECONFIG"] = str(running.kubeconfig)
        env["PATH"] = f"{self.binaries}{os.pathsep}{env.get('PATH', '')}"
        for kind in ("CACHE", "CONFIG", "DATA"):
            env[f"HELM_{kind}_HOME"] = str(running.workdir / "helm" / kind.lower())
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the testbin kubectl as the administrator; raises CommandError (with stderr) if `check`."""
        return self._run(
            [str(self.binaries / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            check=check,
            timeout=timeout,
        )

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the testbin helm on this cluster (KUBECONFIG from env()); raises CommandError if `check`."""
        return self._run([str(self.binaries / "helm"), *args], input=input, check=check, timeout=timeout)

    def api_client(self) -> kube_client.ApiClient:
        """A new Kubernetes Python client authenticated as the administrator; close it when done."""
        running = self._require()
        configuration = kube_client.Configuration(host=running.server)
        configuration.ssl_ca_cert = str(running.keys.ca.cert)
        configuration.cert_file = str(running.admin.cert)
        configuration.key_file = str(running.admin.key)
        return kube_client.ApiClient(configuration)

    # -- internals -------------------------------------------------------------------------------

    def _prepare(self, workdir: Path, owned: bool) -> _Running:
        free = components.Ports(*ports.free_ports(6))
        keys = pki.create(workdir / "pki", service_ip=components.SERVICE_IP)
        admin = pki.client_cert(keys, "admin", user=ADMIN_USER, groups=("system:masters",))
        server = f"https://{ports.LOOPBACK}:{free.apiserver}"
        kubeconfig = kubeconfigs.write(
            workdir / "kubeconfig", server=server, ca_cert=keys.ca.cert, user=ADMIN_USER, client=admin
        )
        children = {
            ETCD: self._child(ETCD, workdir, components.etcd_args(workdir, free)),
            APISERVER: self._child(
                APISERVER,
                workdir,
                components.apiserver_args(workdir, free, keys, device_taint_rules=self._device_taint_rules),
            ),
        }
        if self._with[CONTROLLER_MANAGER]:
            identity = pki.client_cert(keys, CONTROLLER_MANAGER, user="system:kube-controller-manager")
            config = kubeconfigs.write(
                workdir / f"{CONTROLLER_MANAGER}.kubeconfig",
                server=server,
                ca_cert=keys.ca.cert,
                user="system:kube-controller-manager",
                client=identity,
            )
            args = components.controller_manager_args(
                config, free, keys, device_taint_rules=self._device_taint_rules
            )
            children[CONTROLLER_MANAGER] = self._child(CONTROLLER_MANAGER, workdir, args)
        if self._with[SCHEDULER]:
            identity = pki.client_cert(keys, SCHEDULER, user="system:kube-scheduler")
            config = kubeconfigs.write(
                workdir / f"{SCHEDULER}.kubeconfig",
                server=server,
                ca_cert=keys.ca.cert,
                user="system:kube-scheduler",
                client=identity,
            )
            children[SCHEDULER] = self._child(
                SCHEDULER,
                workdir,
                components.scheduler_args(config, free, device_taint_rules=self._device_taint_rules),
            )
        if self._with[KWOK]:
            selector = f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}"
            args = components.kwok_args(
                workdir, kubeconfig, free, node_selector=selector, lease_seconds=self._kwok_lease_seconds
            )
            children[KWOK] = self._child(KWOK, workdir, args)
        return _Running(
            workdir=workdir,
            owns_workdir=owned,
            ports=free,
            keys=keys,
            admin=admin,
            kubeconfig=kubeconfig,
            processes=children,
        )

    def _child(self, name: str, workdir: Path, args: list[str]) -> processes.ManagedProcess:
        return processes.ManagedProcess(name, [str(self.binaries / name), *args], workdir / f"{name}.log")

    def _boot(self, running: _Running, deadline: float) -> None:
        etcd, apiserver = running.processes[ETCD], running.processes[APISERVER]
        # The API server retries etcd until it answers, so both start together.
        etcd.start()
        apiserver.start()
        tls = self._admin_tls()
        self._wait(
            "kube-apiserver /readyz",
            lambda: probes.get_ok(f"{running.server}/readyz", tls),
            deadline,
            [etcd, apiserver],
        )
        # The others give up if the API server is not healthy soon, hence after /readyz.
        others = [p for name, p in running.processes.items() if name not in (ETCD, APISERVER)]
        for child in others:
            child.start()
        self._wait_dependents_healthy(running, deadline)
        everyone = list(running.processes.values())
        if CONTROLLER_MANAGER in running.processes:
            # The service-account controller creating this proves the controllers run.
            sa = f"{running.server}/api/v1/namespaces/default/serviceaccounts/default"
            self._wait("the default service account", lambda: probes.get_ok(sa, tls), deadline, everyone)
        namespace = f"{running.server}/api/v1/namespaces/default"
        self._wait("the default namespace", lambda: probes.get_ok(namespace, tls), deadline, everyone)

    def _wait_dependents_healthy(self, running: _Running, deadline: float) -> None:
        everyone = list(running.processes.values())
        insecure = probes.insecure_tls()
        health: dict[str, tuple[str, probes.TLS | None]] = {
            CONTROLLER_MANAGER: (
                f"https://{ports.LOOPBACK}:{running.ports.controller_manager}/healthz",
                insecure,
            ),
            SCHEDULER: (f"https://{ports.LOOPBACK}:{running.ports.scheduler}/healthz", insecure),
            KWOK: (f"http://{ports.LOOPBACK}:{running.ports.kwok}/healthz", None),
        }
        for name, (url, tls) in health.items():
            if name in running.processes:
                self._wait(f"{name} /healthz", functools.partial(probes.get_ok, url, tls), deadline, everyone)

    def _wait(
        self,
        what: str,
        check: Callable[[], bool],
        deadline: float,
        watched: Sequence[processes.ManagedProcess],
    ) -> None:
        def probe() -> bool:
            for child in watched:
                if not child.running():
                    raise child.failure(f"exited while waiting for {what}")
            return check()

        try:
            waiting.wait_until(
                probe,
                timeout_seconds=max(0.0, deadline - time.monotonic()),
                interval_seconds=0.1,
                message=f"waiting for {what}",
            )
        except TimeoutError as error:
            tails = "\n".join(
                f"--- {child.name} ({child.log_path}), last lines:\n{child.log_tail(20)}" for child in watched
            )
            raise ControlPlaneError(f"{error}\n{tails}") from error

    def _admin_tls(self) -> probes.TLS:
        running = self._require()
        return probes.client_tls(running.keys.ca.cert, running.admin)

    def _run(
        self, argv: list[str], *, input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, env=self.env(), timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise CommandError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def _require(self) -> _Running:
        if self._running is None:
            raise ControlPlaneError(
                "the control plane is not running: call start() or use it as a context manager"
            )
        return self._running

    def _process(self, name: str) -> processes.ManagedProcess:
        running = self._require()
        if name not in running.processes:
            raise ControlPlaneError(
                f"{name} is not part of this control plane (started: {', '.join(running.processes)})"
            )
        return running.processes[name]
