"""An in-memory cluster that answers the operator's requests: the backtest's API server.

`MemoryKube` implements `gpuhealth_operator.client.kube.Client`, the operator's
side of the API server (checked by mypy), over plain dicts, with the
semantics the operator relies on, and no more:

- Nodes: JSON merge patch (with the `metadata.resourceVersion` precondition
  answering 409 on a stale write), JSON patch (with `test`, answering 422),
  strategic merge of `status.conditions` keyed by type;
- GPUNode and GPUHealthPolicy status: server-side apply, where the fields
  the operator's field manager applied last time and leaves out now are
  removed, and the agent's fields are never touched;
- Events: created and bumped (kept for the report);
- pods: none unless a test puts some (`put_pod`; a trace holds no pods, so every drain completes at
  once), listed by `spec.nodeName`; an eviction deletes the pod at once (no PodDisruptionBudget);
- Jobs (repair steps, batch/v1): created (409 when one of the name exists, as the operator's
  adoption expects), read, listed and deleted; none runs. A Job ends when the backtest says the
  recorded one of its name ended (`end_job`, from the trace's `job` records: at that time, or at
  the Job's creation if that is later); `job_log` keeps every Job created, in order;
- DRA (resource.k8s.io): the ResourceSlices the trace recorded, listed by
  `spec.nodeName` in any version; DeviceTaintRules in the version the trace
  says the cluster serves and acts on (`serve_device_taint_rules`), created,
  read, listed by label and deleted, each acknowledged at once as the
  controller manager would; with no such version, discovery lists none, so
  the operator's probe says IsolateGPU falls back to the node ladder.

Every write bumps one cluster-wide resourceVersion, as etcd does. The
Nodes the operator wrote since the backtest last looked (`touched`) and the
Events in the order they were posted (`event_log`) and the DeviceTaintRules
created and deleted (`rule_log`) let the backtest report what was done and
when.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Unpack

from gpuhealth_api import resources
from gpuhealth_operator import replay
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import device_taints

JsonObject = dict[str, Any]

NODES = "/api/v1/nodes/"
GPUNODES = f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.GPUNODE_PLURAL}/"
POLICIES = f"/apis/{resources.GROUP}/{resources.VERSION}/{resources.POLICY_PLURAL}/"
EVENTS = "/api/v1/namespaces/default/events"
DRA = "/apis/resource.k8s.io/"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
JOBS = "/apis/batch/v1/namespaces/"
PODS = "/api/v1/namespaces/"
EVICTION = "/eviction"
OPERATOR_STATUS_FIELDS = replay.OPERATOR_STATUS_FIELDS
"""What `reconciler.desired_status` writes (tests/unit/sim/test_memcluster_fields.py derives it): kept
across an agent report, as server-side apply keeps another manager's fields."""


def _not_found(path: str) -> kube.ApiError:
    return kube.ApiError(404, "Not Found", f"{path} not found")


