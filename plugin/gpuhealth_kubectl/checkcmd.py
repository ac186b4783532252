"""`kubectl gpuhealth check NODE`: ask the operator for an active check now and wait for its result.

The request is the GPUNode annotation `keys.CHECK_NOW_ANNOTATION` (JSON `{"id": TOKEN, "check": T}`), a
fresh token each time. The operator starts the check under every guard of a scheduled one, removes the
annotation, and records the run with the token (`status.checks[].requestId`), or refuses it with a
`CheckRefused` Event naming the token. This polls for either until `--timeout` (a poll, not a watch:
the two live in different objects, and `get`/`list` are all the on-call role needs).

On timeout a request the operator has not taken yet is withdrawn (a check must not start long after
the person who asked stopped waiting); one it took runs to its end and shows in `why`.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from collections.abc import Callable
from typing import Any, Final

from gpuhealth_api import keys
from gpuhealth_kubectl import checkviews, cluster

DEFAULT_TIMEOUT: Final = 1800.0
"""Seconds `check` waits by default: longer than DcgmDiag's own timeout (`-r 2` takes minutes)."""
POLL_SECONDS: Final = 1.0

Result = tuple[dict[str, Any], str]


class Refused(Exception):
    """The command cannot do what was asked (no such GPUNode): one line, exit 1."""


class NoResult(Exception):
    """No result within the timeout: one line, exit 1."""


def timeout(text: str) -> float:
    """`--timeout` as seconds > 0 (argparse type: a ValueError is its usage error)."""
    seconds = float(text)
    if not seconds > 0:
        raise ValueError(text)
    return seconds


def add_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    check = commands.add_parser(
        "check",
        parents=[common],
        help="run an active check on a node now (under the operator's guards) and show its result",
    )
    check.add_argument("node", metavar="NODE")
    check.add_argument(
        "--template",
        help="the check to run: a check name or template of a policy (default: the node's first)",
    )
    check.add_argument(
        "--timeout",
        type=timeout,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for the result (default {DEFAULT_TIMEOUT:g})",
    )
    check.add_argument("--no-wait", action="store_true", help="ask and return at once: see `why NODE` later")


def run_check(
    kube: cluster.Cluster,
    args: argparse.Namespace,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Result, int]:
    """Request the check, wait for its end; the report, its text and the exit code (0 passed, else 1)."""
    node = args.node
    if kube.gpunode(node) is None:
        raise Refused(f"no GPUNode named {node!r}: a check needs a node an agent reports on")
    token = secrets.token_hex(8)
    request: dict[str, str] = {"id": token}
    if args.template:
        request["check"] = args.template
    value = json.dumps(request, sort_keys=True)
    kube.annotate_gpunode(node, {keys.CHECK_NOW_ANNOTATION: value})
    if args.no_wait:
        text = (
            f"Check requested on {node} (request {token}, annotation {keys.CHECK_NOW_ANNOTATION}).\n"
            f"  result: kubectl gpuhealth why {node}\n"
        )
        return ({"node": node, "requestId": token, "result": None}, text), 0
    deadline = clock() + args.timeout
    while True:
        outcome = checkviews.request_outcome(kube.gpunode(node), kube.events(node), token)
        if outcome is not None:
            report = {"node": node, "requestId": token, **outcome}
            return (report, checkviews.render_outcome(node, outcome)), checkviews.exit_code(outcome)
        if clock() >= deadline:
            break
        sleep(POLL_SECONDS)
    withdrawn = _withdraw(kube, node, value)
    said = (
        "the request was not taken up and is withdrawn"
        if withdrawn
        else f"the check may still run: kubectl gpuhealth why {node}"
    )
    raise NoResult(f"no result within {args.timeout:g}s for check request {token} on {node}: {said}")


def _withdraw(kube: cluster.Cluster, node: str, value: str) -> bool:
    """Remove our request where it is still there (the operator has not taken it). True if removed."""
    meta = (kube.gpunode(node) or {}).get("metadata") or {}
    if (meta.get("annotations") or {}).get(keys.CHECK_NOW_ANNOTATION) != value:
        return False
    try:
        kube.annotate_gpunode(
            node, {keys.CHECK_NOW_ANNOTATION: None}, resource_version=meta.get("resourceVersion")
        )
    except cluster.ApiError as error:
        if error.status == 409:  # changed since the read: the operator may have taken it just now
            return False
        raise
    return True
