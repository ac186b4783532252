"""`gpu-health-agent check --probe`: what this node's NVML answers, and what reading it costs.

A user runs it once on a GPU node before installing the agent. It is read-only by construction: it
goes through `ReadOnly`, a Library wrapper that lets through only NVML's getters, event waits and
init/shutdown, and refuses anything else (a reset, a clock, power, ECC or MIG mode change) before it
reaches the driver. It

1. asks every fact's NVML function once per GPU (the agent's own calls, `nvml.call`, with its
   fallbacks to older names) plus NVLink, fabric info and event registration, and classifies each
   answer: `supported`, `not supported` (NotSupported, FunctionNotFound, NoPermission: the agent
   leaves the field out) or `error` (anything else: the agent would report the field unreadable);
2. runs the agent's collector for N seconds at the agent's interval (every fact, slow tier included),
   counting NVML calls per function, and reports calls per GPU per second and the CPU they cost.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any, Final

from gpuhealth_agent import collector, events, facts, links, nvml

READ_ONLY_PREFIXES: Final = ("nvmlDeviceGet", "nvmlSystemGet", "nvmlEventSet")
READ_ONLY_NAMES: Final = frozenset(
    {"nvmlInit", "nvmlShutdown", "nvmlDeviceRegisterEvents", "nvmlErrorString"}
)


class NotReadOnly(RuntimeError):
    """The probe was about to call an NVML function that changes the GPU: refused, never called."""


def read_only(function: str) -> bool:
    """Whether an NVML function only reads (getters, event waits, init/shutdown)."""
    return function in READ_ONLY_NAMES or function.startswith(READ_ONLY_PREFIXES)


class ReadOnly:
    """A Library that passes only read-only functions through, counting each call and its errors."""

    def __init__(self, lib: nvml.Library, perf_counter: Callable[[], float] = time.perf_counter) -> None:
        self.wrapped = lib
        self.calls: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[tuple[str, str]] = collections.Counter()
        self.perf_counter = perf_counter

    def __getattr__(self, name: str) -> Any:
        if not read_only(name):
            raise NotReadOnly(f"the probe never calls {name} (it changes the GPU or the driver)")
        target = getattr(self.wrapped, name)
        if not callable(target):
            return target

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            try:
                return target(*args, **kwargs)
            except nvml.NVMLError as exc:
                self.errors[(name, nvml.error_name(exc))] += 1
                raise

        self.__dict__[name] = counted
        return counted


@dataclasses.dataclass(frozen=True)
class Answer:
    field: str
    """The status field (`ecc.uncorrectedVolatile`, `nvlink`, `fabric`, `events`)."""
    function: str
    result: str
    """supported | not supported | error"""
    detail: str = ""
    """The error names, with how many GPUs gave each, when not every GPU answered."""


@dataclasses.dataclass(frozen=True)
class Report:
    driver_version: str | None
    gpus: int
    models: list[str]
    answers: list[Answer]
    seconds: float
    samples: int
    calls: dict[str, int]
    first_sample_calls: int
    """Calls of the first sample, which also discovers (links, static facts)."""
    calls_per_gpu_per_second: float | None
    """After the first sample: the agent's steady NVML traffic (None: one sample only)."""
    cpu_seconds: float
    millicpu: float
    errors: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {
            "driverVersion": self.driver_version,
            "gpus": self.gpus,
            "models": self.models,
            "fields": [dataclasses.asdict(a) for a in self.answers],
            "sampling": {
                "seconds": round(self.seconds, 3),
                "samples": self.samples,
                "nvmlCalls": sum(self.calls.values()),
                "firstSampleNvmlCalls": self.first_sample_calls,
                "nvmlCallsPerGpuPerSecond": (
                    None if self.calls_per_gpu_per_second is None else round(self.calls_per_gpu_per_second, 2)
                ),
                "cpuSeconds": round(self.cpu_seconds, 4),
                "milliCpu": round(self.millicpu, 2),
                "callsByFunction": dict(sorted(self.calls.items())),
                "errors": dict(sorted(self.errors.items())),
            },
        }


def _classify(outcomes: list[str]) -> tuple[str, str]:
    """One field's result over the GPUs: every GPU's outcome is 'ok' or an error name."""
    counted = collections.Counter(outcomes)
    errors = {name: n for name, n in counted.items() if name != "ok"}
    detail = ", ".join(f"{name} on {n} GPU(s)" for name, n in sorted(errors.items()))
    if not errors:
        return "supported", ""
    if any(name not in _UNSUPPORTED_NAMES for name in errors):
        return "error", detail
    if "ok" in counted:
        return "supported", f"not on every GPU: {detail}"
    return "not supported", detail


_UNSUPPORTED_NAMES: Final = frozenset(cls.__name__.removeprefix("NVMLError_") for cls in nvml.UNSUPPORTED)


def _outcome(read: Callable[..., Any], *args: Any) -> str:
    """'ok', or the name of the NVML error `read(*args)` raised."""
    try:
        read(*args)
    except nvml.NVMLError as exc:
        return nvml.error_name(exc)
    return "ok"


