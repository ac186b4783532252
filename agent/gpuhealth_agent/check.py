"""`gpu-health-agent check`: read the GPUs once and say, in plain words, what is wrong.

For a human at a node's shell (or a pre-flight script): a table with one row
per GPU and its problems, or `-o json` for the status the agent would report
plus a `verdict` (the health of the node and of each GPU, and the conditions
behind it). Exit codes (EXIT_CODES): 0 healthy (warnings included), 1 a fatal
fault, 2 a bad command line, 3 the GPUs could not be read, so `check &&
run-job` works and a script can tell a broken GPU from a broken agent.
Touches no cluster.

Every problem is one of the operator's conditions, judged by the same
predicates (`gpuhealth_api.faults`) with the catalogue's critical XIDs, so
`check` and a policy that lists no `xids` never give two answers to the same
facts (docs/conditions.md).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Final

from gpuhealth_agent import xids
from gpuhealth_api import conditions as condition_table
from gpuhealth_api import faults, status, vocabulary

HEALTHY_EXIT: Final = 0
FATAL_EXIT: Final = 1
USAGE_EXIT: Final = 2
CANNOT_READ_EXIT: Final = 3
"""The agent cannot judge the GPUs (NVML cannot start, `status.agent.error` such as no GPU visible, a
dcgm-exporter given but unreadable): neither healthy nor faulty."""
AGENT_ERROR_EXIT: Final = CANNOT_READ_EXIT
EXIT_CODES: Final = (
    "exit codes: 0 healthy (warnings included); 1 a fault (a fatal condition on a GPU or the node); "
    "2 usage (a bad command line or scenario file); 3 cannot read (NVML cannot start, no GPU visible, "
    "or the dcgm-exporter given cannot be found or read)"
)


class Severity(enum.StrEnum):
    FATAL = "fatal"
    """A fatal condition (`conditions.FATAL`): the node is Unhealthy, `check` exits 1."""
    WARNING = "warning"
    """Any other condition (thermal, power, PCIe): the node is Degraded."""
    INFO = "info"
    """An XID that is not critical: shown for the human, judged by no condition."""


SEVERITY_ORDER: Final = {s: i for i, s in enumerate(Severity)}
CONDITION_ORDER: Final = {c: i for i, c in enumerate(condition_table.gpu_checks(frozenset()))}


@dataclasses.dataclass(frozen=True)
class Problem:
    severity: Severity
    text: str
    condition: vocabulary.Condition | None = None
    """The operator's condition this problem is evidence of (the same `faults` predicate)."""

    def render(self) -> str:
        """`FATAL EccUncorrectable: 1 uncorrectable volatile ECC error`, `INFO XID 13 (...)`."""
        if self.condition is None:
            return f"{self.severity.upper()} {self.text}"
        return f"{self.severity.upper()} {self.condition}: {self.text}"


def _severity(condition: vocabulary.Condition) -> Severity:
    return Severity.FATAL if condition in condition_table.FATAL else Severity.WARNING


def _sort_key(problem: Problem) -> tuple[int, int]:
    rank = len(CONDITION_ORDER) if problem.condition is None else CONDITION_ORDER[problem.condition]
    return SEVERITY_ORDER[problem.severity], rank


def problems(gpu: status.GPUStatus, catalogue: xids.Catalogue) -> list[Problem]:
    """What is wrong with one GPU, worst first: the operator's conditions, judged by the same predicates.

    XidCritical acts on the catalogue's critical XIDs, as a policy without `xids`
    does; every XID is listed with its meaning and NVIDIA's action.
    """
    found: list[Problem] = []
    for condition, text in condition_table.gpu_faults(gpu, catalogue.critical).items():
        if condition is not vocabulary.Condition.XID_CRITICAL:  # one line per XID below
            found.append(Problem(_severity(condition), text, condition))
    critical = {x["code"] for x in faults.matching_xids(gpu, catalogue.critical)}
    for record in gpu.get("xids", []):
        info = catalogue.lookup(record["code"])
        times = f"{record['count']} time{'s' if record['count'] != 1 else ''}"
        text = (
            f"XID {info.code} ({info.description}) {times}, last {record['lastSeen']}; action: {info.action}"
        )
        if record["code"] in critical:
            found.append(Problem(Severity.FATAL, text, vocabulary.Condition.XID_CRITICAL))
        else:
            found.append(Problem(Severity.INFO, f"{text} (not critical)"))
    unreadable = gpu.get("unreadable", [])
    if unreadable:
        found.append(Problem(Severity.WARNING, f"NVML keeps failing to read {', '.join(unreadable)}"))
    found.sort(key=_sort_key)
    return found


