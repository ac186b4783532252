"""What the benchmarks share: the checkout, a control plane with the CRDs, process figures, the report.

The benchmarks are scripts run from the checkout (`python bench/X.py`): Python puts bench/ on the path,
so `import common` finds this module. Those that drive a real operator also import tests/support's
harness (`operator_harness`, `gpunode_facts`); the Makefile's bench targets put tests/support on
PYTHONPATH for them (bench/RESULTS.md's header), so no script edits sys.path.
"""

from __future__ import annotations

import json
import os
import platform
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import urllib3
from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from gpuhealth_api import keys
from gpuhealth_sim.controlplane import local

ROOT = Path(__file__).resolve().parent.parent
"""The checkout: crds/, examples/, bench/RESULTS.md."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""/proc's CPU times are in these per second."""
HEALTH_LABEL = keys.HEALTH_LABEL


def install_crds(plane: local.ControlPlane) -> None:
    """Apply the checkout's CRDs to `plane` and wait until the API server serves them."""
    crd_args = [a for p in sorted((ROOT / "crds").glob("*.yaml")) for a in ("-f", str(p))]
    plane.kubectl("apply", "--server-side", *crd_args)
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crd_args)


def children_cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by each direct child process of this one (control plane, operator), by
    command name."""
    me = os.getpid()
    result: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # the process ended between the listing and the read
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == me:
            result[name] = result.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return result


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg writes them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_line() -> str:
    """`machine: CPU model, N cores, Python X.Y.Z`: what a printed result ran on."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line),
        platform.processor(),
    )
    cores = len(re.findall("^processor", cpuinfo, re.M))
    return f"machine: {cpu}, {cores} cores, Python {platform.python_version()}"


def report(results: dict[str, Any], json_path: Path | None) -> None:
    """Print `results` as JSON, and write them to `json_path` too when given."""
    text = json.dumps(results, indent=2)
    print(text)
    if json_path:
        json_path.write_text(text + "\n")


def raw(response: object) -> urllib3.BaseHTTPResponse:
    """What a call made with `_preload_content=False` answers: urllib3's response, though the client's
    hints name the decoded model (a V1NodeList, ...)."""
    return cast(urllib3.BaseHTTPResponse, response)


def body(response: object) -> Any:
    """The decoded JSON of a call made with `_preload_content=False`."""
    return json.loads(raw(response).data)


def lines(response: object) -> Iterator[str]:
    """The lines of a watch made with `_preload_content=False`, as they arrive."""
    # kubernetes ships no hints for iter_resp_lines.
    stream: Iterator[str] = iter_resp_lines(response)  # type: ignore[no-untyped-call]
    return stream


def health_labelled(nodes: Iterable[client.V1Node]) -> int:
    """How many of `nodes` carry the operator's health label (any value): judged at least once."""
    return sum(1 for n in nodes if n.metadata is not None and (n.metadata.labels or {}).get(HEALTH_LABEL))


class Watcher(Protocol):
    """A benchmark's Node watch: when it saw a node unschedulable (None: schedulable now)."""

    def seen(self, name: str) -> float | None: ...


def uncordoned(watcher: Watcher, name: str) -> bool:
    """Whether `watcher` sees `name` schedulable again (a predicate for `waiting.wait_until`)."""
    return watcher.seen(name) is None
