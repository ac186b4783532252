"""The check step's timer sweep asks the API server nothing where no policy has active checks.

The chart grants no right to list Jobs until repair or checks are enabled (DESIGN.md, "Privilege is an
explicit grant"): a sweep that listed them anyway would log a 403 every second on every install.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
from typing import Any

import aiohttp
import pytest

import operator_context
from gpuhealth_api import keys
from gpuhealth_operator.client import gpunodes
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.ladder.check import checking
from gpuhealth_operator.shared import context

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)


class Refusing:
    """A client that records every request and refuses it, as the API server does without the grant."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> Any:
        async def call(*args: object, **kwargs: object) -> object:
            self.asked.append(name)
            raise AssertionError(f"the sweep asked the API server: {name}{args}")

        return call


async def _no_write(ctx: context.Context, name: str) -> None:
    raise AssertionError("nothing to write")


def test_a_sweep_without_any_policy_with_checks_sends_no_request() -> None:
    client = Refusing()
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    asyncio.run(checking.sweep(ctx, NOW, _no_write))
    assert client.asked == []


class Recording:
    """A client that answers GPUNode patches and Event posts only, and records every call's path."""

    def __init__(self, *, transient: int = 0) -> None:
        self.asked: list[tuple[str, str]] = []
        self.events: list[dict[str, Any]] = []
        self.transient = transient

    async def patch(self, path: str, body: dict[str, Any], **_: object) -> dict[str, Any]:
        self.asked.append(("patch", path))
        return {"metadata": {"name": path.rsplit("/", 1)[-1], "resourceVersion": "2", "annotations": {}}}

    async def create(self, path: str, body: dict[str, Any], **_: object) -> dict[str, Any]:
        self.asked.append(("create", path))
        self.events.append(body)
        return body

    async def list_all(self, path: str, params: object = None, **_: object) -> list[dict[str, Any]]:
        self.asked.append(("list_all", path))
        if self.transient:
            self.transient -= 1
            raise aiohttp.ClientConnectionError("connection reset")
        return []

    def __getattr__(self, name: str) -> Any:
        async def call(*args: object, **kwargs: object) -> object:
            raise AssertionError(f"the sweep asked the API server: {name}{args}")

        return call


def _requested(ctx: context.Context, node: str, token: str) -> None:
    ctx.cache.put_node({"metadata": {"name": node, "uid": f"uid-{node}", "labels": {"pool": "gpu"}}})
    body = {
        "metadata": {
            "name": node,
            "resourceVersion": "1",
            "annotations": {keys.CHECK_NOW_ANNOTATION: json.dumps({"id": token})},
        }
    }
    ctx.cache.put_gpunode(body, NOW)


def test_a_request_where_no_policy_has_checks_is_refused_without_a_job_list() -> None:
    client = Recording()
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    _requested(ctx, "n1", "tok-7")
    asyncio.run(checking.sweep(ctx, NOW, _no_write))
    assert all(kind != "list_all" for kind, _ in client.asked), client.asked
    assert ("patch", gpunodes.gpunode_path("n1")) in client.asked, "the request's annotation removed"
    (event,) = client.events
    assert event["reason"] == "CheckRefused"
    assert "tok-7" in event["message"] and "no policy selecting the node has activeChecks" in event["message"]


CHECKING = policies.parse_policy(
    "p",
    1,
    {
        "nodeSelector": {"matchLabels": {"pool": "gpu"}},
        "rules": [{"name": "e", "condition": "EccUncorrectable", "action": "Event"}],
        "activeChecks": [
            {
                "name": "quick",
                "template": "DcgmDiagQuick",
                "everySeconds": 3600,
                "idleForSeconds": 60,
                "timeoutSeconds": 600,
                "maxConcurrent": 1,
            }
        ],
    },
)


def test_a_transient_error_is_logged_and_the_next_pass_asks_again(caplog: pytest.LogCaptureFixture) -> None:
    client = Recording(transient=1)
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    ctx.cache.put_policy(CHECKING)
    # The logger named, not the root: a backtest earlier in the process sets gpuhealth_operator to ERROR.
    with caplog.at_level(logging.WARNING, logger="gpuhealth_operator"):
        asyncio.run(checking.on_timer(ctx, NOW, _no_write))  # never raises: the timer keeps going
    assert "will retry" in caplog.text and "connection reset" in caplog.text
    asked = len(client.asked)
    asyncio.run(checking.on_timer(ctx, NOW + datetime.timedelta(seconds=1), _no_write))
    assert ("list_all", "/apis/batch/v1/namespaces/gpu-health/jobs") in client.asked[asked:]


