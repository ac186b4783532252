"""The repair integration tests' Job side: a templates ConfigMap whose pods kwok leaves alone, and the
test playing the node (listing a node's Jobs, ending a Job's pod as a kubelet would).

Templates' pods carry `kwok.x-k8s.io/status: custom`, so kwok never runs or ends them; `end` writes the
pod's terminal status (pods/status, as a kubelet does) and waits for the Job controller
(kube-controller-manager) to mark the Job Complete or Failed.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import yaml
from kubernetes import client

import namespaces
from gpuhealth_api import keys
from gpuhealth_sim import waiting
from gpuhealth_sim.fleet import repairs

TEMPLATES = "repair-templates"
"""The ConfigMap's name in the fixture's namespace: pass `--repair-templates=<namespace>/TEMPLATES`."""
TIMEOUT = 30.0


def job_template(action: str, *, image: str | None = "registry.k8s.io/pause:3.10") -> str:
    """A Job template (YAML) for `action` whose pod kwok leaves to the test; `image` None makes the
    API server refuse the Job the operator fills in from it (a container needs an image)."""
    # The shell reads the UUIDs from its environment, quoted: never `$(GPUHEALTH_GPU_UUIDS)` inside
    # `sh -c`, which Kubernetes splices into the script's text (docs/repair.md, "Parameters").
    container: dict[str, Any] = {"name": "step", "command": ["sh", "-c", 'echo "$GPUHEALTH_GPU_UUIDS"']}
    if image is not None:
        container["image"] = image
    return yaml.safe_dump(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"labels": {"template": action}},
            "spec": {
                "template": {
                    "metadata": {"annotations": {"kwok.x-k8s.io/status": "custom"}},
                    "spec": {"containers": [container]},
                }
            },
        }
    )


def repair_templates() -> dict[str, str]:
    """The TEMPLATES ConfigMap's data: a template for ResetGPU, RebootNode and Validation."""
    return {key: job_template(key) for key in ("ResetGPU", "RebootNode", "Validation")}


@contextlib.contextmanager
def templates_namespace(k8s: client.ApiClient, prefix: str, templates: Mapping[str, str]) -> Iterator[str]:
    """A namespace of its own (`prefix`-…) holding the TEMPLATES ConfigMap of `templates`, deleted on exit."""
    with namespaces.created(k8s, f"{prefix}-{secrets.token_hex(3)}") as name:
        body = {"metadata": {"name": TEMPLATES}, "data": dict(templates)}
        client.CoreV1Api(k8s).create_namespaced_config_map(name, body)
        yield name


def jobs_namespace_fixture(prefix: str) -> Any:
    """A module fixture `jobs_namespace`: a namespace of its own holding the TEMPLATES ConfigMap
    (ResetGPU, RebootNode, Validation), deleted after the module."""

    @pytest.fixture(scope="module", name="jobs_namespace")
    def jobs_namespace(k8s: client.ApiClient) -> Iterator[str]:
        with templates_namespace(k8s, prefix, repair_templates()) as name:
            yield name

    return jobs_namespace


def templates_flag(request: pytest.FixtureRequest) -> str:
    """The operator's `--repair-templates` for the module's `jobs_namespace`."""
    return f"--repair-templates={request.getfixturevalue('jobs_namespace')}/{TEMPLATES}"


def jobs(k8s: client.ApiClient, namespace: str, node: str) -> list[dict[str, Any]]:
    """The node's repair Jobs (any action) not being deleted."""
    listed = client.BatchV1Api(k8s).list_namespaced_job(
        namespace, label_selector=f"{keys.NODE_LABEL}={node}", _preload_content=False
    )
    items: list[dict[str, Any]] = yaml.safe_load(listed.data)["items"]
    return [j for j in items if not j["metadata"].get("deletionTimestamp")]


def job_pod(k8s: client.ApiClient, namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    """The Job's pod, once the Job controller made it."""
    selector = f"job-name={job['metadata']['name']}"

    def found() -> list[dict[str, Any]]:
        listed = client.CoreV1Api(k8s).list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
        items: list[dict[str, Any]] = yaml.safe_load(listed.data)["items"]
        return items

    waiting.wait_until(found, timeout_seconds=TIMEOUT, message=f"a pod of Job {job['metadata']['name']}")
    return found()[0]


def end(k8s: client.ApiClient, namespace: str, job: dict[str, Any], *, ok: bool) -> None:
    """Play the node: the Job's pod exits (0 or 1), then wait for the Job controller to finish the Job."""
    pod = job_pod(k8s, namespace, job)
    outcome = repairs.Outcome(ok, 0 if ok else 1, "played by the test")
    client.CoreV1Api(k8s).patch_namespaced_pod_status(
        pod["metadata"]["name"],
        namespace,
        repairs.terminal_status(pod, outcome, time.time()),
        _content_type="application/merge-patch+json",
    )
    wanted = "Complete" if ok else "Failed"

    def finished() -> bool:
        current = client.BatchV1Api(k8s).read_namespaced_job_status(job["metadata"]["name"], namespace)
        return any(c.type == wanted and c.status == "True" for c in (current.status.conditions or []))

    waiting.wait_until(finished, timeout_seconds=TIMEOUT, message=f"Job {job['metadata']['name']} {wanted}")
