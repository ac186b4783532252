#!/usr/bin/env python3
"""How many times one node's pass moves between the operator's modules (issue 46's measure).

Usage: hack/pass_stays.py [healthy|dbe|draining ...] [--trace]

The measure. One node's pass is one call of `runtime/passes.py:run_one`,
from its entry to its return, followed through every call it makes. A
*stay* is a maximal run of execution inside one module: each time control
moves from a function of module A into (or back to) a function of module
B != A, a new stay begins. Only modules under `gpuhealth_operator` count; a
function is a module's when its code is in that module's source file.
Everything else (the standard library, kopf, gpuhealth_api, generated code
such as a dataclass's `__init__`, C functions) is transparent: a call from A
through a library back into A continues A's stay, and a call from A through
a library into B begins B's. A coroutine that suspends and is resumed
(an `await` that yields to the event loop) moves nothing: its stay goes on.
*Modules* is how many distinct modules the pass stayed in, and *returns to
a module already visited* how many stays are in a module seen before in the
same pass (stays = modules + returns).

No pass can stay fewer than 2 x modules - 1 times (printed as *least for its
modules*): every module but run_one's is first entered by a call from another
module, and when that call returns a new stay of the caller begins, so each
module visited adds at least two stays to the first. A pass that visits each
module once is a call tree at exactly that bound; what the pass takes above
it is control coming back to a module it has already left.

The fleet: 20 nodes of 8 healthy GPUs under examples/default-policy.yaml,
replayed as the backtest replays a trace (`gpuhealth_sim.backtest.replayer`:
the operator's replay entry point over the in-memory cluster, its timer
every 30 s of simulated time), every agent reporting each minute. After
ten minutes at rest, node n00's pass is traced for one of three cases:

- healthy: a healthy heartbeat of a node at rest;
- dbe: a report with a double-bit ECC error (the `ecc` rule: cordon, and the
  drain begins);
- draining: the next report of that node while its drain runs (a trace has
  no pods; the in-memory cluster's drain ends when the operator observes it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import dis
import inspect
import pathlib
import sys
import types
from collections.abc import Iterator
from typing import Any, Final

import gpuhealth_operator
from gpuhealth_operator.runtime import passes
from gpuhealth_sim.backtest import replayer

REPO: Final = pathlib.Path(__file__).resolve().parents[1]
POLICY: Final = REPO / "examples" / "default-policy.yaml"
START: Final = datetime.datetime(2026, 1, 5, tzinfo=datetime.UTC)
NODES: Final = tuple(f"n{i:02d}" for i in range(20))
TRACED: Final = NODES[0]
REST_MINUTES: Final = 10
CASES: Final = ("healthy", "dbe", "draining")
PACKAGE_DIR: Final = str(pathlib.Path(gpuhealth_operator.__file__).resolve().parent)
_YIELD: Final = dis.opmap["YIELD_VALUE"]
_COROUTINE: Final = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR


@dataclasses.dataclass
class Stays:
    """The modules one pass stayed in, in order (one entry per stay)."""

    case: str
    sequence: list[str] = dataclasses.field(default_factory=list)

    @property
    def stays(self) -> int:
        return len(self.sequence)

    @property
    def modules(self) -> int:
        return len(set(self.sequence))

    @property
    def returns(self) -> int:
        """Stays in a module already visited in this pass."""
        return self.stays - self.modules

    @property
    def least(self) -> int:
        """The fewest stays any pass over this many modules can take (the module docstring says why)."""
        return 2 * self.modules - 1

    def line(self) -> str:
        return (
            f"{self.case}: stays {self.stays}, modules {self.modules}, "
            f"returns to a module already visited {self.returns}, least for its modules {self.least}"
        )


class Tracer:
    """A `sys.setprofile` function that records the stays of the first `run_one` over `node` it sees."""

    def __init__(self, stays: Stays, node: str) -> None:
        self.stays = stays
        self.node = node
        self.root: types.FrameType | None = None
        self.done = False
        self._modules: dict[str, str | None] = {}

    def __call__(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event not in ("call", "return") or self.done:
            return
        if self.root is None:
            if event == "call" and frame.f_code is passes.run_one.__code__ and self._asked(frame.f_locals):
                self.root = frame
                self._enter(self._module_at(frame))
            return
        coroutine = bool(frame.f_code.co_flags & _COROUTINE)
        if event == "call":
            if not (coroutine and _resumed(frame)):
                self._enter(self._module_at(frame))
        elif not (coroutine and _yielding(frame)):
            if frame is self.root:
                self.done = True
                sys.setprofile(None)
            elif frame.f_back is not None:
                self._enter(self._module_at(frame.f_back))

    def _asked(self, arguments: dict[str, Any]) -> bool:
        """Whether a `run_one` is the pass of the traced node asked by its report."""
        ask = arguments.get("ask")
        return arguments.get("name") == self.node and getattr(ask, "handler", None) == "gpunode"

    def _enter(self, module: str | None) -> None:
        sequence = self.stays.sequence
        if module is not None and (not sequence or sequence[-1] != module):
            sequence.append(module)

    def _module_at(self, frame: types.FrameType | None) -> str | None:
        """The operator module whose function runs innermost at `frame` (None: none of its)."""
        while frame is not None:
            module = self._module_of(frame.f_code.co_filename)
            if module is not None:
                return module
            frame = frame.f_back
        return None

    def _module_of(self, filename: str) -> str | None:
        if filename not in self._modules:
            path = pathlib.Path(filename)
            inside = filename.startswith(PACKAGE_DIR) and path.suffix == ".py"
            parts = path.resolve().relative_to(PACKAGE_DIR).with_suffix("").parts if inside else ()
            self._modules[filename] = ".".join(parts) if parts else None
        return self._modules[filename]


def _resumed(frame: types.FrameType) -> bool:
    """Whether a coroutine frame's `call` resumes it after a yield (not its first start)."""
    return frame.f_lasti >= 2 and frame.f_code.co_code[frame.f_lasti - 2] == _YIELD


