"""A namespace of a test's own, ready for pods, deleted after it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kubernetes import client

from gpuhealth_sim import waiting


@contextlib.contextmanager
def created(k8s: client.ApiClient, name: str) -> Iterator[str]:
    """The namespace `name` created and ready for pods (its default service account exists); deleted on
    exit."""
    core = client.CoreV1Api(k8s)
    core.create_namespace(body={"metadata": {"name": name}})
    # Pods are rejected until the service-account controller has created "default".
    waiting.wait_until(
        lambda: core.read_namespaced_service_account("default", name),
        timeout_seconds=30,
        message=f"service account default in namespace {name}",
    )
    try:
        yield name
    finally:
        core.delete_namespace(name)
