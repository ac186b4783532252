"""kopf's diff base: this operator registers event handlers only, so it builds, reads and stores none."""

from __future__ import annotations

from typing import Any, cast

import kopf

from gpuhealth_operator.runtime import handlers, resync

NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": "gpu-001",
        "labels": {"nvidia.com/gpu.present": "true"},
        "annotations": {"kopf.gpuhealth.io/last-handled-configuration": '{"spec": {"unschedulable": true}}'},
    },
    "spec": {"unschedulable": True},
    "status": {"capacity": {"nvidia.com/gpu": "8"}},
}


def test_every_handler_the_operator_registers_is_an_event_handler() -> None:
    """kopf reads the diff base only for changing handlers and daemons: none may be registered while
    `EventsOnlyDiffBase` stands in for it (with a selector, agent pods are watched too)."""
    registry = kopf.OperatorRegistry()
    handlers.register(registry, agent_pod_selector="app=agent")
    resync.Relists().register(registry)
    assert registry._watching.get_all_handlers()
    for stateful in (registry._changing, registry._spawning, registry._indexing, registry._webhooks):
        assert not stateful.get_all_handlers()


def test_the_diff_base_reads_nothing_builds_nothing_and_writes_nothing() -> None:
    body = kopf.Body(cast(kopf.RawBody, NODE))
    storage = handlers.EventsOnlyDiffBase()
    assert storage.fetch(body=body) is None  # not even a kopf annotation someone left on the Node
    assert storage.build(body=body) == {}
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=kopf.BodyEssence(spec={"unschedulable": True}))
    assert not patch


def test_the_operators_kopf_settings_use_it() -> None:
    settings = kopf.OperatorSettings()
    handlers.configure(settings)
    assert isinstance(settings.persistence.diffbase_storage, handlers.EventsOnlyDiffBase)
