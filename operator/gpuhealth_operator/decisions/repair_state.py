"""Repair's pure state: a cycle in progress as the Node's annotation holds it (`State`, `parse`,
`render`), the deterministic Job names and the token, and which step comes next for which GPUs.

Split from `decisions/repair.py` (issue 46), which names everything here again (`repair.State` is
this `State`): the cycle's rules, what a Job and a report mean, the history, build on it.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import model, step_kinds, times

RepairAction = vocabulary.RepairAction
Result = vocabulary.RepairResult

HISTORY_LIMIT: Final = 20
"""GPUNode `status.repairs[]` keeps the last this many entries."""
JOB_PREFIX: Final = "gpuhealth-repair-"
NODE_PART: Final = 28
MAX_NAME: Final = 63
REBOOT_GRACE_SECONDS: Final = 30.0
"""A failed RebootNode Job fails its step once the agent reports this long after it without a new boot."""


class Phase(enum.StrEnum):
    STEP = "step"
    VALIDATE = "validate"


FAULT_CHARS: Final = 1024
"""A history entry's `fault` is at most this long (the CRD's maxLength)."""
PREVIOUS_MESSAGE: Final = 256
"""The previous phase's message is kept this long on the Node (the history keeps 4096)."""


@dataclasses.dataclass(frozen=True)
class Refused:
    """A policy's repair Job create refused by the Job API (403/404, `repair_permission`): the API
    server's words, when it was last tried, whether it was said already."""

    message: str
    at: datetime.datetime
    said: bool


@dataclasses.dataclass(frozen=True)
class Done:
    """How the phase before a state ended (its history entry, dated the state's `since`), written on the
    Node with the state: a leader that dies before its status write leaves it for the next one to record."""

    step: str
    action: str
    result: Result
    message: str


@dataclasses.dataclass(frozen=True)
class State:
    """The cycle in progress on a node (the Node annotation)."""

    policy: str
    cycle: int
    step: int
    """Index into `spec.repair.steps` of the step running, or validated (phase validate)."""
    phase: Phase
    since: datetime.datetime
    """When this phase began (its Job's creation): its timeout counts from here."""
    gpus: tuple[str, ...]
    boot_id: str | None
    """The agent's bootId when the step began: a RebootNode's effect is another one."""
    job: str
    started: datetime.datetime | None = None
    """When the cycle began (its first step), for the cycle's duration."""
    token: str | None = None
    """SHA-256 (hex) of the token its Job carries (`keys.REPAIR_TOKEN_ANNOTATION`); None: written by an
    operator before tokens, whose Job is known by its cycle stamp alone."""
    previous: Done | None = None
    """How this cycle's phase before this one ended (None: this is its first)."""
    fault: str = ""
    """The issues that began the cycle (comma-joined conditions), for its history."""


def parse(text: str | None) -> State | None:
    """The annotation's state; None when absent or unreadable (a hand-edited value is not trusted)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        since = times.parse(raw["since"])
        if since is None or not isinstance(raw["policy"], str) or not isinstance(raw["job"], str):
            return None
        cycle, step = raw["cycle"], raw["step"]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (cycle, step)):
            return None
        gpus = raw.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, str) for g in gpus):
            return None
        boot_id = raw.get("bootId")
        token = raw.get("jobToken")
        fault = raw.get("fault")
        return State(
            fault=fault[:FAULT_CHARS] if isinstance(fault, str) else "",
            previous=_done(raw.get("previous")),
            policy=raw["policy"],
            cycle=cycle,
            step=step,
            phase=Phase(raw["phase"]),
            since=since,
            gpus=tuple(gpus),
            boot_id=boot_id if isinstance(boot_id, str) and boot_id else None,
            job=raw["job"],
            started=times.parse(raw.get("started")) or since,
            token=token if isinstance(token, str) and token else None,
        )
    except (ValueError, KeyError, TypeError):
        return None


def _done(raw: object) -> Done | None:
    if not isinstance(raw, Mapping):
        return None
    step, action, message = (raw.get(k) for k in ("step", "action", "message"))
    if not all(isinstance(v, str) for v in (step, action, message)):
        return None
    try:
        result = Result(str(raw.get("result")))
    except ValueError:
        return None
    return Done(str(step), str(action), result, str(message))


def render(state: State) -> str:
    body: dict[str, Any] = {
        "policy": state.policy,
        "cycle": state.cycle,
        "step": state.step,
        "phase": state.phase.value,
        "since": times.render(state.since),
        "gpus": list(state.gpus),
        "bootId": state.boot_id or "",
        "job": state.job,
        "started": times.render(state.started or state.since),
    }
    if state.token:
        body["jobToken"] = state.token
    if state.fault:
        body["fault"] = state.fault[:FAULT_CHARS]
    if state.previous is not None:
        done = state.previous
        body["previous"] = {
            "step": done.step,
            "action": done.action,
            "result": done.result.value,
            "message": done.message[:PREVIOUS_MESSAGE],
        }
    return json.dumps(body, separators=(",", ":"))


def job_name(node: str, cycle: int, step: int, *, validation: bool = False) -> str:
    """`gpuhealth-repair-<node[:28]>-<sha1(node)[:6]>-c<cycle>-<step|v<step>>`: deterministic, <= 63.

    The node part is lowercased with dots as dashes (a Job name is a label value of its pods); the hash
    keeps two long node names with the same first 28 characters apart.
    """
    digest = hashlib.sha1(node.encode(), usedforsecurity=False).hexdigest()[:6]
    tail = f"-{digest}-c{cycle}-{'v' if validation else ''}{step}"
    room = MAX_NAME - len(JOB_PREFIX) - len(tail)
    part = node.lower().replace(".", "-")[: max(0, min(NODE_PART, room))].strip("-")
    name = f"{JOB_PREFIX}{part}{tail}" if part else f"{JOB_PREFIX.rstrip('-')}{tail}"
    return name[:MAX_NAME]


def cycle_stamp(state: State) -> str:
    """The cycle's start as its Jobs carry it (`keys.REPAIR_CYCLE_STARTED_ANNOTATION`)."""
    return times.render(state.started or state.since)


