"""An active check's Job: made from its template, listed, read with its pod, deleted.

Unlike a repair step's Job (`ladder.repair.jobs.fill`), a check goes through the scheduler: no
`nodeName`, but a required node affinity on the node's `metadata.name`, a request of every GPU the
node advertises and the chart's PriorityClass `gpu-health-check` (below every workload), so that real
work wanting the GPUs preempts it. Its `podFailurePolicy` fails the Job on the pod's DisruptionTarget
condition, so a preempted check's Job says so after its pod is deleted (`checks.result_of`). The name is
the node's (`job_name`): two leaders or two policies can never start a second check on one node.

What the repair Jobs promise holds here too: no ServiceAccount token (`jobs.without_token`), an
ownerReference to the Node (the garbage collector deletes the Job with the Node), no retries.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_operator.client import kube
from gpuhealth_operator.decisions import check_gpus, checks
from gpuhealth_operator.ladder.repair import jobs

PRIORITY_CLASS: Final = "gpu-health-check"
"""The chart's PriorityClass of check pods (value below every workload, preemptionPolicy Never)."""
GPU_RESOURCE: Final = keys.GPU_RESOURCE
NAME_PREFIX: Final = "gpuhealth-check-"
STOP_GRACE_SECONDS: Final = 5
"""Most seconds a check pod is given to stop once preempted (a template may ask for less): kube-scheduler
binds the workload only once its victim is gone, and the Kubernetes default (30 s) would keep the
workload waiting past issue 51's 10 s. A diagnostic stopped early is just a Preempted run."""
TTL_AFTER_FINISHED_SECONDS: Final = 600
"""The Job controller deletes a finished check Job after this long if the operator did not (it is down)."""


def job_name(node: str) -> str:
    """The node's one check Job name (≤ 63 characters: the Job controller labels its pods with it)."""
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    return f"{NAME_PREFIX}{node[:36].rstrip('.-')}-{digest}"


def build(
    template: Mapping[str, Any],
    start: checks.Start,
    *,
    namespace: str,
    node_uid: str,
    gpus: int,
    request_id: str | None = None,
    claim_template: str | None = None,
) -> dict[str, Any]:
    """The check Job of `start` from its template; TemplateError when it names a ServiceAccount.

    With `claim_template` (a DRA node) the pod holds the node's GPUs through a claim made from that
    ResourceClaimTemplate (`check_claims`), and requests no `nvidia.com/gpu`."""
    if not node_uid:
        raise jobs.TemplateError(
            f"the UID of Node {start.node} is not known: a Job must be owned by its Node"
        )
    job = copy.deepcopy(dict(template))
    job["apiVersion"], job["kind"] = "batch/v1", "Job"
    labels = {
        keys.CHECK_LABEL: start.check,
        keys.CHECK_TEMPLATE_LABEL: start.template,
        keys.POLICY_LABEL: start.policy,
        keys.NODE_LABEL: start.node,
        jobs.MANAGED_BY_LABEL: jobs.MANAGED_BY,
    }
    metadata = {k: v for k, v in dict(job.get("metadata") or {}).items() if k not in ("generateName",)}
    metadata.pop("resourceVersion", None)
    metadata["name"] = job_name(start.node)
    metadata["namespace"] = namespace
    metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": start.node, "uid": node_uid}]
    metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    annotations = dict(metadata.get("annotations") or {})
    if request_id:
        annotations[keys.CHECK_REQUEST_ANNOTATION] = request_id
    metadata["annotations"] = annotations
    job["metadata"] = metadata
    spec = dict(job.get("spec") or {})
    spec["backoffLimit"] = 0
    spec["activeDeadlineSeconds"] = max(1, int(start.timeout_seconds))
    spec["ttlSecondsAfterFinished"] = TTL_AFTER_FINISHED_SECONDS
    # A preempted pod's DisruptionTarget fails the Job at once and says so in its condition (reason
    # PodFailurePolicy): without it a preemption reads as a plain failure once the pod is gone.
    spec["podFailurePolicy"] = {
        "rules": [{"action": "FailJob", "onPodConditions": [{"type": checks.DISRUPTION_TARGET}]}]
    }
    pod = dict(spec.get("template") or {})
    pod_meta = dict(pod.get("metadata") or {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
    pod["metadata"] = pod_meta
    pod_spec = jobs.without_token(dict(pod.get("spec") or {}), start.template)
    pod_spec.pop("nodeName", None)  # the scheduler places it, so that it can preempt it
    pod_spec["restartPolicy"] = "Never"
    asked = pod_spec.get("terminationGracePeriodSeconds")
    fits = isinstance(asked, int) and not isinstance(asked, bool) and 0 <= asked < STOP_GRACE_SECONDS
    pod_spec["terminationGracePeriodSeconds"] = asked if fits else STOP_GRACE_SECONDS
    pod_spec["priorityClassName"] = PRIORITY_CLASS
    pod_spec.pop("priority", None)
    pod_spec["affinity"] = {
        **(pod_spec.get("affinity") or {}),
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [start.node]}]}
                ]
            }
        },
    }
    pod_spec["containers"] = _all_gpus(list(pod_spec.get("containers") or []), gpus, claim_template)
    if claim_template is not None:
        # The check's claim only: a claim of the template's own could leave GPUs for a workload to share.
        pod_spec["resourceClaims"] = [
            {"name": check_gpus.CLAIM_NAME, "resourceClaimTemplateName": claim_template}
        ]
        pod_meta["annotations"] = {
            **(pod_meta.get("annotations") or {}),
            keys.CHECK_GPUS_ANNOTATION: str(gpus),
        }
    else:
        pod_spec.pop("resourceClaims", None)
    pod["spec"] = pod_spec
    spec["template"] = pod
    job["spec"] = spec
    job.pop("status", None)
    return job


