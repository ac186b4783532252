"""Scenario files for the simulated backend: loading and validation.

A scenario scripts what a node's GPUs report over time (format: DESIGN.md and
docs/scenarios.md). Validation happens once, on load, and is strict: a typo
in a fault scenario would otherwise make a test or a demo silently check
nothing. Every error names the file, the timeline entry (index and line),
the field and what was expected. The result is an immutable, time-sorted
`Scenario` that `simulated.py` replays.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from gpuhealth_agent import facts, models, nvml
from gpuhealth_api import vocabulary

DEFAULT_MODEL: Final = "NVIDIA H100 80GB HBM3"
DEFAULT_DRIVER_VERSION: Final = "570.124.06"
MAX_GPUS: Final = 64


def _keys(*types: facts.Type) -> frozenset[str]:
    return frozenset(fact.key for fact in facts.FACTS if fact.type in types)


EXTRA_COUNTERS: Final[frozenset[str]] = frozenset(
    {
        "nvlinkCrcErrors",
        "nvlinkReplayErrors",
        "nvlinkRecoveryErrors",
        "pcieAerFatal",
        "pcieAerNonFatal",
        "pcieAerCorrectable",
    }
)
"""Scenario facts outside the fact table that only grow (NVLink error counters summed over the
GPU's links, PCIe AER totals)."""
EXTRA_INTS: Final[frozenset[str]] = frozenset({"nvlinks", "nvlinkLinksDown", "fabricCliqueId"})
"""`nvlinks`: how many NVLinks the GPU has (0: a PCIe board, NVLink NOT_SUPPORTED); `nvlinkLinksDown`:
how many of them are down (the last ones)."""
FABRIC_STATE_NAMES: Final[frozenset[str]] = frozenset(nvml.FABRIC_STATES.values())
FABRIC_STATUS_NAMES: Final[frozenset[str]] = nvml.ERROR_NAMES | {"Success"}
EXTRA_STRS: Final[dict[str, frozenset[str]]] = {
    "fabricState": FABRIC_STATE_NAMES,
    "fabricStatus": FABRIC_STATUS_NAMES,
}
"""Fabric info (nvmlDeviceGetGpuFabricInfo): state by name (`NotSupported` makes the call answer
NOT_SUPPORTED), status by nvmlReturn_t name."""

INT_FIELDS: Final = _keys(facts.Type.INT) | EXTRA_INTS
FLOAT_FIELDS: Final = _keys(facts.Type.FLOAT)
COUNTER_FIELDS: Final = _keys(*facts.COUNTING_TYPES) | EXTRA_COUNTERS
"""Counters only grow; a `set` that lowers one is rejected (volatile ECC counts excepted after a reset)."""
BOOL_FIELDS: Final = _keys(facts.Type.BOOL)
STR_FIELDS: Final = _keys(facts.Type.STR)
SETTABLE_FIELDS: Final[frozenset[str]] = (
    frozenset(facts.BY_KEY) | EXTRA_INTS | EXTRA_COUNTERS | frozenset(EXTRA_STRS)
)
AFTER_RESET: Final[Mapping[str, Any]] = {
    f.key: f.after_reset for f in facts.FACTS if f.after_reset is not None
}
"""What a GPU reset (`reset: true`) sets: volatile ECC counts, pending flags, the recovery action."""
VOLATILE_COUNTERS: Final[frozenset[str]] = frozenset(AFTER_RESET) & COUNTER_FIELDS

EXTRA_GROUPS: Final[dict[str, tuple[str, ...]]] = {
    "nvlink": ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkErrorCounter"),
    "fabric": ("nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV"),
}
"""`notSupported` names outside the fact table and the NVML functions they silence (NVLink's
field values answer NOT_SUPPORTED per field too)."""
OPTIONAL_FIELDS: Final[frozenset[str]] = facts.GROUPS | frozenset(EXTRA_GROUPS)
"""Names usable in `notSupported`: each maps to the NVML queries that then raise NOT_SUPPORTED."""

NIC_STATES: Final[dict[str, int]] = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
"""InfiniBand port states as sysfs `state` shows them (`4: ACTIVE`)."""
NIC_PHYS_STATES: Final[dict[str, int]] = {
    "Sleep": 1,
    "Polling": 2,
    "Disabled": 3,
    "PortConfigurationTraining": 4,
    "LinkUp": 5,
    "LinkErrorRecovery": 6,
    "PhyTest": 7,
}
"""Physical port states as sysfs `phys_state` shows them (`5: LinkUp`)."""
NIC_COUNTERS: Final[frozenset[str]] = frozenset({"linkDowned", "symbolErrors", "rcvErrors"})
NIC_SETTABLE: Final[frozenset[str]] = frozenset({"state", "physState", "rateGbps"}) | NIC_COUNTERS
NIC_KEYS: Final[frozenset[str]] = frozenset({"name", "port"}) | NIC_SETTABLE
NIC_DEFAULTS: Final[Mapping[str, Any]] = {
    "state": "ACTIVE",
    "physState": "LinkUp",
    "rateGbps": 400.0,
    "linkDowned": 0,
    "symbolErrors": 0,
    "rcvErrors": 0,
}
"""A healthy NDR port; a scenario's `nics:` entries override these."""
DOWN_PHYS_STATE: Final = "Polling"
"""The physical state a port set to anything but ACTIVE gets when the entry does not say (a pulled
cable or a dead peer: the port polls for a link)."""

CLOCK_EVENT_REASON_NAMES: Final[frozenset[str]] = frozenset(facts.REASON_BITS)
RECOVERY_ACTION_NAMES: Final[frozenset[str]] = frozenset(nvml.RECOVERY_ACTIONS.values())

TOP_LEVEL_KEYS: Final[frozenset[str]] = frozenset(
    {
        "gpus",
        "expectedGpus",
        "visibleGpus",
        "model",
        "driverVersion",
        "defaults",
        "timeline",
        "description",
        "nics",
        "repair",
        "checks",
    }
)
ENTRY_KEYS: Final[frozenset[str]] = frozenset(
    {"after", "gpu", "set", "xid", "reset", "notSupported", "fail", "nic", "port"}
)
ENTRY_ACTIONS: Final[frozenset[str]] = ENTRY_KEYS - {"after", "gpu", "nic", "port"}
NIC_ENTRY_KEYS: Final[frozenset[str]] = frozenset({"after", "nic", "port", "set"})
FAIL_KEYS: Final[frozenset[str]] = frozenset({"function", "error", "for"})

STEP_OUTCOMES: Final = ("fixes", "fails", "noEffect")
"""What a repair step's Job does on a simulated node: its effect (a GPU reset, a reboot), or it fails
(exit 1), or it succeeds and changes nothing."""
VALIDATION_OUTCOMES: Final = ("pass", "fail")
VALIDATION_KEY: Final = "validation"
REPAIR_KEYS: Final[tuple[str, ...]] = (*(a.value for a in vocabulary.RepairAction), VALIDATION_KEY)

CHECK_OUTCOMES: Final = ("pass", "fail")
MAX_CHECK_FIGURES: Final = 16
"""Figures one check run may report (the operator keeps as many: decisions/checks.MAX_FIGURES)."""
_TEMPLATE_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
"""A check template's key, as the policy's `activeChecks[].template` allows."""

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+)ms)?$")