def _gpu_pod(node: str) -> dict[str, Any]:
    container = {"name": "c", "resources": {"limits": {keys.GPU_RESOURCE: "1"}}}
    return {"metadata": {"name": "train", "uid": "u1"}, "spec": {"nodeName": node, "containers": [container]}}


def test_until_the_pods_are_listed_no_node_is_idle_and_a_request_waits() -> None:
    """The pods come from the watch's index (`state/gpu_pods.py`), never from a LIST per pass; before
    its LIST is in, every node is as if busy: no idle clock runs, an on-demand request is left waiting."""
    client = Recording()
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    ctx.cache.put_policy(CHECKING)
    _requested(ctx, "n1", "tok-8")
    asyncio.run(checking.sweep(ctx, NOW, _no_write))
    assert "n1" not in ctx.steps.check.idle_since
    assert client.asked == [("list_all", "/apis/batch/v1/namespaces/gpu-health/jobs")], "no pod LIST"
    assert not client.events, "the request is neither refused nor taken: it waits for the pods"


def test_a_node_is_idle_from_when_its_last_gpu_pod_left() -> None:
    client = Recording()
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    ctx.cache.put_policy(CHECKING)
    ctx.cache.put_node({"metadata": {"name": "n1", "uid": "uid-n1", "labels": {"pool": "gpu"}}})
    ctx.cache.put_gpunode({"metadata": {"name": "n1", "resourceVersion": "1"}}, NOW)
    pods = ctx.steps.check.pods
    pods.listing()
    pods.observe(None, _gpu_pod("n1"), NOW)
    pods.listed(NOW)
    second = datetime.timedelta(seconds=1)
    asyncio.run(checking.sweep(ctx, NOW, _no_write))
    assert "n1" not in ctx.steps.check.idle_since, "busy"
    pods.observe("DELETED", _gpu_pod("n1"), NOW + second)
    asyncio.run(checking.sweep(ctx, NOW + 2 * second, _no_write))
    assert ctx.steps.check.idle_since["n1"] == NOW + 2 * second, "first seen idle at this pass"
    # A pod that came and went between two passes: idle only from when it left.
    pods.observe("ADDED", _gpu_pod("n1"), NOW + 3 * second)
    pods.observe("DELETED", _gpu_pod("n1"), NOW + 4 * second)
    asyncio.run(checking.sweep(ctx, NOW + 5 * second, _no_write))
    assert ctx.steps.check.idle_since["n1"] == NOW + 4 * second
    assert all(path != "/api/v1/pods" for _, path in client.asked)


def _gpu_node(ctx: context.Context, node: str, *, gpus: int, created: str) -> None:
    capacity = {keys.GPU_RESOURCE: str(gpus)} if gpus else {}
    ctx.cache.put_node(
        {
            "metadata": {"name": node, "uid": f"uid-{node}", "labels": {"pool": "gpu"}},
            "status": {"capacity": capacity, "allocatable": capacity},
        }
    )
    ctx.cache.put_gpunode(
        {"metadata": {"name": node, "resourceVersion": "1", "creationTimestamp": created}}, NOW
    )


def test_a_node_without_gpus_to_hold_is_said_once_and_takes_no_other_nodes_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = Recording()
    ctx = operator_context.new_context(client)  # type: ignore[arg-type]
    ctx.cache.put_policy(CHECKING)  # maxConcurrent 1
    _gpu_node(ctx, "bare", gpus=0, created="2026-01-01T00:00:00Z")  # the most overdue: planned first
    _gpu_node(ctx, "plugin", gpus=8, created="2026-06-01T00:00:00Z")
    ctx.steps.check.pods.listing()  # the watch's LIST: no pod anywhere
    ctx.steps.check.pods.listed(NOW)
    with caplog.at_level(logging.WARNING, logger="gpuhealth_operator"):
        for seconds in (0, 61, 62, 63):
            asyncio.run(checking.sweep(ctx, NOW + datetime.timedelta(seconds=seconds), _no_write))
    said = [r.getMessage() for r in caplog.records if "not started" in r.getMessage()]
    assert len(said) == 1 and "node bare advertises no nvidia.com/gpu capacity" in said[0], said
    slices = [path for kind, path in client.asked if kind == "list_all" and path.endswith("/resourceslices")]
    assert len(slices) == 1, "looked at again only after a while"
    jobs = [body for body in client.events if body.get("kind") == "Job"]
    assert jobs and {j["metadata"]["labels"][keys.NODE_LABEL] for j in jobs} == {"plugin"}
    limits = jobs[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits[keys.GPU_RESOURCE] == "8"