def token_digest(token: str) -> str:
    """What the Node's repair annotation keeps of a Job's token: its SHA-256, which cannot be turned back."""
    return hashlib.sha256(token.encode()).hexdigest()


def belongs(job: Mapping[str, Any], state: State) -> bool:
    """Whether a Job of the state's name is this operator's Job of this state: it carries the cycle's start
    stamp and the token whose hash the state holds. A Job of the same name from an earlier life of the
    node (a recreated GPUNode restarts cycle numbers) is not, nor one that only copies the name and the
    stamp (both readable on the Node): anyone who can create Jobs in the namespace can make one of
    those, but not one with the token, which exists only in our Job. A state written before tokens
    (`token` None) knows its Job by the stamp alone."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    stamped = annotations.get(keys.REPAIR_CYCLE_STARTED_ANNOTATION)
    if not isinstance(stamped, str) or times.parse(stamped) != (state.started or state.since):
        return False
    if state.token is None:
        return True
    token = annotations.get(keys.REPAIR_TOKEN_ANNOTATION)
    return isinstance(token, str) and hmac.compare_digest(token_digest(token), state.token)


def next_step(spec: model.RepairSpec, start: int, gpus: Sequence[str]) -> int | None:
    """The first step at or after `start` that applies: ResetGPU only with faulty GPU UUIDs known."""
    for index in range(start, len(spec.steps)):
        if step_kinds.of(spec.steps[index].action).targets is step_kinds.Targets.FAULTY_GPUS and not gpus:
            continue
        return index
    return None


def first_step(spec: model.RepairSpec, gpus: Sequence[str], recovery: Iterable[str]) -> int | None:
    """The step a cycle starts at: the policy's first RebootNode step when any GPU's driver asks for a
    reboot (`recovery`: the GPUs' `recoveryAction`s), its first applicable ResetGPU step when one asks
    for a reset, else (no request, or no such step) the first step that applies. The steps after it
    follow in the policy's order."""
    wanted = step_kinds.asked_for(set(recovery))
    if wanted is not None:
        for index in range(len(spec.steps)):
            if spec.steps[index].action is wanted and next_step(spec, index, gpus) == index:
                return index
    return next_step(spec, 0, gpus)


def reset_together(
    faulty: Sequence[tuple[int | None, str]], listed: Sequence[Mapping[str, Any]]
) -> list[tuple[int | None, str]]:
    """The (index, UUID) of the GPUs a ResetGPU step resets, by index.

    On an NVSwitch board (HGX) a GPU cannot be reset alone: the driver resets the board's GPUs, with its
    NVSwitches, together. A faulty GPU that reports fabric info (`gpus[].fabric`: the agent reports it only
    where NVML supports it, NVSwitch and NVL systems) is on such a board, and every listed GPU with fabric
    info of the same clique (`fabric.cliqueId`; where either lacks one, the node's fabric as a whole) joins
    the reset. Elsewhere (PCIe GPUs, or a faulty GPU the listing lacks) the faulty GPUs alone."""
    by_uuid = {g.get("uuid"): g for g in listed if isinstance(g.get("uuid"), str)}
    chosen = {uuid: index for index, uuid in faulty}
    for _, uuid in faulty:
        fabric = (by_uuid.get(uuid) or {}).get("fabric")
        if not isinstance(fabric, Mapping):
            continue
        clique = fabric.get("cliqueId")
        for other in listed:
            theirs = other.get("fabric")
            if not isinstance(theirs, Mapping) or not isinstance(other.get("uuid"), str):
                continue
            other_clique = theirs.get("cliqueId")
            if clique is None or other_clique is None or other_clique == clique:
                index = other.get("index")
                chosen.setdefault(other["uuid"], index if isinstance(index, int) else None)
    return sorted(((i, u) for u, i in chosen.items()), key=lambda g: (g[0] is None, g[0] or 0, g[1]))