class ScenarioError(ValueError):
    """A scenario file is not valid; the message says where and what was expected."""


@dataclasses.dataclass(frozen=True)
class Repair:
    """How the node answers gpu-health's repair Jobs (`repair:`), played by the fleet simulator.

    Per key, the outcome of each attempt in turn; the last one holds for every later attempt.
    The agent itself ignores this (a real node's repairs are real).
    """

    outcomes: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: {
            **{a.value: ("fixes",) for a in vocabulary.RepairAction},
            VALIDATION_KEY: ("pass",),
        }
    )
    """By step action (ResetGPU, RebootNode) or `validation`: fixes|fails|noEffect, pass|fail."""

    def outcome(self, key: str, attempt: int) -> str:
        """The outcome of attempt `attempt` (0 = the first) of a step action or of `validation`."""
        found = self.outcomes[key]
        return found[min(attempt, len(found) - 1)]


@dataclasses.dataclass(frozen=True)
class CheckOutcome:
    """How one check pod ends on a simulated node: exit 0 or 1, and the figures its termination message
    reports (a JSON object of numbers)."""

    passed: bool
    figures: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Checks:
    """How the node answers gpu-health's active checks (`checks:`), played by the fleet simulator.

    Per template key, the outcome of each attempt in turn; the last one holds for every later attempt. A
    template the scenario does not name passes with no figures. The agent itself ignores this.
    """

    outcomes: Mapping[str, tuple[CheckOutcome, ...]] = dataclasses.field(default_factory=dict)

    def outcome(self, template: str, attempt: int) -> CheckOutcome:
        """The outcome of attempt `attempt` (0 = the first) of a check of this template on the node."""
        found = self.outcomes.get(template) or (CheckOutcome(passed=True),)
        return found[min(attempt, len(found) - 1)]


