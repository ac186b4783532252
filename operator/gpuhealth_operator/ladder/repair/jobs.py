"""Requests for repair (`spec.repair`): the Job templates, a step's Job (fill in, create, read, delete),
and the Node's repair annotation and retire label.

A template is a Job manifest (YAML) under the key of its action (`ResetGPU`, `RebootNode`,
`Validation`) in a ConfigMap (`--repair-templates NAMESPACE/NAME`), or in the packaged
`repair-templates.yaml` (the chart ships the same defaults). `fill` makes a template the Job of one
step on one node: our labels, `nodeName` (the scheduler, and so our own cordon, is bypassed),
a toleration of every taint, the environment the commands read, no retries and the step's deadline;
and, whatever the template says, no ServiceAccount token (`STEP_SERVICE_ACCOUNT`, no automount, no
projected token) and no GPU UUID that is not of NVML's form (`gpuhealth_api.gpu_uuids`): the pod is
privileged, so a token or an agent's text in it would be the operator's rights or a shell on the host.
"""

from __future__ import annotations

import copy
import importlib.resources
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import yaml

from gpuhealth_api import gpu_uuids, keys, vocabulary
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import step_kinds

PACKAGED: Final = "repair-templates.yaml"
TEMPLATE_KEYS: Final = (*(kind.template for kind in step_kinds.KINDS.values()), vocabulary.VALIDATION_JOB)
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "gpu-health"
TTL_AFTER_FINISHED_SECONDS: Final = 3600
DEFAULT_NAMESPACE: Final = "gpu-health"
STEP_SERVICE_ACCOUNT: Final = "default"
"""The ServiceAccount of every step Job's pod, its token never mounted: a step needs no API access, and
the namespace's `default` holds no rights the chart grants (the operator's own is cluster-wide)."""


class TemplateError(ValueError):
    """The templates cannot be read or a template is not a Job manifest (the message says why)."""


class ParameterError(TemplateError):
    """A value the operator would pass to a Job (a GPU UUID the agent reported) is not of its form."""


class StaleJob(Exception):
    """A Job of the name exists but is another cycle's: it was deleted (Background); create it again
    once it is gone."""


