"""On-demand checks: the GPUNode annotation `keys.CHECK_NOW_ANNOTATION` (`kubectl gpuhealth check NODE`).

A request is JSON `{"id": TOKEN, "check": NAME-OR-TEMPLATE}` (`check` optional: the node's first check of
the first acting policy, by name, that selects it). It runs under every guard of a scheduled check except
`everySeconds` and `idleForSeconds`; a pod using GPUs on the node refuses it (the check would only wait
for the GPUs, or be preempted at once), so does a check already running there. A place under
maxConcurrent is waited for (the annotation stays). The annotation is removed before the Job is created
(a request never starts two runs); a refusal removes it with a `CheckRefused` Event naming the token and
the reason, the most telling one first (`_guard`); where no policy selecting the node has activeChecks
the sweep refuses it without listing any Job (an install with checks off has no grant to). The run's
Job carries the token (`keys.CHECK_REQUEST_ANNOTATION`), and so does its entry in `status.checks[]`
(`requestId`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import events, gpunodes, kube
from gpuhealth_operator.decisions import checks, model, policies
from gpuhealth_operator.shared import context

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Request:
    node: str
    token: str
    check: str | None


def parse(node: str, raw: str) -> Request | str:
    """The request, or why it cannot be read."""
    try:
        body = json.loads(raw)
    except ValueError:
        return "not a JSON object"
    if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not body["id"]:
        return 'not a JSON object with an "id"'
    wanted = body.get("check")
    if wanted is not None and (not isinstance(wanted, str) or not wanted):
        return '"check" is not a name'
    return Request(node, body["id"][:128], wanted)


EXCLUDED: Final = f"the node is excluded ({keys.EXCLUDE_LABEL})"
NO_POLICY: Final = "no policy selecting the node has activeChecks"


def _guard(state: checks.NodeState | None) -> str | None:
    """Why no check may start on the node, the most telling reason first: a node in repair is usually
    unschedulable too, and "unschedulable" would hide what holds it. (An excluded node never gets here:
    `take` refuses it first, as it is in no policy's selection.)"""
    if state is None:
        return "the node has no GPUNode or Node"
    reasons = (
        (state.in_repair, "the node is in repair"),
        (state.maintenance, "the GPU Operator maintains the node"),
        (state.overridden, "a human overrode gpu-health on the node"),
        (not state.schedulable, "the node is unschedulable"),
    )
    return next((why for held, why in reasons if held), None)


def _choose(
    wanting: Sequence[model.Policy], selected: dict[str, frozenset[str]], request: Request
) -> tuple[model.Policy, model.ActiveCheck] | str:
    acting = [p for p in wanting if not p.dry_run and request.node in selected[p.name]]
    if not acting:
        dry = any(request.node in selected[p.name] for p in wanting)
        return "only a dry-run policy with activeChecks selects the node" if dry else NO_POLICY
    for policy in acting:
        for check in policy.active_checks:
            if request.check is None or request.check in (check.name, check.template):
                return policy, check
    return f"no check or template named {request.check!r} in the policies that select the node"


async def take(
    ctx: context.Context,
    *,
    wanting: Sequence[model.Policy],
    states: Sequence[checks.NodeState],
    busy: AbstractSet[str],
    flying: Sequence[checks.InFlight],
    now: datetime.datetime,
) -> list[tuple[checks.Start, str]]:
    """The requested checks to start now, each with its token (its annotation removed); refusals said."""
    by_name = {s.name: s for s in states}
    selected = {p.name: frozenset(ctx.cache.selection(p).selected) for p in wanting}
    acting_nodes = len(set().union(*(selected[p.name] for p in wanting if not p.dry_run)))
    running = {f.node for f in flying}
    starts: list[tuple[checks.Start, str]] = []
    # Every timer pass of every install asks this, checks or none: the cache keeps the GPUNodes with a
    # request (`check_requested`), so a pass costs the requests, not a walk over the fleet's GPUNodes.
    requested = [
        (name, raw)
        for name in ctx.cache.check_requested
        if (gpunode := ctx.cache.gpunodes.get(name)) is not None
        and (raw := gpunode.annotations.get(keys.CHECK_NOW_ANNOTATION)) is not None
    ]
    for name, raw in sorted(requested):
        if ctx.steps.check.refused.get(name) == raw:
            continue  # refused already; its removal is on its way
        request = parse(name, raw)
        if isinstance(request, str):
            await _refuse(ctx, name, raw, "?", f"the request is {request}")
            continue
        record = ctx.cache.nodes.get(name)
        if record is not None and policies.excluded(record.view):
            # An excluded node is in no policy's selection: say why, not that no policy selects it.
            await _refuse(ctx, name, raw, request.token, EXCLUDED)
            continue
        chosen = _choose(wanting, selected, request) if wanting else NO_POLICY
        if isinstance(chosen, str):
            await _refuse(ctx, name, raw, request.token, chosen)
            continue
        policy, check = chosen
        why = _guard(by_name.get(name))
        if why is None and name in busy:
            why = "a pod using GPUs runs on the node (the check would only wait for its GPUs)"
        if why is None and name in running:
            why = "a check runs on the node already"
        if why is not None:
            await _refuse(ctx, name, raw, request.token, why)
            continue
        limit = policies.resolve_check_max_concurrent(check, acting_nodes)
        if len(flying) + len(starts) >= limit:
            logger.info(
                "check request %s on node %s waits: %d checks run (maxConcurrent %d)",
                request.token,
                name,
                len(flying) + len(starts),
                limit,
            )
            continue
        await _remove(ctx, name)
        starts.append(
            (
                checks.Start(name, policy.name, check.name, check.template, check.timeout_seconds),
                request.token,
            )
        )
    return starts


async def _remove(ctx: context.Context, name: str) -> None:
    body = {"metadata": {"annotations": {keys.CHECK_NOW_ANNOTATION: None}}}
    try:
        ctx.cache.refresh_gpunode(await ctx.client.patch(gpunodes.gpunode_path(name), body), ctx.clock())
    except kube.ApiError as error:
        if not error.not_found:
            raise


async def _refuse(ctx: context.Context, name: str, raw: str, token: str, why: str) -> None:
    ctx.steps.check.refused[name] = raw
    await say_refused(ctx, name, token, why)
    try:
        await _remove(ctx, name)
    except kube.ApiError:
        logger.warning("removing the check request of node %s failed (will retry)", name, exc_info=True)


async def say_refused(ctx: context.Context, name: str, token: str, why: str) -> None:
    """The `CheckRefused` Event of a request (also of one taken that could not start after all: its
    annotation is gone already)."""
    logger.info("check request %s on node %s refused: %s", token, name, why)
    await ctx.recorder.emit_on(
        ctx.cache,
        name,
        vocabulary.EventReason.CHECK_REFUSED,
        f"Check request {token} on node {name} refused: {why}.",
        events.WARNING,
    )