@dataclasses.dataclass(frozen=True)
class Failure:
    """Make one NVML function raise an error for a while."""

    function: str
    error: str
    """Short pynvml error name, e.g. "Unknown" for NVMLError_Unknown."""
    for_seconds: float | None
    """How long the function keeps failing; None = until the end of the run."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One timeline entry: at `after_seconds`, do these things to GPU `gpu`."""

    after_seconds: float
    gpu: int
    set: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    xid: int | None = None
    reset: bool = False
    not_supported: frozenset[str] = frozenset()
    fail: Failure | None = None
    line: int | None = None
    index: int | None = None
    """Position in the file's `timeline:` list, kept because entries are sorted by time."""
    nic: str | None = None
    """A node-level entry for this InfiniBand device's ports (then `gpu` is -1 and `set` holds port facts)."""
    port: int | None = None
    """With `nic`: only this port (None: every port of the device)."""


@dataclasses.dataclass(frozen=True)
class Nic:
    """One simulated InfiniBand/RoCE port at the start (`nics:`); the timeline changes it by `nic`/`port`."""

    name: str
    port: int
    facts: Mapping[str, Any]
    """state, physState, rateGbps, linkDowned, symbolErrors, rcvErrors (NIC_DEFAULTS overlaid)."""


@dataclasses.dataclass(frozen=True)
class Scenario:
    path: str
    gpus: int
    expected_gpus: int
    model: str
    driver_version: str
    defaults: Mapping[str, Any]
    """Facts every GPU starts with (`models.defaults_for(model)` overlaid with the file's `defaults`)."""
    not_supported: frozenset[str]
    """Queries no GPU supports (from `defaults.notSupported`)."""
    timeline: tuple[Entry, ...]
    """Sorted by time; entries at the same time keep file order."""
    visible_gpus: int = MAX_GPUS
    """How many of the GPUs NVML enumerates to the agent (`visibleGpus`; fewer: a container runtime
    that hides them, 0 hiding all); at most `gpus`."""
    nics: tuple[Nic, ...] = ()
    """The node's InfiniBand/RoCE ports (`nics:`), written to the simulation's sysfs tree."""
    defaults_said: frozenset[str] = frozenset()
    """The keys the file's `defaults:` names (not the model's defaults)."""
    repair: Repair = dataclasses.field(default_factory=Repair)
    """How repair Jobs on the node turn out (`repair:`; default: every step fixes, validation passes)."""
    checks: Checks = dataclasses.field(default_factory=Checks)
    """How active checks on the node turn out (`checks:`; default: every check passes, no figures)."""

    @property
    def uses_sysfs(self) -> bool:
        """Whether the simulation writes a sysfs tree: the scenario has NICs or says anything of AER."""
        aer = {"pcieAerFatal", "pcieAerNonFatal", "pcieAerCorrectable"}
        said = set(self.defaults_said) | {key for entry in self.timeline for key in entry.set}
        return bool(self.nics) or bool(aer & said)

    @property
    def end_seconds(self) -> float:
        return self.timeline[-1].after_seconds if self.timeline else 0.0


