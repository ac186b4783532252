"""`gpu-health-agent check`: read the GPUs once and say, in plain words, what is wrong.

For a human at a node's shell (or a pre-flight script): a table with one row
per GPU and its problems, or `-o json` for exactly the status the agent would
report. Exit code 1 when any GPU has a fatal fault, so `check && run-job`
works. Touches no cluster.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Final

from gpuhealth_agent import changes, xids
from gpuhealth_api import status

FATAL_EXIT: Final = 1
SEVERITY_ORDER: Final = {s: i for i, s in enumerate(xids.Severity)}


@dataclasses.dataclass(frozen=True)
class Problem:
    severity: xids.Severity
    text: str


def problems(gpu: status.GPUStatus, catalogue: xids.Catalogue) -> list[Problem]:
    """What is wrong with one GPU, worst first."""
    found: list[Problem] = []
    fatal, critical, warning = xids.Severity.FATAL, xids.Severity.CRITICAL, xids.Severity.WARNING
    if gpu.get("lost", False):
        found.append(Problem(fatal, "GPU lost: fell off the bus or is missing (not answering NVML)"))
    ecc = gpu.get("ecc", {})
    if ecc.get("uncorrectedVolatile", 0) > 0:
        found.append(
            Problem(fatal, f"{ecc['uncorrectedVolatile']} uncorrectable ECC error(s) since the last reset")
        )
    rows = gpu.get("remappedRows", {})
    if rows.get("failure", False):
        found.append(Problem(fatal, "row remapping failed: memory cannot be repaired, replace the GPU"))
    if rows.get("pending", False):
        found.append(Problem(fatal, "a row remap is pending: reset the GPU to activate it"))
    pages = gpu.get("retiredPages", {})
    if pages.get("pending", False):
        found.append(Problem(critical, "a retired page is pending: reset the GPU to retire it"))
    action = gpu.get("recoveryAction")
    if action is not None and action != "None":
        found.append(Problem(fatal, f"the driver asks for recovery: {action}"))
    for record in gpu.get("xids", []):
        info = catalogue.lookup(record["code"])
        times = f"{record['count']} time{'s' if record['count'] != 1 else ''}"
        found.append(
            Problem(
                info.severity,
                f"XID {info.code} ({info.description}) {times}, last {record['lastSeen']}; "
                f"action: {info.action}",
            )
        )
    reasons = changes.throttle_reasons(gpu)
    thermal = sorted(set(reasons) & status.THERMAL_REASONS)
    hot = changes.is_hot(gpu)
    if thermal or hot:
        temperature = gpu.get("temperatureCelsius")
        limit = gpu.get("slowdownTemperatureCelsius")
        why = ", ".join(thermal) if thermal else "at the slowdown temperature"
        found.append(Problem(warning, f"thermal slowdown ({why}; {temperature}°C, slows down at {limit}°C)"))
    power = sorted(set(reasons) & status.POWER_REASONS - status.THERMAL_REASONS)
    if power:
        found.append(Problem(warning, f"hardware slowdown ({', '.join(power)})"))
    pcie = gpu.get("pcie", {})
    generation, max_generation = pcie.get("generation"), pcie.get("maxGeneration")
    width, max_width = pcie.get("width"), pcie.get("maxWidth")
    if (generation is not None and max_generation is not None and generation < max_generation) or (
        width is not None and max_width is not None and width < max_width
    ):
        found.append(
            Problem(
                warning,
                f"PCIe link degraded: Gen{generation} x{width} (max Gen{max_generation} x{max_width})",
            )
        )
    found.sort(key=lambda p: SEVERITY_ORDER[p.severity])
    return found


def has_fatal(node: status.GPUNodeStatus, catalogue: xids.Catalogue) -> bool:
    return any(
        p.severity is xids.Severity.FATAL for gpu in node.get("gpus", []) for p in problems(gpu, catalogue)
    )


def _cell(value: object, unit: str = "") -> str:
    return "-" if value is None else f"{value}{unit}"


def table(node: status.GPUNodeStatus, catalogue: xids.Catalogue) -> str:
    """A plain-text table, one row per GPU; problems joined with '; '."""
    header = ("GPU", "UUID", "TEMP", "POWER", "SM CLOCK", "STATUS")
    rows: list[tuple[str, ...]] = []
    for gpu in node.get("gpus", []):
        found = problems(gpu, catalogue)
        verdict = "; ".join(f"{p.severity.upper()}: {p.text}" for p in found) if found else "ok"
        clock = gpu.get("smClockMHz")
        max_clock = gpu.get("maxSmClockMHz")
        rows.append(
            (
                str(gpu["index"]),
                gpu.get("uuid", "-")[:12],
                _cell(gpu.get("temperatureCelsius"), "C"),
                _cell(gpu.get("powerWatts"), "W"),
                f"{_cell(clock)}/{_cell(max_clock)} MHz" if clock is not None else "-",
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
    return "\n".join([head, *lines]) + "\n"


def render(node: status.GPUNodeStatus, catalogue: xids.Catalogue, output: str) -> tuple[int, str]:
    """The text to print and the exit code (1 on any fatal fault)."""
    code = FATAL_EXIT if has_fatal(node, catalogue) else 0
    if output == "json":
        return code, json.dumps(node, indent=2, sort_keys=True) + "\n"
    return code, table(node, catalogue)