def ask_each_field(lib: ReadOnly, handles: list[Any]) -> list[Answer]:
    """Every fact's NVML call once per GPU, then NVLink, fabric and events (see the module doc)."""
    probe: nvml.Library = lib  # ReadOnly forwards the Library's functions
    answers = []
    for fact in facts.FACTS:
        missing = lib.errors[(fact.function, "FunctionNotFound")]
        outcomes = [_outcome(nvml.call, probe, fact.function, h, *fact.args) for h in handles]
        result, detail = _classify(outcomes)
        if result == "supported" and lib.errors[(fact.function, "FunctionNotFound")] > missing:
            if fact.function == "nvmlDeviceGetMemoryInfo":
                detail = "through nvmlDeviceGetMemoryInfo (v1): the driver lacks nvmlDeviceGetMemoryInfo_v2"
            else:
                older = nvml.OLDER_NAMES.get(fact.function, "an older call")
                detail = f"through {older}: the driver lacks {fact.function}"
        answers.append(Answer(".".join(fact.path), fact.function, result, detail))
    nvlink = [_outcome(_nvlink, probe, h) for h in handles]
    answers.append(Answer("nvlink", "nvmlDeviceGetNvLinkState", *_classify(nvlink)))
    fabric = [_outcome(_fabric, probe, h) for h in handles]
    answers.append(Answer("fabric", "nvmlDeviceGetGpuFabricInfo", *_classify(fabric)))
    event_set = probe.nvmlEventSetCreate()
    try:
        registered = [
            _outcome(probe.nvmlDeviceRegisterEvents, h, events.EVENT_TYPES, event_set) for h in handles
        ]
    finally:
        probe.nvmlEventSetFree(event_set)
    answers.append(Answer("events (XID, double-bit ECC)", "nvmlDeviceRegisterEvents", *_classify(registered)))
    return answers


def _nvlink(lib: nvml.Library, handle: Any) -> None:
    """Raises NotSupported for a GPU without NVLink (what the agent then leaves out)."""
    if links.discover(lib, handle) == 0:
        raise nvml.error("NotSupported")


def _fabric(lib: nvml.Library, handle: Any) -> None:
    if links.read_fabric(lib, handle) is None:  # state NotSupported: the agent leaves fabric out
        raise nvml.error("NotSupported")


def run(
    lib: nvml.Library,
    *,
    seconds: float = 10.0,
    interval: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    cpu_clock: Callable[[], float] = time.process_time,
) -> Report:
    """Probe the node's GPUs through `lib` (read-only; see the module doc). Raises NVML's error if
    nvmlInit or the device count fails."""
    guarded = ReadOnly(lib)
    probe: nvml.Library = guarded  # ReadOnly forwards the Library's functions
    probe.nvmlInit()
    try:
        count = int(probe.nvmlDeviceGetCount())
        handles = [probe.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        driver = _text_or_none(probe.nvmlSystemGetDriverVersion)
        models = sorted({m for h in handles if (m := _text_or_none(probe.nvmlDeviceGetName, h))})
        answers = ask_each_field(guarded, handles)
        guarded.calls.clear()
        guarded.errors.clear()
        reader = collector.Collector(probe, expected_gpus=count)  # the agent's own slow period
        started, cpu_started = clock(), cpu_clock()
        reader.sample(time.time())
        # The first sample also discovers (NVLink links, static facts): the steady rate is after it.
        first_calls, first_done = sum(guarded.calls.values()), clock()
        samples = 1
        while (left := started + seconds - clock()) > 0:
            sleep(min(interval, left))
            reader.sample(time.time())
            samples += 1
        elapsed = max(clock() - started, 1e-9)
        cpu = cpu_clock() - cpu_started
        calls = dict(guarded.calls)
    finally:
        probe.nvmlShutdown()
    steady = (
        (sum(calls.values()) - first_calls)
        / max(count, 1)
        / max(clock_span(first_done, started, elapsed), 1e-9)
    )
    return Report(
        driver_version=driver,
        gpus=count,
        models=models,
        answers=answers,
        seconds=elapsed,
        samples=samples,
        calls=calls,
        first_sample_calls=first_calls,
        calls_per_gpu_per_second=steady if samples > 1 else None,
        cpu_seconds=cpu,
        millicpu=1000 * cpu / elapsed,
        errors={f"{f}:{e}": n for (f, e), n in guarded.errors.items()},
    )


def clock_span(first_done: float, started: float, elapsed: float) -> float:
    """Seconds of sampling after the first sample."""
    return started + elapsed - first_done


def _text_or_none(read: Callable[..., Any], *args: Any) -> str | None:
    try:
        return nvml.text(read(*args))
    except nvml.NVMLError:
        return None


def render(report: Report, output: str = "table") -> str:
    """The report as text (a table per field, then the cost) or JSON."""
    if output == "json":
        return json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n"
    lines = [
        f"{report.gpus} GPU(s), {', '.join(report.models) or 'model unknown'}, "
        f"driver {report.driver_version or 'unknown'} (read-only probe: nothing was changed)",
        "",
    ]
    width = max(len(a.field) for a in report.answers)
    fn_width = max(len(a.function) for a in report.answers)
    lines.append(f"{'FIELD':<{width}}  {'NVML FUNCTION':<{fn_width}}  RESULT")
    for a in report.answers:
        detail = f" ({a.detail})" if a.detail else ""
        lines.append(f"{a.field:<{width}}  {a.function:<{fn_width}}  {a.result}{detail}")
    rate = report.calls_per_gpu_per_second
    steady = "one sample only" if rate is None else f"then {rate:.1f} per GPU per second"
    lines += [
        "",
        f"sampled {report.samples} time(s) over {report.seconds:.1f} s: {sum(report.calls.values())} NVML "
        f"calls ({report.first_sample_calls} in the first sample, which discovers; {steady}), "
        f"{report.cpu_seconds * 1000:.1f} ms CPU ({report.millicpu:.2f} mCPU)",
    ]
    if report.errors:
        lines.append(
            "errors while sampling: " + ", ".join(f"{k} x{n}" for k, n in sorted(report.errors.items()))
        )
    return "\n".join(lines) + "\n"
