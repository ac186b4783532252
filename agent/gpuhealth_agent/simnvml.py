"""Drive the simulated NVML library (native/simnvml, `libnvidia-ml.so.1`) from a scenario file.

For tests and the simulator only: production never imports this module. The agent's `--backend nvml`
path is the pynvml module, unmodified, over whatever `libnvidia-ml.so.1` the loader finds; with
hack/simnvml.sh's build first on `LD_LIBRARY_PATH` (or already loaded, `preload`) that is a C library
compiled against NVIDIA's nvml.h, whose GPU state this driver writes. So pynvml's own code (structs,
version tags, symbol lookups, error mapping) runs in every such test, and only the GPU is simulated.

One source of truth: the driver does not replay the scenario itself. It runs the Python backend's
replay (`simulated.SimulatedNvml`: timeline, resets, scripted failures, events) and copies its state
into the library, encoded by the fact table (`facts.encode`), as the driver would report it. The
library calls `sync` before every NVML call, so the timeline advances exactly when the agent asks, as
on the Python backend; a sync that finds the replay where it was costs a tuple compare.

The library's state is process-wide (it is *the* NVML of the process): one Driver at a time.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from gpuhealth_agent import facts, nvml, scenario, simulated

log = logging.getLogger(__name__)

SONAME: Final = "libnvidia-ml.so.1"
PROFILES: Final = ("full", "old-driver")
"""The builds hack/simnvml.sh makes: every function, or a driver before R535 (some symbols absent)."""
DIR_ENV: Final = "GPUHEALTH_SIMNVML_DIR"
"""Where hack/simnvml.sh put the builds (one folder per profile), for the tests' subprocesses."""

FUNCTIONS: Final[tuple[str, ...]] = (
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkErrorCounter",
    "nvmlDeviceGetGpuFabricInfo",
    "nvmlDeviceGetGpuFabricInfoV",
    "nvmlDeviceRegisterEvents",
)
"""Per-device functions whose answer the library lets the driver force (simnvml.c's FUNCTIONS, same
order): by pynvml's name, as a scenario's `fail:` and `notSupported` name them."""

_NVLINK_KEYS: Final = (
    "nvlinks",
    "nvlinkLinksDown",
    "nvlinkCrcErrors",
    "nvlinkReplayErrors",
    "nvlinkRecoveryErrors",
)
_NVLINK_FIELDS: Final[tuple[int, ...]] = tuple(
    f
    for f in (
        nvml.FI_DEV_NVLINK_GET_STATE,
        nvml.FI_DEV_NVLINK_ERROR_DL_CRC,
        nvml.FI_DEV_NVLINK_ERROR_DL_REPLAY,
        nvml.FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    )
    if f is not None
)
_FABRIC_CODES: Final[dict[str, int]] = {name: code for code, name in nvml.FABRIC_STATES.items()}
_NOT_SUPPORTED: Final = nvml.return_code("NotSupported")
_HOOK: Final = ctypes.CFUNCTYPE(ctypes.c_double)
_POLL: Final = 0.5
"""Longest a waiting nvmlEventSetWait_v2 sleeps between looks at the scenario (an outside reset)."""


_INSTALLED: list[Any] = []
"""The hook the library holds (a Driver dropped without `close` must not leave it a freed pointer)."""


class NotTheSimulation(RuntimeError):
    """The libnvidia-ml.so.1 at hand is not the simulated one (a real driver's): never driven."""


def library_path(profile: str = "full", directory: str | os.PathLike[str] | None = None) -> Path:
    """The build of `profile` under `directory` (default: $GPUHEALTH_SIMNVML_DIR)."""
    where = directory if directory is not None else os.environ.get(DIR_ENV)
    if not where:
        raise FileNotFoundError(f"${DIR_ENV} is not set: run hack/simnvml.sh and point it at its output")
    if profile not in PROFILES:
        raise ValueError(f"no simnvml profile {profile!r} (have: {', '.join(PROFILES)})")
    return Path(where) / profile / SONAME


def preload(path: str | os.PathLike[str]) -> ctypes.CDLL:
    """Load the library by path under its soname, so pynvml's `CDLL("libnvidia-ml.so.1")` gets this one.

    The dynamic loader matches an already loaded object by soname before it searches any path; so a
    process that did not start with LD_LIBRARY_PATH (a test run) still gives pynvml the simulation,
    with pynvml's loader untouched. Once loaded it stays for the life of the process.
    """
    return ctypes.CDLL(os.fspath(path), mode=ctypes.RTLD_GLOBAL)