def merge_patch(target: JsonObject, patch: Mapping[str, Any]) -> JsonObject:
    """RFC 7386 in place. An object patched onto a key the target lacks (or holds a non-object in) is merged
    into an empty object, so its nulls remove rather than land as values (test_merge_patch.py)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            if not isinstance(target.get(key), dict):
                target[key] = {}
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json_patch(target: JsonObject, ops: list[Mapping[str, Any]]) -> JsonObject:
    """RFC 6902 (test, add, replace, remove) on a copy; 422 when a test fails or a path is missing."""
    result = copy.deepcopy(target)
    for op in ops:
        *parents, leaf = _pointer(str(op["path"]))
        holder: Any = result
        for part in parents:
            if not isinstance(holder, dict) or part not in holder:
                raise kube.ApiError(422, "Unprocessable Entity", f"path {op['path']} does not exist")
            holder = holder[part]
        if op["op"] == "test":
            if not isinstance(holder, dict) or holder.get(leaf) != op.get("value"):
                raise kube.ApiError(422, "Unprocessable Entity", f"test of {op['path']} failed")
        elif op["op"] in ("add", "replace"):
            holder[leaf] = copy.deepcopy(op.get("value"))
        elif op["op"] == "remove":
            if not isinstance(holder, dict) or leaf not in holder:
                raise kube.ApiError(422, "Unprocessable Entity", f"path {op['path']} does not exist")
            del holder[leaf]
    return result


def _rfc3339(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()


def _selector(text: str | None) -> list[tuple[str, str]]:
    """`a=b,c=d` (the equality selectors the operator sends) as pairs."""
    pairs = [part.split("=", 1) for part in (text or "").split(",") if "=" in part]
    return [(key.strip(), value.strip()) for key, value in pairs]


def _labelled(obj: JsonObject, pairs: list[tuple[str, str]]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in pairs)


class MemoryKube(kube.Verbs):
    """The operator's client, answered from dicts (module docstring); its verbs are the operator's."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock
        """Epoch seconds now (the replay's clock), for the times a Job is created and ends at."""
        self.jobs: dict[str, JsonObject] = {}
        """By "namespace/name"."""
        self.job_log: list[JsonObject] = []
        self.job_ends: dict[str, tuple[bool, float]] = {}
        """Job name → (succeeded, epoch seconds): how the recorded operator saw it end (`end_job`)."""
        self.nodes: dict[str, JsonObject] = {}
        self.gpunodes: dict[str, JsonObject] = {}
        self.policies: dict[str, JsonObject] = {}
        self.events: dict[str, JsonObject] = {}
        self.event_log: list[JsonObject] = []
        self.touched: dict[str, None] = {}
        """In the operator's write order (a set's order changes with each process's string hashing)."""
        self.issue_log: list[tuple[str, str]] = []
        """(GPUNode, its new `status.issues`) for each operator write that changed them, in write order."""
        self.requests_total = 0
        self._version = 0
        self._applied: dict[str, frozenset[str]] = {}
        """GPUNode/policy path → the status fields our manager applied last."""
        self.slices: dict[str, JsonObject] = {}
        self.rules: dict[str, JsonObject] = {}
        self.rule_version: str | None = None
        """The resource.k8s.io version serving DeviceTaintRules that are acted on; None: not served."""
        self.rule_log: list[tuple[str, JsonObject]] = []
        """("created" | "deleted", the DeviceTaintRule), in order."""
        self.pods: dict[str, JsonObject] = {}
        """By "namespace/name": what a test put (`put_pod`); evicted ones are gone."""
        self.evicted: list[str] = []
        """"namespace/name" of every pod evicted, in order."""

    def bump(self, body: JsonObject) -> JsonObject:
        self._version += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        return body

    # The cluster's side: what the trace changes.
    def put_node(self, body: JsonObject) -> JsonObject:
        self.nodes[body["metadata"]["name"]] = self.bump(body)
        return body

    def put_gpunode(self, name: str, agent_status: Mapping[str, Any]) -> JsonObject:
        """The agent wrote its status: its fields replaced, the operator's kept; a new version."""
        current = self.gpunodes.get(name)
        if current is None:
            current = {
                "apiVersion": resources.API_VERSION,
                "kind": resources.GPUNODE_KIND,
                "metadata": {"name": name, "uid": f"uid-gpunode-{name}"},
                "status": {},
            }
        ours = {k: v for k, v in current["status"].items() if k in OPERATOR_STATUS_FIELDS}
        body = {**current, "metadata": dict(current["metadata"]), "status": {**agent_status, **ours}}
        self.gpunodes[name] = self.bump(body)
        return body

    def adopt_status(self, name: str, version: str, field: str, value: object) -> None:
        """Hold `value` as the GPUNode's `status[field]` in place of an equal one: the operator's cache
        holds it so (`replay.Operator.kept_gpunode`) for the version `version`, which this cluster
        still stores. Not a write (no new version): the object is the same, but then the agent's next
        report carries the cache's own object, which it knows unchanged by identity, not by comparing
        (a GPUNode's fifteen conditions on every report, issue 52)."""
        current = self.gpunodes.get(name)
        if current is None or current["metadata"].get("resourceVersion") != version:
            return  # the cluster moved on (or the cache lags): the cache's value may not be equal
        held = current["status"]
        if field in held and held[field] is not value:
            self.gpunodes[name] = {**current, "status": {**held, field: value}}

    def put_pod(self, body: JsonObject) -> JsonObject:
        """A pod bound to a node (`spec.nodeName`), as a scheduler or a `nodeName` would put it."""
        meta = body["metadata"]
        self.pods[f"{meta['namespace']}/{meta['name']}"] = self.bump(copy.deepcopy(body))
        return body

    def put_rule(self, body: Mapping[str, Any]) -> JsonObject:
        """A DeviceTaintRule stored, acted on: the controller manager's acknowledgement, at once. Not an
        operator action by itself (the API's create logs it; a rule in place when a trace began does not)."""
        rule = copy.deepcopy(dict(body))
        rule["metadata"]["generation"] = 1
        condition = {"type": device_taints.EVICTION_CONDITION, "status": "False", "observedGeneration": 1}
        rule["status"] = {"conditions": [condition]}
        self.rules[rule["metadata"]["name"]] = self.bump(rule)
        return rule

    def delete_node(self, name: str) -> JsonObject | None:
        """The Node deleted (None: there was none); the garbage collector deletes the DeviceTaintRules
        it owns, as the cluster's does (a collected rule is no operator action: not in `rule_log`)."""
        body = self.nodes.pop(name, None)
        if body is not None:
            for rule_name, rule in list(self.rules.items()):
                owners = rule["metadata"].get("ownerReferences") or []
                if any(o.get("kind") == "Node" and o.get("name") == name for o in owners):
                    del self.rules[rule_name]
        return body

    def delete_gpunode(self, name: str) -> JsonObject | None:
        """The GPUNode deleted (None: there was none); one created later starts with no status."""
        self._applied.pop(GPUNODES + name + "/status", None)
        return self.gpunodes.pop(name, None)

    def put_slice(self, body: JsonObject) -> None:
        self.slices[body["metadata"]["name"]] = self.bump(copy.deepcopy(body))

    def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)

    def serve_device_taint_rules(self, version: str | None) -> bool:
        """DeviceTaintRules served and acted on in `version` (None: not); True if that changed."""
        changed = version != self.rule_version
        self.rule_version = version
        return changed

    def end_job(self, name: str, succeeded: bool, at: float) -> None:
        """The Job of this name (in any namespace) ends so, at `at` or at once if created later."""
        self.job_ends[name] = (succeeded, at)
        for job in self.jobs.values():
            if job["metadata"]["name"] == name:
                self._end(job)

    def _end(self, job: JsonObject) -> None:
        ending = self.job_ends.get(job["metadata"]["name"])
        if ending is None or job.get("status", {}).get("conditions"):
            return
        succeeded, at = ending
        created = job["metadata"].get("creationTimestamp")
        when = max(at, _epoch(created)) if isinstance(created, str) else at
        stamp = _rfc3339(when)
        kind = "Complete" if succeeded else "Failed"
        job["status"] = {
            "conditions": [{"type": kind, "status": "True", "lastTransitionTime": stamp}],
            **({"succeeded": 1, "completionTime": stamp} if succeeded else {"failed": 1}),
        }
        self.bump(job)

    def _jobs(self, method: str, path: str, body: object) -> JsonObject:
        """batch/v1 Jobs, as the operator's repair calls them (module docstring)."""
        namespace, _, rest = path[len(JOBS) :].partition("/")
        plural, _, name = rest.partition("/")
        if plural != "jobs":
            raise _not_found(path)
        if method == "GET" and not name:
            listed = [j for j in self.jobs.values() if j["metadata"].get("namespace") == namespace]
            return {"items": copy.deepcopy(listed), "metadata": {}}
        if method == "POST" and not name:
            assert isinstance(body, dict)
            job = copy.deepcopy(body)
            name = job["metadata"]["name"]
            if f"{namespace}/{name}" in self.jobs:
                raise kube.ApiError(409, "Conflict", f"jobs.batch {name} already exists")
            job["metadata"].update(namespace=namespace, uid=f"uid-job-{namespace}-{name}")
            if self.clock is not None:
                job["metadata"]["creationTimestamp"] = _rfc3339(self.clock())
            job["status"] = {}
            self.jobs[f"{namespace}/{name}"] = self.bump(job)
            self.job_log.append(copy.deepcopy(job))
            self._end(job)
            return copy.deepcopy(job)
        found = self.jobs.get(f"{namespace}/{name}")
        if found is None:
            raise _not_found(path)
        if method == "GET":
            return copy.deepcopy(found)
        if method == "DELETE":
            del self.jobs[f"{namespace}/{name}"]
            return copy.deepcopy(found)
        raise kube.ApiError(405, "Method Not Allowed", f"the backtest cluster does not serve {method} {path}")

    # The operator's side: kube.Client.
    async def request(self, method: str, path: str, **options: Unpack[kube.RequestOptions]) -> JsonObject:
        """One request; urgency, the fence and the answer's type do not matter in memory."""
        query, body = options.get("query"), options.get("body")
        content_type = options.get("content_type", "application/json")
        self.requests_total += 1
        if path.startswith(DRA):
            return self._dra(method, path, query, body)
        if path.startswith(JOBS):
            return self._jobs(method, path, body)
        if method == "GET":
            return self._get(path, query)
        if method == "POST" and path.startswith(PODS) and path.endswith(EVICTION):
            key = path[len(PODS) : -len(EVICTION)].replace("/pods/", "/")
            if self.pods.pop(key, None) is None:
                raise _not_found(path)
            self.evicted.append(key)
            return {}
        if method == "POST" and path == EVENTS:
            assert isinstance(body, dict)
            self.events[body["metadata"]["name"]] = copy.deepcopy(body)
            self.event_log.append(self.events[body["metadata"]["name"]])
            return body
        if method == "PATCH" and path.startswith(EVENTS + "/"):
            event = self.events.get(path.rsplit("/", 1)[1])
            if event is None:
                raise _not_found(path)
            assert isinstance(body, dict)
            return merge_patch(event, body)
        if method == "PATCH" and path.startswith(NODES):
            return self._patch_node(path[len(NODES) :], body, content_type)
        if method == "PATCH" and content_type == kube.APPLY_PATCH and path.endswith("/status"):
            return self._apply_status(path, body)
        raise kube.ApiError(405, "Method Not Allowed", f"the backtest cluster does not serve {method} {path}")

    def _get(self, path: str, query: Mapping[str, str] | None) -> JsonObject:
        if path == "/api/v1/pods":
            wanted = dict(_selector((query or {}).get("fieldSelector")))
            node = wanted.get("spec.nodeName")
            listed = [p for p in self.pods.values() if node is None or p["spec"].get("nodeName") == node]
            return {"items": copy.deepcopy(listed), "metadata": {}}
        if path.startswith(NODES) and path[len(NODES) :] in self.nodes:
            return copy.deepcopy(self.nodes[path[len(NODES) :]])
        if path.startswith(EVENTS + "/") and path.rsplit("/", 1)[1] in self.events:
            return copy.deepcopy(self.events[path.rsplit("/", 1)[1]])
        raise _not_found(path)

    def _dra(self, method: str, path: str, query: Mapping[str, str] | None, body: object) -> JsonObject:
        """resource.k8s.io as the operator's IsolateGPU calls it (module docstring)."""
        version, _, rest = path[len(DRA) :].partition("/")
        if version not in DRA_VERSIONS:
            raise _not_found(path)
        plural, _, name = rest.partition("/")
        served = version == self.rule_version
        if method == "GET" and not plural:
            listed = [{"name": "resourceslices"}] + ([{"name": "devicetaintrules"}] if served else [])
            return {"groupVersion": f"resource.k8s.io/{version}", "resources": listed}
        if method == "GET" and plural == "resourceslices" and not name:
            wanted = dict(_selector((query or {}).get("fieldSelector")))
            node = wanted.get("spec.nodeName")
            found = [s for s in self.slices.values() if node is None or s["spec"].get("nodeName") == node]
            return {"items": copy.deepcopy(found), "metadata": {}}
        if plural != "devicetaintrules" or not served:
            raise _not_found(path)
        if method == "GET" and not name:
            labels = _selector((query or {}).get("labelSelector"))
            found = [r for r in self.rules.values() if _labelled(r, labels)]
            return {"items": copy.deepcopy(found), "metadata": {}}
        if method == "GET" and name in self.rules:
            return copy.deepcopy(self.rules[name])
        if method == "POST" and not name:
            assert isinstance(body, dict)
            name = body["metadata"]["name"]
            if name in self.rules:
                raise kube.ApiError(409, "Conflict", f"devicetaintrules {name} already exists")
            rule = self.put_rule(body)
            self.rule_log.append(("created", copy.deepcopy(rule)))
            return copy.deepcopy(rule)
        if method == "PATCH" and name in self.rules:  # a JSON patch (the adoption of a deleted policy's rule)
            assert isinstance(body, list)
            self.rules[name] = self.bump(json_patch(self.rules[name], body))
            return copy.deepcopy(self.rules[name])
        if method == "DELETE" and name in self.rules:
            rule = self.rules.pop(name)
            self.rule_log.append(("deleted", rule))
            return copy.deepcopy(rule)
        raise _not_found(path)

    def _patch_node(self, name: str, body: object, content_type: str) -> JsonObject:
        status_only = name.endswith("/status")
        name = name.removesuffix("/status")
        node = self.nodes.get(name)
        if node is None:
            raise _not_found(NODES + name)
        if content_type == "application/json-patch+json":
            assert isinstance(body, list)
            updated = json_patch(node, body)
        elif status_only:
            assert isinstance(body, dict)
            updated = copy.deepcopy(node)
            conditions = {c["type"]: c for c in updated.setdefault("status", {}).get("conditions") or []}
            for condition in (body.get("status") or {}).get("conditions") or []:
                conditions[condition["type"]] = {**conditions.get(condition["type"], {}), **condition}
            updated["status"]["conditions"] = list(conditions.values())
        else:
            assert isinstance(body, dict)
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != node["metadata"].get("resourceVersion"):
                raise kube.ApiError(409, "Conflict", f"node {name} was modified")
            patch = copy.deepcopy(body)
            patch.get("metadata", {}).pop("resourceVersion", None)
            updated = merge_patch(copy.deepcopy(node), patch)
        self.nodes[name] = self.bump(updated)
        self.touched[name] = None
        return copy.deepcopy(updated)

    def _apply_status(self, path: str, body: object) -> JsonObject:
        assert isinstance(body, dict)
        status = dict(body.get("status") or {})
        name = path.removesuffix("/status").rsplit("/", 1)[1]
        store = self.gpunodes if path.startswith(GPUNODES) else self.policies
        current = store.get(name)
        if current is None:
            if store is self.gpunodes:
                raise _not_found(path)
            current = {"metadata": {"name": name}, "status": {}}
        kept = {k: v for k, v in current.get("status", {}).items() if k not in self._applied.get(path, ())}
        issues, before = status.get("issues"), current.get("status", {}).get("issues")
        if store is self.gpunodes and "issues" in status and issues != before:
            self.issue_log.append((name, str(issues or "")))  # the backtest's early-warning score reads it
        self._applied[path] = frozenset(status)
        updated = {**current, "metadata": dict(current["metadata"]), "status": {**kept, **status}}
        store[name] = self.bump(updated)
        return updated

    async def list_names(self, path: str, query: Mapping[str, str] | None = None) -> JsonObject:
        """The whole objects: a caller of a list of names reads only their names."""
        return await self.get(path, query)

    async def pages(
        self, path: str, query: Mapping[str, str] | None = None
    ) -> AsyncIterator[tuple[list[JsonObject], str]]:
        """One page: the whole collection, at the cluster's resourceVersion."""
        found = await self.get(path, query)
        yield list(found.get("items") or []), str((found.get("metadata") or {}).get("resourceVersion", ""))

    async def close(self) -> None:
        return None
