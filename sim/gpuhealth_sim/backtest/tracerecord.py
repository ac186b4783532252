"""`gpu-health-sim record`: follow a live cluster's Nodes and GPUNodes into a trace (format 6).

Two parts, kept apart. `Compactor` is pure: given each version of a Node or
GPUNode as it arrives, it returns the trace record to append, or None when
nothing the operator reads changed. A Node keeps only what the operator reads
(labels, annotations, taints, unschedulable, GPU capacity); a GPUNode keeps
only the agent's part of its status (`agent`, `summary`, `gpus`, not the
operator's verdicts), in full the first time and as a compact `patch`
(traces.status_patch) after that. `Recorder` is the I/O: two
`watches.Follower`s (list, then watch; resume from the last resourceVersion
on a cut stream; list again on 410 Gone) feed the compactor under a lock,
and every record is written and flushed at once, with the time it arrived,
until `stop()` or a bound (seconds, bytes of file) is reached. Closing the
writer ends a gzip stream properly, so an interrupted recording is a valid
trace. A deleted Node or GPUNode is recorded as its deletion (a node replaced
rather than repaired leaves the fleet and frees the budget it held); one of
the same name created later is written in full again.

The agents' DaemonSet pods (those matching the operator's
`--agent-pod-selector`, by default the chart's, in `--agent-pod-namespace`,
the operator's rule `replay.is_agent_pod`) are followed too: each pod's
node and whether it is Ready, since when (`replay.pod_readiness`, the
operator's own reading), so a replay judges a dead agent stale as soon as the
live operator did, not only once its heartbeat is three periods old. A
tenant's own DaemonSet with the agent's labels, in another namespace, is not
recorded; the header's `agentPodNamespace` tells the replay the same rule.
Without the right to list pods, record goes on without them and says so.

Each run of an active check the operator adds to a GPUNode's `status.checks[]`
is written once, as a `check` record after that GPUNode's own (the runs it
holds when the recording finds it too), so a replay, which runs no check Jobs,
is handed the same results at the same time.

gpu-health's repair Jobs (labelled `gpuhealth.io/repair-action`, any
namespace) are followed too: each one's end, once, as the operator reads it
(`decisions.repair.job_view`: succeeded or failed, and when), so a replay's own
Job of that name ends so. Without the right to list Jobs, record goes on
without them and says so.

For IsolateGPU (DRA), where the cluster serves resource.k8s.io, two more
followers: ResourceSlices (each kept as the operator reads it: driver, node,
pool and the devices' names and `uuid` attributes; deletions recorded) and
DeviceTaintRules. Of the rules, gpu-health's own (labelled with a node) are
recorded as what the recorded operator did; any rule the controller manager
acknowledged (the operator's probe rule, or its own) says the cluster acts
on rules, written as a `cluster` record. The first `cluster` record, right
after the header, says which version serves DeviceTaintRules (discovery) and
whether they are acted on, if known then (a policy's `GPUIsolation`
condition, True once its probe succeeded). A cluster without
resource.k8s.io records neither.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, cast

import urllib3
from kubernetes import client

from gpuhealth_api import keys, resources, timestamps, vocabulary
from gpuhealth_operator import replay
from gpuhealth_operator.decisions import check_runs, device_taints, repair, times
from gpuhealth_operator.shared import settings
from gpuhealth_sim import watches
from gpuhealth_sim.backtest import traces
from gpuhealth_sim.backtest.defaults import DEFAULT_AGENT_POD_NAMESPACE

AGENT_STATUS_FIELDS: Final = ("agent", "summary", "gpus", "nics")
"""The agent's part of a GPUNode status; the rest (health, issues, conditions...) is the operator's."""
CHECKS_FIELD: Final = check_runs.STATUS_FIELD
"""GPUNode `status.checks[]`, the active checks' runs the operator wrote: each new one a `check` record."""