def parse_duration(value: object) -> float:
    """`5s`, `1m30s`, `250ms`, `2h`, or a plain non-negative number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration like 5s, 1m30s, 250ms or a number of seconds")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a non-negative duration")
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match and any(match.groups()):
            hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
            return hours * 3600 + minutes * 60 + seconds + millis / 1000
    raise ValueError("a duration like 5s, 1m30s, 250ms or a number of seconds")


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raise ScenarioError on any problem."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot read scenario file: {exc.strerror}") from exc
    return parse(text, where)


def parse(text: str, where: str = "<scenario>") -> Scenario:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(f"{where}:{at}: not valid YAML: {problem}") from exc
    return _Validator(where, _entry_lines(root)).scenario(data)


def from_data(data: Mapping[str, Any], where: str = "<scenario>") -> Scenario:
    """Validate a scenario given as data (a fleet file's inline scenario), not as YAML text.

    Errors name `where` and the timeline entry by index, as `parse` does, without line numbers.
    """
    return _Validator(where, []).scenario(dict(data))


def _entry_at(index: int | None, line: int | None) -> str:
    at = "timeline" if index is None else f"timeline[{index}]"
    return at + (f" (line {line})" if line else "")


def _entry_lines(root: yaml.Node | None) -> list[int]:
    """1-based line of each timeline entry, so errors can point into the file."""
    if not isinstance(root, yaml.MappingNode):
        return []
    for key, value in root.value:
        if (
            isinstance(key, yaml.ScalarNode)
            and key.value == "timeline"
            and isinstance(value, yaml.SequenceNode)
        ):
            return [item.start_mark.line + 1 for item in value.value]
    return []


class _Validator:
    def __init__(self, where: str, lines: list[int]) -> None:
        self.where = where
        self.lines = lines

    def fail(self, at: str, expected: str, got: object = dataclasses.MISSING) -> ScenarioError:
        tail = "" if got is dataclasses.MISSING else f", got {got!r}"
        return ScenarioError(f"{self.where}: {at}: expected {expected}{tail}")

    def scenario(self, data: object) -> Scenario:
        if not isinstance(data, dict):
            raise self.fail(
                "top level", "a mapping with keys gpus, model, driverVersion, defaults, timeline", data
            )
        for key in data:  # a fact or an entry key at the top: say where it belongs
            if key in SETTABLE_FIELDS or key == "notSupported":
                raise self.fail(
                    f"top level.{key}", f"`{key}` under `defaults:` (facts every GPU starts with)"
                )
            if key in ENTRY_KEYS:
                raise self.fail(
                    f"top level.{key}", f"`{key}` in a `timeline:` entry like {{after: 5s, gpu: 0, ...}}"
                )
        self.unknown_keys(data, TOP_LEVEL_KEYS, "top level")
        if "gpus" not in data:
            raise self.fail("gpus", f"the number of GPUs on the node (1..{MAX_GPUS}); the key is missing")
        gpus = self.integer(data["gpus"], "gpus", minimum=1, maximum=MAX_GPUS)
        expected = self.integer(
            data.get("expectedGpus", gpus), "expectedGpus", minimum=gpus, maximum=MAX_GPUS
        )
        model = self.string(data.get("model", DEFAULT_MODEL), "model")
        driver = self.string(data.get("driverVersion", DEFAULT_DRIVER_VERSION), "driverVersion")
        raw_defaults = data.get("defaults") or {}
        if not isinstance(raw_defaults, dict):
            raise self.fail("defaults", "a mapping of field: value", raw_defaults)
        defaults = models.defaults_for(model)
        not_supported: frozenset[str] = frozenset()
        for key, value in raw_defaults.items():
            if key == "notSupported":
                not_supported = self.not_supported(value, "defaults.notSupported")
            else:
                defaults[key] = self.fact(key, value, "defaults")
        raw_timeline = data.get("timeline") or []
        if not isinstance(raw_timeline, list):
            raise self.fail(
                "timeline", "a list of entries like {after: 5s, gpu: 0, set: {...}}", raw_timeline
            )
        nics = self.nics(data.get("nics") or [])
        entries = [self.entry(i, raw, gpus, nics) for i, raw in enumerate(raw_timeline)]
        timeline = tuple(sorted(entries, key=lambda e: e.after_seconds))
        self.counters_only_grow(defaults, timeline, gpus)
        self.nic_counters_only_grow(nics, timeline)
        visible = self.integer(data.get("visibleGpus", gpus), "visibleGpus", minimum=0, maximum=gpus)
        said = frozenset(k for k in raw_defaults if k != "notSupported")
        repair = self.repair(data.get("repair"))
        checks = self.checks(data.get("checks"))
        return Scenario(
            self.where,
            gpus,
            expected,
            model,
            driver,
            defaults,
            not_supported,
            timeline,
            visible_gpus=visible,
            nics=nics,
            defaults_said=said,
            repair=repair,
            checks=checks,
        )

    def checks(self, raw: object) -> Checks:
        """`checks: {DcgmDiagQuick: pass, DcgmDiag: [fail, pass], Nccl: {busBandwidthGBps: 310}}`: per
        template, pass | fail | a mapping of figures (a pass that reports them), or a list (per attempt)."""
        if raw is None:
            return Checks()
        if not isinstance(raw, dict):
            raise self.fail("checks", "a mapping like {DcgmDiagQuick: pass, DcgmDiag: fail}", raw)
        what = "pass, fail, a mapping of figures like {busBandwidthGBps: 310}, or a list (one per attempt)"
        outcomes: dict[str, tuple[CheckOutcome, ...]] = {}
        for key, value in raw.items():
            if not isinstance(key, str) or not _TEMPLATE_KEY.match(key):
                raise self.fail(f"checks.{key}", "a template key like DcgmDiagQuick (letters, digits, -_.)")
            items = value if isinstance(value, list) else [value]
            if not items:
                raise self.fail(f"checks.{key}", what, value)
            found = []
            for i, item in enumerate(items):
                at = f"checks.{key}[{i}]" if isinstance(value, list) else f"checks.{key}"
                found.append(self.check_outcome(item, at, what))
            outcomes[key] = tuple(found)
        return Checks(outcomes)

    def check_outcome(self, item: object, at: str, what: str) -> CheckOutcome:
        if item in CHECK_OUTCOMES:
            return CheckOutcome(passed=item == "pass")
        if not isinstance(item, dict) or not item:
            raise self.fail(at, what, item)
        if len(item) > MAX_CHECK_FIGURES:
            raise self.fail(at, f"at most {MAX_CHECK_FIGURES} figures", len(item))
        figures: dict[str, float] = {}
        for name, number in item.items():
            if not isinstance(name, str) or not 0 < len(name) <= 63:
                raise self.fail(at, "figure names of 1 to 63 characters", name)
            plain = isinstance(number, int | float) and not isinstance(number, bool)
            if not plain or not math.isfinite(number):
                raise self.fail(f"{at}.{name}", "a finite number", number)
            figures[name] = float(number)
        return CheckOutcome(passed=True, figures=figures)

    def repair(self, raw: object) -> Repair:
        """`repair: {ResetGPU: fixes, RebootNode: [fails, fixes], validation: pass}` (a list: per attempt)."""
        if raw is None:
            return Repair()
        example = "a mapping like {ResetGPU: fixes, RebootNode: fails, validation: pass}"
        if not isinstance(raw, dict):
            raise self.fail("repair", example, raw)
        for key in raw:
            if key not in REPAIR_KEYS:
                raise self.fail(f"repair.{key}", f"one of the keys {', '.join(REPAIR_KEYS)}")
        outcomes = dict(Repair().outcomes)
        for key, value in raw.items():
            allowed = VALIDATION_OUTCOMES if key == VALIDATION_KEY else STEP_OUTCOMES
            what = f"one of {', '.join(allowed)}, or a list of them (one per attempt, the last repeats)"
            items = value if isinstance(value, list) else [value]
            if not items:
                raise self.fail(f"repair.{key}", what, value)
            for i, item in enumerate(items):
                if item not in allowed:
                    at = f"repair.{key}[{i}]" if isinstance(value, list) else f"repair.{key}"
                    raise self.fail(at, what, item)
            outcomes[key] = tuple(items)
        return Repair(outcomes)

    def nics(self, raw: object) -> tuple[Nic, ...]:
        if not isinstance(raw, list):
            raise self.fail("nics", "a list of ports like {name: mlx5_0, port: 1, rateGbps: 400}", raw)
        found: list[Nic] = []
        for i, item in enumerate(raw):
            at = f"nics[{i}]"
            if not isinstance(item, dict):
                raise self.fail(at, "a mapping like {name: mlx5_0, port: 1, rateGbps: 400}", item)
            self.unknown_keys(item, NIC_KEYS, at)
            name = self.string(item.get("name"), f"{at}.name")
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise self.fail(f"{at}.name", "a device name like mlx5_0", name)
            port = self.integer(item.get("port", 1), f"{at}.port", minimum=1, maximum=255)
            if any(n.name == name and n.port == port for n in found):
                raise self.fail(at, f"one entry per port; {name} port {port} is listed twice")
            values = dict(NIC_DEFAULTS)
            for key in NIC_SETTABLE & item.keys():
                values[key] = self.nic_fact(key, item[key], f"{at}.{key}")
            found.append(Nic(name, port, values))
        return tuple(found)

    def nic_fact(self, key: str, value: object, at: str) -> Any:
        if key in NIC_COUNTERS:
            return self.integer(value, at, minimum=0)
        if key == "rateGbps":
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise self.fail(at, "a non-negative number of Gb/s", value)
            return float(value)
        names = NIC_STATES if key == "state" else NIC_PHYS_STATES
        if value not in names:
            raise self.fail(at, f"one of {', '.join(names)}", value)
        return value

    def nic_entry(self, raw: dict[Any, Any], at: str, after: float, nics: tuple[Nic, ...]) -> Entry:
        self.unknown_keys(raw, NIC_ENTRY_KEYS, at)
        name = raw["nic"]
        known = sorted({n.name for n in nics})
        if name not in known:
            raise self.fail(
                f"{at}.nic", f"a device listed under `nics:` ({', '.join(known) or 'none'})", name
            )
        port = None
        if "port" in raw:
            port = self.integer(raw["port"], f"{at}.port", minimum=1, maximum=255)
            if not any(n.name == name and n.port == port for n in nics):
                raise self.fail(f"{at}.port", f"a port of {name} listed under `nics:`", port)
        raw_set = raw.get("set")
        if not isinstance(raw_set, dict) or not raw_set:
            raise self.fail(
                f"{at}.set", f"a mapping of port facts ({', '.join(sorted(NIC_SETTABLE))})", raw_set
            )
        values: dict[str, Any] = {}
        for key, value in raw_set.items():
            if key not in NIC_SETTABLE:
                raise self.fail(f"{at}.set.{key}", f"a port fact ({', '.join(sorted(NIC_SETTABLE))})")
            values[key] = self.nic_fact(key, value, f"{at}.set.{key}")
        if "state" in values and "physState" not in values:
            values["physState"] = "LinkUp" if values["state"] == "ACTIVE" else DOWN_PHYS_STATE
        return Entry(after, -1, values, nic=name, port=port)

    def nic_counters_only_grow(self, nics: tuple[Nic, ...], timeline: tuple[Entry, ...]) -> None:
        current = {(n.name, n.port): dict(n.facts) for n in nics}
        for entry in timeline:
            if entry.nic is None:
                continue
            for (name, port), values in current.items():
                if name != entry.nic or (entry.port is not None and port != entry.port):
                    continue
                for key in NIC_COUNTERS & entry.set.keys():
                    if entry.set[key] < values[key]:
                        raise self.fail(
                            f"{_entry_at(entry.index, entry.line)}.set.{key}",
                            f"a value >= {values[key]} on {name} port {port} (counters only grow)",
                            entry.set[key],
                        )
                    values[key] = entry.set[key]

    def entry(self, index: int, raw: object, gpus: int, nics: tuple[Nic, ...] = ()) -> Entry:
        line = self.lines[index] if index < len(self.lines) else None
        at = _entry_at(index, line)
        if not isinstance(raw, dict):
            raise self.fail(at, "a mapping like {after: 5s, gpu: 0, set: {...}}", raw)
        self.unknown_keys(raw, ENTRY_KEYS, at)
        if "after" not in raw:
            raise self.fail(f"{at}.after", "a time since start like 5s; the key is missing")
        try:
            after = parse_duration(raw["after"])
        except ValueError as exc:
            raise self.fail(f"{at}.after", str(exc), raw["after"]) from None
        if "nic" in raw:
            if "gpu" in raw:
                raise self.fail(at, "either `gpu:` (a GPU's facts) or `nic:` (a port's facts), not both")
            entry = self.nic_entry(raw, at, after, nics)
            return dataclasses.replace(entry, line=line, index=index)
        if "port" in raw:
            raise self.fail(f"{at}.port", "`port:` only with `nic:`")
        if "gpu" not in raw:
            raise self.fail(f"{at}.gpu", f"a GPU index 0..{gpus - 1}; the key is missing")
        gpu = self.integer(raw["gpu"], f"{at}.gpu", minimum=0, maximum=gpus - 1)
        if not ENTRY_ACTIONS & raw.keys():
            raise self.fail(at, f"at least one of {', '.join(sorted(ENTRY_ACTIONS))}")
        facts: dict[str, Any] = {}
        raw_set = raw.get("set", {})
        if not isinstance(raw_set, dict):
            raise self.fail(f"{at}.set", "a mapping of field: value", raw_set)
        for key, value in raw_set.items():
            facts[key] = self.fact(key, value, f"{at}.set")
        xid = None
        if "xid" in raw:
            xid = self.integer(
                raw["xid"], f"{at}.xid", minimum=1, maximum=65535, what="an XID code (integer 1..65535)"
            )
        reset = self.boolean(raw.get("reset", False), f"{at}.reset")
        not_supported = self.not_supported(raw.get("notSupported", []), f"{at}.notSupported")
        fail = self.failure(raw["fail"], f"{at}.fail") if "fail" in raw else None
        return Entry(after, gpu, facts, xid, reset, not_supported, fail, line, index)

    def fact(self, key: object, value: object, at: str) -> Any:
        if key not in SETTABLE_FIELDS:
            raise self.fail(f"{at}.{key}", f"a known field ({', '.join(sorted(SETTABLE_FIELDS))})")
        field = f"{at}.{key}"
        if key in INT_FIELDS or key in COUNTER_FIELDS:
            return self.integer(value, field, minimum=0)
        if key in FLOAT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise self.fail(field, "a non-negative number", value)
            return float(value)
        if key in BOOL_FIELDS:
            return self.boolean(value, field)
        if key in STR_FIELDS:
            return self.string(value, field)
        if key in EXTRA_STRS:
            if value not in EXTRA_STRS[key]:
                raise self.fail(field, f"one of {', '.join(sorted(EXTRA_STRS[key]))}", value)
            return value
        if key == "clockEventReasons":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise self.fail(field, "a list of clock-event reason names", value)
            unknown = [v for v in value if v not in CLOCK_EVENT_REASON_NAMES]
            if unknown:
                raise self.fail(
                    field, f"reasons from {', '.join(sorted(CLOCK_EVENT_REASON_NAMES))}", unknown[0]
                )
            return list(value)
        # recoveryAction
        if value not in RECOVERY_ACTION_NAMES:
            raise self.fail(field, f"one of {', '.join(nvml.RECOVERY_ACTIONS.values())}", value)
        return value

    def failure(self, raw: object, at: str) -> Failure:
        if not isinstance(raw, dict):
            raise self.fail(at, "a mapping like {function: nvmlDeviceGetPowerUsage, error: Unknown}", raw)
        self.unknown_keys(raw, FAIL_KEYS, at)
        function = raw.get("function")
        if function not in SIMULATED_FUNCTIONS:
            raise self.fail(f"{at}.function", "the name of an NVML device function the agent calls", function)
        error = raw.get("error", "Unknown")
        if error not in nvml.ERROR_NAMES:
            raise self.fail(f"{at}.error", "a pynvml error name like Unknown, GpuIsLost, NotSupported", error)
        for_seconds = None
        if "for" in raw:
            try:
                for_seconds = parse_duration(raw["for"])
            except ValueError as exc:
                raise self.fail(f"{at}.for", str(exc), raw["for"]) from None
        return Failure(function, error, for_seconds)

    def not_supported(self, value: object, at: str) -> frozenset[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(at, "a list of query names", value)
        unknown = [v for v in value if v not in OPTIONAL_FIELDS]
        if unknown:
            raise self.fail(at, f"names from {', '.join(sorted(OPTIONAL_FIELDS))}", unknown[0])
        return frozenset(value)

    def counters_only_grow(self, defaults: Mapping[str, Any], timeline: tuple[Entry, ...], gpus: int) -> None:
        current = [{k: defaults[k] for k in COUNTER_FIELDS} for _ in range(gpus)]
        for entry in timeline:
            if entry.nic is not None:
                continue
            counters = current[entry.gpu]
            if entry.reset:
                for key in VOLATILE_COUNTERS:
                    counters[key] = 0
            for key, value in entry.set.items():
                if key in COUNTER_FIELDS:
                    if value < counters[key]:
                        at = _entry_at(entry.index, entry.line)
                        raise self.fail(
                            f"{at}.set.{key}",
                            f"a value >= {counters[key]} on gpu {entry.gpu} (counters only grow; "
                            "volatile ECC counts drop only with `reset: true`)",
                            value,
                        )
                    counters[key] = value

    def unknown_keys(self, raw: Mapping[Any, Any], allowed: frozenset[str], at: str) -> None:
        for key in raw:
            if key not in allowed:
                raise self.fail(f"{at}.{key}", f"one of the keys {', '.join(sorted(allowed))}")

    def integer(
        self, value: object, at: str, minimum: int | None = None, maximum: int | None = None, what: str = ""
    ) -> int:
        if not what:
            lo = "" if minimum is None else f" >= {minimum}"
            hi = "" if maximum is None else f" and <= {maximum}"
            what = f"an integer{lo}{hi}"
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(at, what, value)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise self.fail(at, what, value)
        return value

    def boolean(self, value: object, at: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(at, "true or false", value)
        return value

    def string(self, value: object, at: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(at, "a non-empty string", value)
        return value


SIMULATED_FUNCTIONS: Final[frozenset[str]] = (
    frozenset({"nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo"})
    | facts.FUNCTIONS
    | frozenset(f for functions in EXTRA_GROUPS.values() for f in functions)
)
"""Per-device functions a scenario's `fail` may target."""
