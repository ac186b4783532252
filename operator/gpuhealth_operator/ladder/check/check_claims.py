"""A check on a DRA node: how its node publishes GPUs, and the ResourceClaimTemplate its pod claims them by.

`access` reads the Node's capacity and, only where it advertises no `nvidia.com/gpu`, the node's
ResourceSlices (`decisions.check_gpus.access` decides); a node with neither is looked at again only
after NO_GPUS_RETRY_SECONDS (`recently_without_gpus`). `create` makes the Job's template in the
`resource.k8s.io` version discovery says is served, owned by the Job: the garbage collector deletes it
with the Job (whoever deletes that: the operator once the run is recorded, the Job controller's TTL, the
Node's deletion), so nothing is left behind. Its name is the Job's plus a token drawn when the Job was
built, so a new Job of the node never meets its predecessor's template still awaiting collection, and a
leader that restarts finds the name in the Job it adopts: one template per Job, never two.

The Job is created first (a template needs its owner's UID); the claim controller retries the pod's
claim until the template exists, a moment later. Should the template not be created (refused, or the
operator stopped in between), the Job is deleted where it can be; otherwise the pod stays Pending and
the run ends TimedOut, which is never judged a fault of the GPUs.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

from gpuhealth_operator.client import dra, kube
from gpuhealth_operator.decisions import check_gpus

NO_GPUS_RETRY_SECONDS: Final = 300.0
"""How long a node found without GPUs a check could hold is left out of the plan before it is looked at
again (a DRA driver or the device plugin may come up later); meanwhile it takes no node's place."""


def recently_without_gpus(
    no_gpus: Mapping[str, datetime.datetime], node: str, now: datetime.datetime
) -> bool:
    found = no_gpus.get(node)
    return found is not None and (now - found).total_seconds() < NO_GPUS_RETRY_SECONDS


async def access(client: kube.Client, node: str, gpu_capacity: int, *, driver: str) -> check_gpus.Access:
    """How a check on `node` holds its GPUs (the ResourceSlices are listed only without capacity)."""
    if gpu_capacity > 0:
        return check_gpus.access(node, gpu_capacity, 0, driver=driver)
    slices = await dra.resource_slices(client, node)
    return check_gpus.access(node, 0, check_gpus.gpu_devices(slices, node, driver=driver), driver=driver)


async def served_version(client: kube.Client) -> str | None:
    """The resource.k8s.io version serving resourceclaimtemplates (None: no DRA API at all)."""
    found = await dra.serving(client, check_gpus.CLAIM_TEMPLATES, check_gpus.KNOWN_VERSIONS)
    return check_gpus.served_version(found)


def path(api_version: str, namespace: str) -> str:
    return f"/apis/{check_gpus.GROUP}/{api_version}/namespaces/{namespace}/{check_gpus.CLAIM_TEMPLATES}"


async def create(client: kube.Client, api_version: str, job: Mapping[str, Any], *, device_class: str) -> bool:
    """Create the ResourceClaimTemplate the created `job`'s pod names; False: it exists (adopted)."""
    name = check_gpus.claimed_template(job)
    meta = job.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    if name is None:
        raise ValueError(f"check Job {meta.get('name')} claims no GPUs through a template")
    body = check_gpus.claim_template(
        api_version=api_version, name=name, namespace=namespace, device_class=device_class, job=job
    )
    try:
        await client.create(path(api_version, namespace), body)
    except kube.ApiError as error:
        if error.status == 409:
            return False
        raise
    return True