def node_problems(node: status.GPUNodeStatus) -> list[Problem]:
    """Node-level faults: fewer GPUs reported than the node has (the agent's count; no Node labels here),
    and InfiniBand/RoCE ports the operator would judge NicDegraded on first sight (no history: a port
    down since before `check` ran is shown in the table, not judged, as a fresh operator would not)."""
    gpus = node.get("gpus", [])
    expected = faults.expected_gpu_count({}, None, faults.seen_by_agent(node))
    missing = faults.missing_gpus(len(gpus), expected)
    lost = vocabulary.Condition.GPU_LOST
    found = [] if missing is None else [Problem(_severity(lost), missing, lost)]
    nic = vocabulary.Condition.NIC_DEGRADED
    found += [Problem(_severity(nic), text, nic) for text in faults.nic_faults(node.get("nics"))]
    return found


def conditions(node: status.GPUNodeStatus, catalogue: xids.Catalogue) -> set[vocabulary.Condition]:
    """The operator's conditions the node's facts show, as `check` judges them."""
    found = node_problems(node) + [p for gpu in node.get("gpus", []) for p in problems(gpu, catalogue)]
    return {p.condition for p in found if p.condition is not None}


def has_fatal(node: status.GPUNodeStatus, catalogue: xids.Catalogue) -> bool:
    return bool(conditions(node, catalogue) & condition_table.FATAL)


def _cell(value: object, unit: str = "") -> str:
    return "-" if value is None else f"{value}{unit}"


def links_cell(gpu: status.GPUStatus) -> str:
    """`18/18` NVLinks up of all, with error counts when any (`16/18 crc 40`); `-` without NVLink."""
    nvlink = gpu.get("nvlink")
    if nvlink is None:
        return "-"
    up, down = nvlink.get("linksUp", 0), nvlink.get("linksDown", 0)
    counts = [
        f"{word} {nvlink[key]}"  # type: ignore[literal-required]
        for key, word in (("crcErrors", "crc"), ("replayErrors", "replay"), ("recoveryErrors", "recovery"))
        if nvlink.get(key)
    ]
    return " ".join([f"{up}/{up + down}", *counts])


def fabric_cell(gpu: status.GPUStatus) -> str:
    """`Completed` (with the status when it is not Success) and the clique; `-` where not supported."""
    fabric = gpu.get("fabric")
    if fabric is None:
        return "-"
    state = fabric.get("state", "?")
    said = state if fabric.get("status", "Success") == "Success" else f"{state}/{fabric.get('status')}"
    return f"{said} clique {fabric.get('cliqueId', '?')}"


def aer_cell(gpu: status.GPUStatus) -> str:
    """AER totals `fatal/nonFatal/correctable`; `-` where sysfs shows none."""
    aer = gpu.get("pcie", {}).get("aer")
    if aer is None:
        return "-"
    return "/".join(_cell(aer.get(k)) for k in ("fatal", "nonFatal", "correctable"))


def nic_lines(node: status.GPUNodeStatus) -> list[str]:
    """One line per InfiniBand/RoCE port, under the GPU table."""
    lines = []
    for nic in node.get("nics", []):
        rate = nic.get("rateGbps")
        lines.append(
            f"NIC {nic.get('name')} port {nic.get('port')}: {nic.get('state', '?')} "
            f"({nic.get('physState', '?')}), {_cell(rate, ' Gb/s')}, "
            f"link downed {_cell(nic.get('linkDowned'))}, "
            f"symbol errors {_cell(nic.get('symbolErrors'))}, rcv errors {_cell(nic.get('rcvErrors'))}"
        )
    return lines