def parse_templates(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Templates by key from a ConfigMap's `data` (YAML text per key), or a mapping of manifests.

    A ConfigMap manifest as a whole (the packaged file may be one) is read from its `data`.
    """
    if data.get("kind") == "ConfigMap":
        data = data.get("data") or {}
    templates: dict[str, dict[str, Any]] = {}
    for key in TEMPLATE_KEYS:
        raw = data.get(key)
        if raw is None:
            continue
        try:
            manifest = yaml.safe_load(raw) if isinstance(raw, str) else raw
        except yaml.YAMLError as error:
            raise TemplateError(f"template {key}: not YAML: {error}") from None
        if not isinstance(manifest, Mapping) or not isinstance(manifest.get("spec"), Mapping):
            raise TemplateError(f"template {key}: not a Job manifest (no spec)")
        templates[key] = dict(manifest)
    # Any other key may be an active check's template (spec.activeChecks[].template, the user's own):
    # kept when it is a Job manifest, else left for the check that names it to say it is missing.
    for key, raw in data.items():
        if key in templates or key in TEMPLATE_KEYS or not isinstance(key, str):
            continue
        try:
            manifest = yaml.safe_load(raw) if isinstance(raw, str) else raw
        except yaml.YAMLError:
            continue
        if isinstance(manifest, Mapping) and isinstance(manifest.get("spec"), Mapping):
            templates[key] = dict(manifest)
    return templates


def packaged_templates() -> dict[str, dict[str, Any]]:
    """The defaults packaged with the operator (the chart's ConfigMap holds the same)."""
    resource = importlib.resources.files("gpuhealth_operator").joinpath(PACKAGED)
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TemplateError(f"the packaged {PACKAGED} is missing") from None
    loaded = yaml.safe_load(text)
    if not isinstance(loaded, Mapping):
        raise TemplateError(f"the packaged {PACKAGED} is not a mapping")
    return parse_templates(loaded)


def configmap_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps/{name}"


async def read_templates(client: kube.Client, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The templates of ConfigMap NAMESPACE/NAME; TemplateError naming the refusal (404, 403)."""
    try:
        body = await client.get(configmap_path(namespace, name))
    except kube.ApiError as error:
        if 400 <= error.status < 500:
            raise TemplateError(
                f"cannot read ConfigMap {namespace}/{name} of repair templates: {error.status} {error.reason}"
            ) from None
        raise
    return parse_templates(body.get("data") or {})


def jobs_path(namespace: str, name: str | None = None) -> str:
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    return f"{path}/{name}" if name else path


def fill(
    template: Mapping[str, Any],
    *,
    name: str,
    namespace: str,
    node: str,
    node_uid: str,
    policy: str,
    cycle: int,
    action: str,
    gpus: Sequence[str],
    timeout_seconds: float,
    cycle_started: str,
    guard: bool = True,
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Job of one step (or validation) on one node from its template; `cycle_started` stamps the
    cycle it belongs to (`keys.REPAIR_CYCLE_STARTED_ANNOTATION`).

    The Job is owned by the Node `node_uid` (an ownerReference): the garbage collector deletes it with
    that Node, and a Node re-created under the name owns it not (`orphan_jobs`). `guard`: its pod also
    selects the Node's `keys.REPAIR_NODE_UID_LABEL` (`set_state` writes it before the Job), so no kubelet
    of another Node of the name admits it. `extra_env`: more variables set in every container, as ours
    (`keys.REPAIR_HOSTENGINE_ENV` of a Validation Job).

    ParameterError: a GPU UUID is not of NVML's form; TemplateError: the template names a ServiceAccount,
    or the Node's UID is unknown.
    """
    if not node_uid:
        raise TemplateError(f"the UID of Node {node} is not known: a Job must be owned by its Node")
    refused = gpu_uuids.invalid(gpus)
    if refused:
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise ParameterError(
            f"GPU UUID {refused[0]!r}{more} reported by the agent is not an NVML GPU UUID "
            f"({gpu_uuids.EXAMPLE}): it is passed to no Job"
        )
    job = copy.deepcopy(dict(template))
    job["apiVersion"] = "batch/v1"
    job["kind"] = "Job"
    labels = {
        keys.REPAIR_ACTION_LABEL: action,
        keys.REPAIR_CYCLE_LABEL: str(cycle),
        keys.POLICY_LABEL: policy,
        keys.NODE_LABEL: node,
        MANAGED_BY_LABEL: MANAGED_BY,
    }
    metadata = dict(job.get("metadata") or {})
    metadata.pop("generateName", None)
    metadata.pop("resourceVersion", None)
    metadata["name"] = name
    metadata["namespace"] = namespace
    # Not a controller, and no blockOwnerDeletion (that would need the right to update Node finalizers).
    metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    metadata["annotations"] = {
        **(metadata.get("annotations") or {}),
        keys.REPAIR_CYCLE_STARTED_ANNOTATION: cycle_started,
    }
    job["metadata"] = metadata
    spec = dict(job.get("spec") or {})
    spec["backoffLimit"] = 0
    spec["activeDeadlineSeconds"] = max(1, int(timeout_seconds))
    spec["ttlSecondsAfterFinished"] = TTL_AFTER_FINISHED_SECONDS
    pod = dict(spec.get("template") or {})
    pod_meta = dict(pod.get("metadata") or {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
    pod["metadata"] = pod_meta
    pod_spec = _without_token(dict(pod.get("spec") or {}), action)
    pod_spec["nodeName"] = node
    if guard:
        pod_spec["nodeSelector"] = {
            **(pod_spec.get("nodeSelector") or {}),
            keys.REPAIR_NODE_UID_LABEL: node_uid,
        }
    pod_spec["restartPolicy"] = "Never"
    pod_spec["tolerations"] = [*(pod_spec.get("tolerations") or []), {"operator": "Exists"}]
    env = [
        {"name": keys.REPAIR_NODE_ENV, "value": node},
        {"name": keys.REPAIR_GPUS_ENV, "value": ",".join(gpus)},
        {"name": keys.REPAIR_ACTION_ENV, "value": action},
        *({"name": k, "value": v} for k, v in (extra_env or {}).items()),
    ]
    ours = {e["name"] for e in env}
    for field in ("containers", "initContainers"):
        containers = []
        for container in pod_spec.get(field) or []:
            filled = dict(container)
            filled["env"] = [*(e for e in filled.get("env") or [] if e.get("name") not in ours), *env]
            containers.append(filled)
        if field in pod_spec:
            pod_spec[field] = containers
    pod["spec"] = pod_spec
    spec["template"] = pod
    job["spec"] = spec
    job.pop("status", None)
    return job


def without_token(pod_spec: dict[str, Any], key: str) -> dict[str, Any]:
    """`_without_token`, for the active checks' Jobs (`ladder.check.check_jobs`)."""
    return _without_token(pod_spec, key)


def _without_token(pod_spec: dict[str, Any], key: str) -> dict[str, Any]:
    """The pod spec with no ServiceAccount token: `STEP_SERVICE_ACCOUNT`, no automount, no projected
    token. A template that names another ServiceAccount (the operator's, say) is refused, not rewritten:
    its author expects that account's rights, and silently losing them would fail the step obscurely."""
    for field in ("serviceAccountName", "serviceAccount"):
        named = pod_spec.pop(field, None)
        if named not in (None, "", STEP_SERVICE_ACCOUNT):
            raise TemplateError(
                f"template {key} names ServiceAccount {named!r} ({field}): a repair Job runs as "
                f"ServiceAccount {STEP_SERVICE_ACCOUNT!r} with no token, whatever the template says; "
                f"remove {field} from the template"
            )
    pod_spec["serviceAccountName"] = STEP_SERVICE_ACCOUNT
    pod_spec["automountServiceAccountToken"] = False
    if "volumes" not in pod_spec:
        return pod_spec
    volumes, dropped = [], set()
    for volume in pod_spec.get("volumes") or []:
        projected = volume.get("projected") if isinstance(volume, Mapping) else None
        if not isinstance(projected, Mapping):
            volumes.append(volume)
            continue
        sources = [s for s in projected.get("sources") or [] if "serviceAccountToken" not in s]
        if sources:
            volumes.append({**volume, "projected": {**projected, "sources": sources}})
        else:
            dropped.add(volume.get("name"))
    pod_spec["volumes"] = volumes
    for field in ("containers", "initContainers"):
        if field in pod_spec:
            pod_spec[field] = [
                {**c, "volumeMounts": [m for m in c["volumeMounts"] if m.get("name") not in dropped]}
                if c.get("volumeMounts")
                else c
                for c in pod_spec.get(field) or []
            ]
    return pod_spec


async def create(
    client: kube.Client, job: Mapping[str, Any], *, belongs: Callable[[Mapping[str, Any]], bool]
) -> tuple[kube.JsonObject, bool]:
    """Create the Job; (the Job, True) when created, (the Job found, False) when it existed and `belongs`
    to the caller's cycle (adopted). One that does not is deleted (Background) and StaleJob raised."""
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    try:
        return await client.create(jobs_path(namespace), job), True
    except kube.ApiError as error:
        if error.status != 409:
            raise
    found = await client.get(jobs_path(namespace, name))
    if belongs(found):
        return found, False
    if not (found.get("metadata") or {}).get("deletionTimestamp"):
        await delete(client, namespace, name)
    raise StaleJob(f"Job {namespace}/{name} exists from another repair cycle: deleted, created once gone")


async def read(client: kube.Client, namespace: str, name: str) -> kube.JsonObject | None:
    """The Job, or None when it does not exist."""
    try:
        return await client.get(jobs_path(namespace, name))
    except kube.ApiError as error:
        if error.not_found:
            return None
        raise


async def delete(client: kube.Client, namespace: str, name: str) -> bool:
    """Delete the Job and (in the background) its pods; False when it was gone already."""
    try:
        await client.request("DELETE", jobs_path(namespace, name), query={"propagationPolicy": "Background"})
    except kube.ApiError as error:
        if error.not_found:
            return False
        raise
    return True


async def set_state(
    client: kube.Client,
    node: str,
    *,
    value: str | None,
    resource_version: str,
    retired: bool = False,
    also: Mapping[str, str | None] | None = None,
    node_uid: str = "",
) -> kube.JsonObject:
    """Write (or remove: None) the Node's repair annotation, only on the version it was decided from
    (409 otherwise), with the label its step Jobs' pods select (`node_uid`; removed with the annotation);
    `retired` also sets the needs-repair label, `also` more annotations in the same write."""
    metadata: dict[str, Any] = {
        "resourceVersion": resource_version,
        "annotations": {**(also or {}), keys.REPAIR_ANNOTATION: value},
        "labels": {keys.REPAIR_NODE_UID_LABEL: node_uid if value is not None and node_uid else None},
    }
    if retired:
        metadata["labels"][keys.NEEDS_REPAIR_LABEL] = keys.NEEDS_REPAIR_MANUAL
    return await client.patch(f"/api/v1/nodes/{node}", {"metadata": metadata})


async def clear_retired(client: kube.Client, node: str) -> kube.JsonObject:
    """A human returned a retired node: the needs-repair label (and any repair state) goes."""
    body = {
        "metadata": {
            "labels": {keys.NEEDS_REPAIR_LABEL: None, keys.REPAIR_NODE_UID_LABEL: None},
            "annotations": {keys.REPAIR_ANNOTATION: None},
        }
    }
    return await client.patch(f"/api/v1/nodes/{node}", body)