def _bind(lib: ctypes.CDLL) -> None:
    if not hasattr(lib, "simnvml_reset"):
        raise NotTheSimulation(f"{SONAME} here is not the simulated NVML (no simnvml_* control API)")
    u, ull, s, i = ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_char_p, ctypes.c_int
    for name, args in {
        "simnvml_reset": [u],
        "simnvml_set_visible": [u],
        "simnvml_set": [u, s, ull],
        "simnvml_set_text": [u, s, s],
        "simnvml_set_return": [u, s, i],
        "simnvml_set_field_return": [u, u, i],
        "simnvml_set_lost": [u, i],
        "simnvml_push_event": [u, ull, ull, i],
    }.items():
        function = getattr(lib, name)
        function.argtypes = args
        function.restype = i
    lib.simnvml_set_hook.argtypes = [_HOOK]
    lib.simnvml_set_hook.restype = None
    lib.simnvml_calls.argtypes = []
    lib.simnvml_calls.restype = ull


def _ok(code: int, what: str) -> None:
    if code != 0:
        raise ValueError(f"simnvml refused {what}")


class Driver:
    """Replays a scenario into the simulated NVML library of this process (module doc)."""

    def __init__(
        self,
        plan: scenario.Scenario,
        *,
        clock: Callable[[], float] = time.time,
        start: float | None = None,
        identity_seed: str = "gpu-health-sim",
        lib: ctypes.CDLL | None = None,
    ) -> None:
        self.sim = simulated.SimulatedNvml(plan, clock=clock, start=start, identity_seed=identity_seed)
        self.lib = lib if lib is not None else ctypes.CDLL(SONAME)
        _bind(self.lib)
        self._pushed: list[dict[str, Any]] = []
        self._progress: tuple[int, int, int] | None = None
        self._expiries = False
        self._events = 0
        self._hook = _HOOK(self._sync_safely)  # kept: the library holds only the pointer
        _ok(self.lib.simnvml_reset(plan.gpus), f"{plan.gpus} GPUs")
        _ok(self.lib.simnvml_set_visible(plan.visible_gpus), "visibleGpus")
        _ok(self.lib.simnvml_set_text(0, b"driverVersion", plan.driver_version.encode()), "driverVersion")
        for gpu in range(plan.gpus):
            for key, value in (
                ("name", plan.model),
                ("uuid", self.sim.uuid(gpu)),
                ("busId", simulated.bus_id(gpu)),
            ):
                _ok(self.lib.simnvml_set_text(gpu, key.encode(), value.encode()), key)
        self._pushed = [{} for _ in range(plan.gpus)]
        self.sync()
        _INSTALLED[:] = [self._hook]  # the library keeps calling it: never let it be freed under it
        self.lib.simnvml_set_hook(self._hook)

    @property
    def sysfs_root(self) -> Path | None:
        """The replay's sysfs tree (PCIe AER, InfiniBand), for the agent's `--sysfs-root`."""
        return self.sim.sysfs_root

    @property
    def calls(self) -> int:
        """NVML calls the library has served in this process."""
        return int(self.lib.simnvml_calls())

    def close(self) -> None:
        """Stop advancing the scenario (the library keeps answering from the last state)."""
        self.lib.simnvml_set_hook(_HOOK())

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _sync_safely(self) -> float:
        """The library's hook: sync, and say how soon the scenario changes by itself (seconds)."""
        try:
            self.sync()
            return min(self.sim.next_change_in(), _POLL)
        except Exception:  # an exception cannot cross the C frame: say it, keep the last state
            log.exception("simnvml: syncing the scenario into the library failed")
            return -1.0

    def sync(self) -> None:
        """Bring the library up to the scenario's present (the library calls this before each NVML call)."""
        now = self.sim.advance()
        progress = self.sim.progress()
        if progress != self._progress or self._expiries:
            self._progress = progress
            self._expiries = False
            for gpu in range(len(self._pushed)):
                self._push_gpu(gpu, now)
        events = self.sim.events()
        if len(events) < self._events:  # the clock went back: the replay started over
            self._events = 0
        for event in events[self._events :]:
            at_start = int(event.timeSeconds <= 0)
            _ok(
                self.lib.simnvml_push_event(event.device.gpu, event.eventType, event.eventData, at_start),
                "event",
            )
        self._events = len(events)

    def _push_gpu(self, gpu: int, now: float) -> None:
        state = self.sim.gpu_state(gpu, now)
        if state.expiring:
            self._expiries = True  # a failure that runs out by time: look again at the next call
        wanted = self.encode(state.facts, state.not_supported, state.failing, state.lost)
        wanted["serial"] = self.sim.serial(gpu)
        pushed = self._pushed[gpu]
        lib = self.lib
        for key, value in wanted.items():
            if pushed.get(key) == value:
                continue
            if key == "lost":
                _ok(lib.simnvml_set_lost(gpu, int(value)), "lost")
            elif key == "serial":
                _ok(lib.simnvml_set_text(gpu, b"serial", str(value).encode()), "serial")
            elif key.startswith("return:"):
                _ok(lib.simnvml_set_return(gpu, key[7:].encode(), value), key)
            elif key.startswith("field:"):
                _ok(lib.simnvml_set_field_return(gpu, int(key[6:]), value), key)
            else:
                _ok(lib.simnvml_set(gpu, key.encode(), value), key)
            pushed[key] = value

    @staticmethod
    def encode(
        current: dict[str, Any], not_supported: frozenset[str], failing: dict[str, str], lost: bool
    ) -> dict[str, Any]:
        """What the library holds for one GPU: facts in NVML's units, forced returns, field returns."""
        wanted: dict[str, Any] = {"lost": lost}
        for fact in facts.FACTS:
            if fact.type is facts.Type.STR or fact.key not in current:
                continue
            raw = facts.encode(fact, current[fact.key])
            wanted[fact.key] = len(raw) if fact.type is facts.Type.PAGES else int(raw)
        for key in _NVLINK_KEYS:
            wanted[key] = int(current.get(key, 0))
        wanted["fabricState"] = _FABRIC_CODES[current.get("fabricState", "NotSupported")]
        wanted["fabricStatus"] = nvml.return_code(current.get("fabricStatus", "Success"))
        wanted["fabricCliqueId"] = int(current.get("fabricCliqueId", 0))
        for function in FUNCTIONS:
            code = nvml.SUCCESS
            if function in failing:
                code = nvml.return_code(failing[function])
            elif simulated.GROUP_BY_FUNCTION.get(function) in not_supported:
                code = _NOT_SUPPORTED
            wanted[f"return:{function}"] = code
        recovery = nvml.FI_DEV_GET_GPU_RECOVERY_ACTION
        if recovery is not None:
            code = _NOT_SUPPORTED if "recoveryAction" in not_supported else nvml.SUCCESS
            wanted[f"field:{recovery}"] = code
        for field in _NVLINK_FIELDS:
            wanted[f"field:{field}"] = _NOT_SUPPORTED if "nvlink" in not_supported else nvml.SUCCESS
        return wanted


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gpuhealth_agent.simnvml --scenario FILE [--node-name N] -- AGENT ARGS...`

    Runs the real `gpu-health-agent` (`--backend nvml`) in this process over the simulated library that
    LD_LIBRARY_PATH points at, with the scenario's GPUs (and their sysfs tree as `--sysfs-root`).
    """
    from gpuhealth_agent import cli  # noqa: PLC0415 - the agent's CLI only when run as a launcher

    parser = argparse.ArgumentParser(prog="python -m gpuhealth_agent.simnvml")
    parser.add_argument("--scenario", required=True, metavar="FILE")
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", "gpu-health-sim"))
    parser.add_argument("agent_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    plan = scenario.load(args.scenario)
    agent_args = list(args.agent_args)
    if agent_args[:1] == ["--"]:
        agent_args = agent_args[1:]
    driver = Driver(plan, identity_seed=args.node_name)
    if driver.sysfs_root is not None and not any(a.startswith("--sysfs-root") for a in agent_args):
        agent_args.append(f"--sysfs-root={driver.sysfs_root}")
    with driver:
        return cli.main(agent_args)


if __name__ == "__main__":
    sys.exit(main())