def _yielding(frame: types.FrameType) -> bool:
    """Whether a coroutine frame's `return` is a suspension (a yield), not its end."""
    return frame.f_lasti >= 0 and frame.f_code.co_code[frame.f_lasti] == _YIELD


def _stamp(t: float) -> str:
    return (START + datetime.timedelta(seconds=t)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _gpu(index: int, dbe: bool) -> dict[str, Any]:
    """One GPU as the agent reports it: healthy, or with a double-bit ECC error."""
    zeros = ("correctedVolatile", "uncorrectedVolatile", "correctedAggregate", "uncorrectedAggregate")
    ecc = dict.fromkeys(zeros, 0) | ({"uncorrectedVolatile": 1} if dbe else {})
    pcie = {"generation": 5, "maxGeneration": 5, "width": 16, "maxWidth": 16, "replayCounter": 0}
    return {
        "index": index,
        "uuid": f"GPU-{index:08d}-stays",
        "model": "NVIDIA H100 80GB HBM3",
        "pciBusId": f"00000000:{index + 16:02X}:00.0",
        **{"temperatureCelsius": 40, "slowdownTemperatureCelsius": 90, "powerWatts": 310.0},
        **{"smClockMHz": 1980, "maxSmClockMHz": 1980, "utilizationPercent": 90},
        "ecc": ecc,
        "retiredPages": {"doubleBit": 0, "pending": False},
        "remappedRows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False},
        **{"xids": [], "clockEventReasons": [], "recoveryAction": "None", "pcie": pcie, "lost": False},
        "observedTime": _stamp(0),
    }


def _report(name: str, t: float, dbe: bool = False) -> dict[str, Any]:
    agent = {"version": "stays", "backend": "sim", "driverVersion": "570.124.06", "expectedGpuCount": 8}
    status = {
        "agent": {**agent, "lastHeartbeatTime": _stamp(t), "heartbeatSeconds": 60},
        "summary": {"gpuCount": 8, "model": "NVIDIA H100 80GB HBM3", "maxTemperatureCelsius": 40},
        "gpus": [_gpu(i, dbe and i == 0) for i in range(8)],
    }
    return {"kind": "gpunode", "t": t, "name": name, "status": status}


def _records(case: str, tracer: Tracer) -> Iterator[dict[str, Any]]:
    """The fleet's trace; the tracer is armed just before the traced report."""
    for name in NODES:
        node = {
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
            "spec": {"unschedulable": False},
            "status": {"capacity": {"nvidia.com/gpu": "8"}},
        }
        yield {"kind": "node", "t": 0, "object": node}
    minute = 0
    for minute in range(REST_MINUTES):
        for i, name in enumerate(NODES):
            yield _report(name, minute * 60 + i + 1)
    t = (minute + 1) * 60 + 1.0
    if case == "draining":
        yield _report(TRACED, t, dbe=True)
        t += 60
    sys.setprofile(tracer)
    yield _report(TRACED, t, dbe=case != "healthy")
    sys.setprofile(None)


def measure(case: str) -> Stays:
    """The stays of node n00's pass in `case` (one of CASES)."""
    if case not in CASES:
        raise ValueError(f"unknown case {case!r}: one of {', '.join(CASES)}")
    stays = Stays(case)
    tracer = Tracer(stays, TRACED)
    replay = replayer.Replay(replayer.load_policy(POLICY), START.timestamp(), 30.0)
    asyncio.run(replay.run(_records(case, tracer)))
    if not tracer.done:
        raise RuntimeError(f"{case}: no pass of node {TRACED} ran for the traced report")
    return stays


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cases", nargs="*", metavar="case", help=f"of {', '.join(CASES)} (default: all)")
    parser.add_argument("--trace", action="store_true", help="print each pass's module sequence")
    args = parser.parse_args(argv)
    for case in args.cases or CASES:
        stays = measure(case)
        print(stays.line())
        if args.trace:
            for index, module in enumerate(stays.sequence, 1):
                print(f"  {index:4d} {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