def _all_gpus(
    containers: list[Mapping[str, Any]], gpus: int, claim_template: str | None
) -> list[dict[str, Any]]:
    """The first container holds every GPU of the node (request = limit, as for any extended resource;
    or the claim of them all); the others none: a GPU left over would let a workload share the node."""
    filled = []
    for index, container in enumerate(containers):
        item = dict(container)
        resources = dict(item.get("resources") or {})
        limits = {k: v for k, v in dict(resources.get("limits") or {}).items() if k != GPU_RESOURCE}
        requests = {k: v for k, v in dict(resources.get("requests") or {}).items() if k != GPU_RESOURCE}
        resources.pop("claims", None)
        if index == 0 and claim_template is None:
            limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = str(gpus)
        elif index == 0:
            resources["claims"] = [{"name": check_gpus.CLAIM_NAME}]
        resources["limits"], resources["requests"] = limits, requests
        item["resources"] = resources
        filled.append(item)
    return filled


def started_at(job: Mapping[str, Any]) -> str:
    return str((job.get("metadata") or {}).get("creationTimestamp") or "")


def timeout_of(job: Mapping[str, Any]) -> float | None:
    deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
    return float(deadline) if isinstance(deadline, int | float) and not isinstance(deadline, bool) else None


async def list_jobs(client: kube.Client, namespace: str) -> list[kube.JsonObject]:
    """Every check Job (label CHECK_LABEL) in the namespace, of any policy or process: what runs."""
    return await client.list_all(jobs.jobs_path(namespace), {"labelSelector": keys.CHECK_LABEL})


async def list_pods(client: kube.Client, namespace: str) -> dict[str, kube.JsonObject]:
    """The check Jobs' pods by their Job's name (the newest of a Job's, should there be two)."""
    listed = await client.list_all(
        f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": keys.CHECK_LABEL}
    )
    found: dict[str, kube.JsonObject] = {}
    for pod in sorted(listed, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or "")):
        owner = ((pod.get("metadata") or {}).get("labels") or {}).get("job-name")
        if isinstance(owner, str):
            found[owner] = pod
    return found


async def create(client: kube.Client, job: Mapping[str, Any]) -> kube.JsonObject | None:
    """Create the Job: the stored Job (with its UID), or None when one of its name exists already."""
    try:
        return await client.create(jobs.jobs_path(job["metadata"]["namespace"]), job)
    except kube.ApiError as error:
        if error.status == 409:
            return None
        raise


delete = jobs.delete
"""Delete a Job, its pod in the background; False when it was gone already."""