def table(node: status.GPUNodeStatus, catalogue: xids.Catalogue) -> str:
    """A plain-text table, one row per GPU; problems joined with '; '; then one line per NIC port."""
    header = ("GPU", "UUID", "TEMP", "POWER", "SM CLOCK", "NVLINK", "FABRIC", "AER F/NF/C", "STATUS")
    rows: list[tuple[str, ...]] = []
    for gpu in node.get("gpus", []):
        found = problems(gpu, catalogue)
        verdict = "; ".join(p.render() for p in found) if found else "ok"
        clock = gpu.get("smClockMHz")
        max_clock = gpu.get("maxSmClockMHz")
        rows.append(
            (
                str(gpu["index"]),
                gpu.get("uuid", "-")[:12],
                _cell(gpu.get("temperatureCelsius"), "C"),
                _cell(gpu.get("powerWatts"), "W"),
                f"{_cell(clock)}/{_cell(max_clock)} MHz" if clock is not None else "-",
                links_cell(gpu),
                fabric_cell(gpu),
                aer_cell(gpu),
                verdict,
            )
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]))
    agent = node.get("agent", {})
    summary = node.get("summary", {})
    expected = agent.get("expectedGpuCount")
    head = (
        f"{summary.get('gpuCount', 0)} GPU(s) answering"
        + (f" of {expected} expected" if expected is not None else "")
        + f", model {summary.get('model', 'unknown')}, driver {agent.get('driverVersion', 'unknown')}"
        + f", backend {agent.get('backend', '?')}"
    )
    error = agent.get("error")
    said = [f"AGENT ERROR {error.get('reason')}: {error.get('message')}"] if error else []
    return (
        "\n".join([head, *said, *(p.render() for p in node_problems(node)), *lines, *nic_lines(node)]) + "\n"
    )


def _health(found: list[Problem]) -> vocabulary.Health:
    """As the operator judges a node: a fatal condition is Unhealthy, any other condition Degraded."""
    judged = {p.condition for p in found if p.condition is not None}
    if judged & condition_table.FATAL:
        return vocabulary.Health.UNHEALTHY
    return vocabulary.Health.DEGRADED if judged else vocabulary.Health.HEALTHY


def _said(found: list[Problem]) -> list[dict[str, str]]:
    return [
        {"severity": str(p.severity), "text": p.text}
        | ({"condition": str(p.condition)} if p.condition else {})
        for p in found
    ]


def _conditions(found: list[Problem]) -> list[str]:
    return sorted({str(p.condition) for p in found if p.condition is not None})


def exit_code(node: status.GPUNodeStatus, catalogue: xids.Catalogue, cannot_read: str | None = None) -> int:
    """1 on any fatal fault (what was read is enough); else 3 when the agent could not judge the GPUs
    or a source it was given (`cannot_read`: the dcgm-exporter) could not be read; else 0."""
    if has_fatal(node, catalogue):
        return FATAL_EXIT
    unread = cannot_read or node.get("agent", {}).get("error")
    return CANNOT_READ_EXIT if unread else HEALTHY_EXIT


def verdict(
    node: status.GPUNodeStatus, catalogue: xids.Catalogue, cannot_read: str | None = None
) -> dict[str, object]:
    """`-o json`'s answer: health and conditions of the node and of each GPU, by the table's predicates.

    The node's health is Unknown when the agent could not judge the GPUs (as the operator judges
    an AgentError) and no fatal fault is seen anyway.
    """
    per_gpu = [(gpu, problems(gpu, catalogue)) for gpu in node.get("gpus", [])]
    on_node = node_problems(node)
    everything = on_node + [p for _, found in per_gpu for p in found]
    code = exit_code(node, catalogue, cannot_read)
    health = vocabulary.Health.UNKNOWN if code == CANNOT_READ_EXIT else _health(everything)
    error = node.get("agent", {}).get("error")
    return {
        "health": str(health),
        "exitCode": code,
        "conditions": _conditions(everything),
        "problems": _said(on_node),
        **({"cannotRead": cannot_read} if cannot_read else {}),
        **({"agentError": {"reason": error.get("reason"), "message": error.get("message")}} if error else {}),
        "gpus": [
            {
                "index": gpu["index"],
                "uuid": gpu.get("uuid"),
                "health": str(_health(found)),
                "conditions": _conditions(found),
                "problems": _said(found),
            }
            for gpu, found in per_gpu
        ],
    }


def render(
    node: status.GPUNodeStatus, catalogue: xids.Catalogue, output: str, cannot_read: str | None = None
) -> tuple[int, str]:
    """The text to print and the exit code (`exit_code`); `cannot_read` says which source failed."""
    code = exit_code(node, catalogue, cannot_read)
    if output == "json":
        answer = {**node, "verdict": verdict(node, catalogue, cannot_read)}
        return code, json.dumps(answer, indent=2, sort_keys=True) + "\n"
    text = table(node, catalogue)
    return code, text if cannot_read is None else f"CANNOT READ {cannot_read}\n{text}"