def node_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Node the operator reads, in the trace's `node` record shape."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    capacity = (obj.get("status") or {}).get("capacity") or {}
    view: dict[str, Any] = {
        "metadata": {
            "name": metadata.get("name"),
            "labels": dict(metadata.get("labels") or {}),
            "annotations": dict(metadata.get("annotations") or {}),
        },
        "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": list(spec.get("taints") or [])},
        "status": {"capacity": {keys.GPU_RESOURCE: capacity[keys.GPU_RESOURCE]}}
        if keys.GPU_RESOURCE in capacity
        else {"capacity": {}},
    }
    return view


def agent_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's part of a GPUNode's status (empty before the agent's first report)."""
    status = obj.get("status") or {}
    return {key: status[key] for key in AGENT_STATUS_FIELDS if key in status}


SLICE_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
"""resource.k8s.io versions to follow ResourceSlices in, preferred first (the operator's order)."""
ISOLATION_CONDITION: Final = vocabulary.PolicyConditionType.GPU_ISOLATION.value


def slice_view(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parts of a ResourceSlice the operator reads (devices with a `uuid`); None if it has none."""
    spec = obj.get("spec") or {}
    devices = []
    for device in spec.get("devices") or []:
        uuid = ((device or {}).get("attributes") or {}).get("uuid")
        if isinstance(device.get("name"), str) and isinstance(uuid, Mapping):
            devices.append({"name": device["name"], "attributes": {"uuid": dict(uuid)}})
    if not devices:
        return None
    return {
        "metadata": {"name": (obj.get("metadata") or {}).get("name")},
        "spec": {
            "driver": spec.get("driver"),
            "nodeName": spec.get("nodeName"),
            "pool": {"name": (spec.get("pool") or {}).get("name")},
            "devices": devices,
        },
    }


def rule_view(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """A DeviceTaintRule of gpu-health's for one GPU (name, labels, spec); None for any other rule."""
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if keys.NODE_LABEL not in labels or keys.POLICY_LABEL not in labels:
        return None
    kept: dict[str, Any] = {"name": metadata.get("name"), "labels": dict(labels)}
    if metadata.get("ownerReferences"):
        kept["ownerReferences"] = metadata["ownerReferences"]  # its Node's: the garbage collector's reading
    return {"metadata": kept, "spec": obj.get("spec") or {}}


def trace_header(start: float, generator: Mapping[str, Any], agent_pod_namespace: str) -> dict[str, Any]:
    """A recording's header: when, by what, and where its agents ran (the replay judges pods by it)."""
    return {"start": start, "generator": dict(generator), "agentPodNamespace": agent_pod_namespace}


def agent_pod_view(
    obj: Mapping[str, Any], namespace: str = DEFAULT_AGENT_POD_NAMESPACE
) -> tuple[str, dict[str, Any]] | None:
    """("namespace/name", its `agentpod` record's fields) of an agent pod; None before it is scheduled
    (the operator reads nothing of it then), or for a pod that is not the agent whatever its labels:
    outside the agent's namespace or controlled by no DaemonSet (`replay.is_agent_pod`)."""
    if not replay.is_agent_pod(obj, namespace):
        return None
    seen = replay.pod_readiness(obj)
    if seen is None:
        return None
    node, name, ready, since = seen
    return name, {"node": node, "ready": ready, "since": times.render(since) if since else None}


class Compactor:
    """Turns object versions into trace records; None for a version that changed nothing recorded."""

    def __init__(self, start: float, agent_pod_namespace: str = DEFAULT_AGENT_POD_NAMESPACE) -> None:
        self.start = start
        self.agent_pod_namespace = agent_pod_namespace
        self._nodes: dict[str, dict[str, Any]] = {}
        self._gpunodes: dict[str, dict[str, Any]] = {}
        self._runs: dict[str, list[dict[str, Any]]] = {}
        """Each GPUNode's `status.checks[]` as last recorded (a run is written once, when it appears)."""
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._rules: dict[str, Any] = {"version": None, "actedOn": None}
        self._last_t = 0.0

    def _t(self, at: float) -> float:
        # Two followers hand over concurrently: keep the records in time order.
        self._last_t = max(self._last_t, round(at - self.start, 3))
        return self._last_t

    def node(self, obj: Mapping[str, Any], at: float) -> dict[str, Any] | None:
        view = node_view(obj)
        name = view["metadata"]["name"]
        if not name or self._nodes.get(name) == view:
            return None
        self._nodes[name] = view
        return {"kind": "node", "t": self._t(at), "object": view}

    def gpunode(self, obj: Mapping[str, Any], at: float) -> dict[str, Any] | None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return None
        status = agent_status(obj)
        before = self._gpunodes.get(name)
        if before == status:
            return None
        self._gpunodes[name] = status
        if before is not None:
            patch = traces.status_patch(before, status)
            # A merge patch cannot set a value to null (null removes): then the whole status.
            if traces.apply_status_patch(before, patch) == status:
                return {"kind": "gpunode", "t": self._t(at), "name": name, "patch": patch}
        record = {"kind": "gpunode", "t": self._t(at), "name": name, "status": status}
        written = obj.get("status") or {}
        resumed = {key: written[key] for key in traces.RESUMED_STATUS_FIELDS if written.get(key)}
        if before is None and resumed:
            record["operator"] = resumed  # where the replay goes on from, as a restarted operator
        return record

    def gpunode_records(self, obj: Mapping[str, Any], at: float) -> list[dict[str, Any]]:
        """A GPUNode version's records: its agent status (`gpunode`), then each active check's run
        (`check`) its `status.checks[]` holds that the last version did not (all of them the first
        time: the runs before the recording began, for the condition they hold)."""
        found = self.gpunode(obj, at)
        listed = [found] if found is not None else []
        name = (obj.get("metadata") or {}).get("name")
        entries = (obj.get("status") or {}).get(CHECKS_FIELD)
        if not name or not isinstance(entries, list):
            return listed
        runs = [dict(e) for e in entries if isinstance(e, Mapping)]
        before = self._runs.get(name, [])
        self._runs[name] = runs
        for run in runs:
            if run not in before:
                listed.append({"kind": "check", "t": self._t(at), "node": name, "run": run})
        return listed

    def job(self, obj: Mapping[str, Any], at: float) -> dict[str, Any] | None:
        """A repair Job's `job` record the first time a version shows it ended; None before and after."""
        meta = obj.get("metadata") or {}
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        view = repair.job_view(obj)
        if view.phase not in (repair.JobPhase.SUCCEEDED, repair.JobPhase.FAILED):
            return None
        key = ("job", str(meta.get("uid") or name))
        if key in self._objects:
            return None
        labels = meta.get("labels") or {}
        ended = "Succeeded" if view.phase is repair.JobPhase.SUCCEEDED else "Failed"
        self._objects[key] = {}
        return {
            "kind": "job",
            "t": self._t(at),
            "name": name,
            "node": str(labels.get(keys.NODE_LABEL) or ""),
            "action": str(labels.get(keys.REPAIR_ACTION_LABEL) or ""),
            "ended": ended,
            "at": times.render(view.finished_at) if view.finished_at else timestamps.rfc3339(at),
        }

    def agent_pod(self, obj: Mapping[str, Any], at: float) -> dict[str, Any] | None:
        """An agent pod's record when its node or readiness changed (not its other status)."""
        seen = agent_pod_view(obj, self.agent_pod_namespace)
        if seen is None:
            return None
        name, view = seen
        if self._objects.get(("agentpod", name)) == view:
            return None
        self._objects[("agentpod", name)] = view
        return {"kind": "agentpod", "t": self._t(at), "name": name, **view}

    def cluster(self, version: str | None, acted_on: bool | None, at: float) -> dict[str, Any]:
        """The `cluster` record: which version serves DeviceTaintRules, and whether they are acted on."""
        self._rules = {"version": version, "actedOn": acted_on if version is not None else None}
        return {"kind": "cluster", "t": self._t(at), "deviceTaintRules": dict(self._rules)}

    def resource(
        self, kind: str, obj: Mapping[str, Any], at: float, *, existing: bool = False
    ) -> list[dict[str, Any]]:
        """Records for a ResourceSlice or DeviceTaintRule version (kind: resourceslice | devicetaintrule);
        `existing`: a rule in place when the recording began (the first list), marked so: the replay
        starts with it, where a rule created later is the recorded operator's decision, not the replay's."""
        found: list[dict[str, Any]] = []
        if (
            kind == "devicetaintrule"
            and self._rules["actedOn"] is not True
            and device_taints.acknowledged(obj)
        ):
            found.append(
                self.cluster(self._rules["version"], True, at)
            )  # the controller manager acts on rules
        view = slice_view(obj) if kind == "resourceslice" else rule_view(obj)
        name = str((obj.get("metadata") or {}).get("name") or "")
        if view is None:
            return found + self.deleted(kind, name, at)  # no longer one the operator reads
        if self._objects.get((kind, name)) != view:
            self._objects[(kind, name)] = view
            record = {"kind": kind, "t": self._t(at), "object": view}
            if existing and kind == "devicetaintrule":
                record["existing"] = True
            found.append(record)
        return found

    def deleted(self, kind: str, name: str, at: float) -> list[dict[str, Any]]:
        """An object's deletion (any record kind with an object); none for one never recorded."""
        if kind == "node":
            kept = self._nodes.pop(name, None)
        elif kind == "gpunode":
            kept = self._gpunodes.pop(name, None)
            self._runs.pop(name, None)
        else:
            kept = self._objects.pop((kind, name), None)
        if kept is None:
            return []
        return [{"kind": kind, "t": self._t(at), "name": name, "deleted": True}]


class RecordError(Exception):
    """The cluster cannot be recorded (unreachable, without gpu-health's CRDs, not allowed), and why."""


HINTS: Final = {
    401: "the kubeconfig's credentials were refused",
    403: "the kubeconfig's user may not list them (record needs list and watch)",
    404: "is gpu-health installed? its CRDs serve GPUNodes (helm install, or kubectl apply -f crds/)",
}


def preflight(listers: Mapping[str, Callable[..., Any]]) -> None:
    """List one of each kind to follow, so a cluster that cannot be recorded says why at once (a
    follower would retry for ever, and the trace would hold its header alone)."""
    for what, lister in listers.items():
        try:
            lister(limit=1)
        except client.ApiException as error:
            hint = HINTS.get(error.status)
            said = f"cannot list {what}: {error.status} {error.reason}"
            raise RecordError(f"{said} ({hint})" if hint else said) from error
        except urllib3.exceptions.HTTPError as error:
            raise RecordError(f"cannot reach the cluster to list {what}: {error}") from error


class Recorder:
    """Follows a cluster's Nodes and GPUNodes into a trace file until stopped or a bound is reached."""

    def __init__(
        self,
        api: client.ApiClient,
        out: Path,
        *,
        max_seconds: float | None = None,
        max_bytes: int | None = None,
        generator: Mapping[str, Any] | None = None,
        agent_pod_selector: str = settings.DEFAULT_AGENT_POD_SELECTOR,
        agent_pod_namespace: str = DEFAULT_AGENT_POD_NAMESPACE,
    ) -> None:
        self.out = out
        self.started_at = time.time()
        self.max_seconds = max_seconds
        self.max_bytes = max_bytes
        self.records = 0
        self.reason = ""
        """Why the recording ended: stopped, max-seconds or max-bytes."""
        self.warnings: list[str] = []
        """What the recording leaves out, and why (for the command to print)."""
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._compactor = Compactor(self.started_at, agent_pod_namespace)
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)

        def gpunodes(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(
                resources.GROUP, resources.VERSION, resources.GPUNODE_PLURAL, **kwargs
            )

        preflight({"Nodes": core.list_node, "GPUNodes": gpunodes})  # before the file: no empty trace
        self._followers = [
            watches.Follower("record-nodes", core.list_node, self._on_node),
            watches.Follower("record-gpunodes", gpunodes, self._on_gpunode),
        ]
        self._follow_agent_pods(core, agent_pod_selector)
        self._follow_repair_jobs(client.BatchV1Api(api))
        tool = {"tool": "gpu-health-sim record", **(generator or {})}
        header = trace_header(self.started_at, tool, agent_pod_namespace)
        self._writer: traces.Writer | None = traces.Writer(out, header)
        self._writer.flush()
        self._follow_dra(custom)

    def _follow_agent_pods(self, core: client.CoreV1Api, selector: str) -> None:
        """The agents' pods (module docstring); none with an empty selector or without the right to list."""
        if not selector:
            return
        try:
            preflight(
                {"agent pods": functools.partial(core.list_pod_for_all_namespaces, label_selector=selector)}
            )
        except RecordError as error:
            if not isinstance(error.__cause__, client.ApiException) or error.__cause__.status != 403:
                raise
            self.warnings.append(
                f"agent pods ({selector}) are not recorded: listing pods is forbidden; a replay judges "
                "agents by their heartbeat alone"
            )
            return
        self._followers.append(
            watches.Follower(
                "record-agent-pods",
                core.list_pod_for_all_namespaces,
                self._on_agent_pod,
                label_selector=selector,
            )
        )

    def _follow_repair_jobs(self, batch: client.BatchV1Api) -> None:
        """gpu-health's repair Jobs, any namespace (module docstring); none without the right to list."""
        lister = functools.partial(batch.list_job_for_all_namespaces, label_selector=keys.REPAIR_ACTION_LABEL)
        try:
            preflight({"repair Jobs": lister})
        except RecordError as error:
            if not isinstance(error.__cause__, client.ApiException) or error.__cause__.status != 403:
                raise
            self.warnings.append(
                "repair Jobs are not recorded: listing Jobs is forbidden; a replay's repair Jobs never end"
            )
            return
        self._followers.append(
            watches.Follower(
                "record-repair-jobs",
                batch.list_job_for_all_namespaces,
                self._on_job,
                label_selector=keys.REPAIR_ACTION_LABEL,
            )
        )

    def _on_job(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if kind != "DELETED":
            self._append(lambda: self._compactor.job(obj, at))

    def _follow_dra(self, custom: client.CustomObjectsApi) -> None:
        """ResourceSlices and DeviceTaintRules, where resource.k8s.io serves them (module docstring)."""
        served: dict[str, set[str]] = {}
        for version in dict.fromkeys(SLICE_VERSIONS + device_taints.KNOWN_VERSIONS):
            try:
                found = custom.get_api_resources(device_taints.GROUP, version)
            except client.ApiException as error:
                if error.status in (403, 404):
                    continue
                raise
            served[version] = {r.name for r in found.resources or []}
        slices = next((v for v in SLICE_VERSIONS if "resourceslices" in served.get(v, ())), None)
        rules = device_taints.served_version(
            v for v, names in served.items() if device_taints.PLURAL in names
        )
        if slices is None and rules is None:
            return
        acted_on = self._isolating(custom) if rules is not None else None
        self._append_all(lambda: [self._compactor.cluster(rules, acted_on, time.time())])
        for wanted, plural, kind in (
            (slices, "resourceslices", "resourceslice"),
            (rules, device_taints.PLURAL, "devicetaintrule"),
        ):
            if wanted is not None:
                self._followers.append(_resource_follower(self, kind, _lister(custom, wanted, plural)))

    @staticmethod
    def _isolating(custom: client.CustomObjectsApi) -> bool | None:
        """True if a policy's GPUIsolation condition says its probe found DeviceTaintRules acted on."""
        try:
            listed = cast(
                dict[str, Any],
                custom.list_cluster_custom_object(
                    resources.GROUP, resources.VERSION, resources.POLICY_PLURAL
                ),
            )
        except client.ApiException:
            return None
        for policy in listed.get("items") or []:
            for condition in (policy.get("status") or {}).get("conditions") or []:
                if condition.get("type") == ISOLATION_CONDITION and condition.get("status") == "True":
                    return True
        return None

    def on_resource(
        self, kind: str, event: str, obj: dict[str, Any], at: float, *, existing: bool = False
    ) -> None:
        if event == "DELETED":
            self._append_all(lambda: self._compactor.deleted(kind, _name(obj), at))
        else:
            self._append_all(lambda: self._compactor.resource(kind, obj, at, existing=existing))

    def start(self, sync_timeout_seconds: float = 30) -> Recorder:
        """Start following; returns once both first lists are written (or the timeout passed)."""
        for follower in self._followers:
            follower.start()
        for follower in self._followers:
            follower.wait_synced(sync_timeout_seconds)
        return self

    def _on_node(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if kind == "DELETED":
            self._append_all(lambda: self._compactor.deleted("node", _name(obj), at))
        else:
            self._append(lambda: self._compactor.node(obj, at))

    def _on_gpunode(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if kind == "DELETED":
            self._append_all(lambda: self._compactor.deleted("gpunode", _name(obj), at))
        else:
            self._append_all(lambda: self._compactor.gpunode_records(obj, at))

    def _on_agent_pod(self, kind: str, obj: dict[str, Any], at: float) -> None:
        if kind == "DELETED":
            self._append_all(lambda: self._compactor.deleted("agentpod", _pod_name(obj), at))
        else:
            self._append(lambda: self._compactor.agent_pod(obj, at))

    def write(self, record: dict[str, Any]) -> None:
        """Append a record of the caller's (the demo's `truth`), in turn with the recorded ones."""
        self._append(lambda: record)

    def _append_all(self, make: Callable[[], list[dict[str, Any]]]) -> None:
        """Append the records `make` returns, in one turn (their times were taken in order)."""
        with self._lock:
            for record in make() if self._writer is not None else []:
                self._write(record)

    def _append(self, make: Callable[[], dict[str, Any] | None]) -> None:
        with self._lock:
            if self._writer is None:
                return
            record = make()
            if record is None:
                return
            self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        """Write one record (under the lock), and end at the size bound."""
        if self._writer is not None:
            self._writer.write(record)
            self._writer.flush()
            self.records += 1
            if self.max_bytes is not None and self.out.stat().st_size >= self.max_bytes:
                self._end("max-bytes")

    def _end(self, reason: str) -> None:
        """Close the file (under the lock): later versions are dropped."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self.reason = reason
            self.done.set()

    def wait(self, stop: threading.Event) -> None:
        """Block until `stop` is set or a bound is reached, then stop."""
        while not self.done.is_set() and not stop.is_set():
            if self.max_seconds is not None and time.time() - self.started_at >= self.max_seconds:
                with self._lock:
                    self._end("max-seconds")
                break
            stop.wait(0.2)
        self.stop()

    def stop(self) -> None:
        """Stop following and close the trace (a complete file, gzip stream ended)."""
        for follower in self._followers:
            follower.request_stop()
        for follower in self._followers:
            follower.stop()
        with self._lock:
            self._end(self.reason or "stopped")


def _lister(custom: client.CustomObjectsApi, version: str, plural: str) -> Callable[..., Any]:
    def lister(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(device_taints.GROUP, version, plural, **kwargs)

    return lister


def _resource_follower(recorder: Recorder, kind: str, lister: Callable[..., Any]) -> watches.Follower:
    """A follower of ResourceSlices or DeviceTaintRules (`kind`) handing them to `recorder`."""

    def handler(event: str, obj: dict[str, Any], at: float) -> None:
        # Before the first list is handed over, an object was there when the recording began.
        recorder.on_resource(kind, event, obj, at, existing=not follower.synced)

    follower = watches.Follower(f"record-{kind}s", lister, handler)
    return follower


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _pod_name(obj: Mapping[str, Any]) -> str:
    """ "namespace/name", as `replay.pod_readiness` names a pod."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
