"""Fleet files: which simulated GPU nodes exist, their hardware, labels and scenarios.

A fleet file is YAML (reference: docs/fleet.md). Loading it resolves every
pattern to node names and every scenario to a mapping in the agent's
scenario format, so the rest of the simulator works on a flat list of
`NodePlan`s. A bad file is rejected as a whole with every problem listed,
each naming the file and the field (`pools[1].gpu.count: ...`), because a
fleet that half-starts is harder to debug than one that does not start.
"""

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpuhealth_agent import scenario as agent_scenario
from gpuhealth_api import heartbeats
from gpuhealth_sim.fleet import names

DEFAULT_INTERVAL_SECONDS = 5.0
DEFAULT_HEARTBEAT_SECONDS = float(heartbeats.DEFAULT_HEARTBEAT_SECONDS)
DEFAULT_RESOURCES: Mapping[str, str] = {
    "cpu": "128",
    "memory": "1Ti",
    "pods": "110",
    "ephemeral-storage": "2Ti",
}
DEFAULT_DRIVER_VERSION = "570.124.06"

_QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[mkMGTPE]|u|n)?$")
_LABEL_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_TOP_KEYS = frozenset({"seed", "agent", "workers", "labels", "pools", "overrides"})
_POOL_KEYS = frozenset(
    {"name", "nodes", "count", "gpu", "resources", "labels", "scenario", "baseline", "dra"}
)
_OVERRIDE_KEYS = frozenset({"nodes", "scenario", "labels"})
_BASELINE_KEYS = {
    "temperatureCelsius": "temperature_celsius",
    "powerWatts": "power_watts",
    "smClockMHz": "sm_clock_mhz",
}


class FleetError(ValueError):
    """A fleet file that cannot be used; `problems` lists each one with its field."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{source}: invalid fleet file ({len(problems)} problem(s)):\n{lines}")


@dataclasses.dataclass(frozen=True)
class Spread:
    """Standard deviations of the healthy baseline across nodes (0 turns a field's spread off)."""

    temperature_celsius: float = 2.5
    """Node-to-node spread of GPU temperature; each GPU adds a third of it again."""
    power_watts: float = 10.0
    """Node-to-node spread of board power draw."""
    sm_clock_mhz: float = 8.0
    """Node-to-node spread of the SM clock under load; kept at or below the max clock."""


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """One simulated node: what its Node object says and what its GPUs will do."""

    name: str
    pool: str
    gpu_model: str
    gpu_count: int
    labels: Mapping[str, str]
    """Extra labels (fleet, pool and override labels merged); GPU labels are added by `nodes`."""
    resources: Mapping[str, str]
    """Capacity (= allocatable) besides nvidia.com/gpu: cpu, memory, pods, ..."""
    scenario: Mapping[str, Any]
    """The node's scenario in the agent's format, with the pool's model and GPU count applied."""
    scenario_source: str
    """Where the scenario came from, for messages: a path or `inline (field)`."""
    spread: Spread
    dra: bool = False
    """GPUs allocated through DRA: a ResourceSlice lists them (module `dra`), no `nvidia.com/gpu` capacity."""


@dataclasses.dataclass(frozen=True)
class Fleet:
    source: str
    seed: int
    interval_seconds: float
    """How often each simulated agent collects (the agent's --interval)."""
    heartbeat_seconds: float
    """How often each simulated agent reports when nothing changed (the agent's --heartbeat)."""
    workers: int | None
    """Threads driving the agents; None lets the fleet choose."""
    nodes: tuple[NodePlan, ...]

    def node(self, name: str) -> NodePlan:
        for plan in self.nodes:
            if plan.name == name:
                return plan
        raise KeyError(name)


class _Reader:
    """Collects problems with their field paths instead of stopping at the first."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir
        self.problems: list[str] = []

    def problem(self, field: str, message: str) -> None:
        self.problems.append(f"{field}: {message}" if field else message)

    def unknown_keys(self, field: str, data: Mapping[str, Any], allowed: frozenset[str]) -> None:
        for key in data:
            if key not in allowed:
                where = f"{field}.{key}" if field else str(key)
                self.problem(where, f"unknown field; expected one of {sorted(allowed)}")

    def mapping(self, field: str, value: Any) -> Mapping[str, Any] | None:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.problem(field, f"expected a mapping, got {_kind(value)}")
            return None
        return value

    def number(self, field: str, value: Any, default: float, minimum: float, strict: bool = True) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(field, f"expected a number, got {_kind(value)}")
            return default
        if value < minimum or (strict and value == minimum):
            self.problem(field, f"expected a number {'>' if strict else '>='} {minimum:g}, got {value}")
            return default
        return float(value)

    def integer(self, field: str, value: Any, minimum: int) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(field, f"expected an integer, got {_kind(value)}")
            return None
        if value < minimum:
            self.problem(field, f"expected an integer >= {minimum}, got {value}")
            return None
        return value

    def labels(self, field: str, value: Any) -> dict[str, str]:
        data = self.mapping(field, value)
        result: dict[str, str] = {}
        for key, raw in (data or {}).items():
            text = _scalar_text(raw)
            if not isinstance(key, str) or not _LABEL_NAME.match(key):
                self.problem(f"{field}.{key}", "not a valid label name")
            elif text is None or len(text) > 63 or not _LABEL_VALUE.match(text):
                self.problem(f"{field}.{key}", f"label value {raw!r} must be at most 63 of [A-Za-z0-9-_.]")
            else:
                result[key] = text
        return result

    def resources(self, field: str, value: Any) -> dict[str, str]:
        data = self.mapping(field, value)
        result: dict[str, str] = {}
        for key, raw in (data or {}).items():
            text = _scalar_text(raw)
            if key == "nvidia.com/gpu":
                self.problem(f"{field}.{key}", "set the GPU count with gpu.count, not as a resource")
            elif text is None or not _QUANTITY.match(text):
                self.problem(f"{field}.{key}", f"{raw!r} is not a Kubernetes quantity (e.g. 96, 1Ti, 500m)")
            else:
                result[str(key)] = text
        return result

    def patterns(self, field: str, value: Any) -> list[str]:
        items = value if isinstance(value, list) else [value]
        patterns: list[str] = []
        for i, item in enumerate(items):
            where = f"{field}[{i}]" if isinstance(value, list) else field
            if not isinstance(item, str) or not item:
                self.problem(
                    where,
                    f"expected a node name or a pattern like gpu-node-{{0..11}}, got {_kind(item)}",
                )
            else:
                patterns.append(item)
        return patterns

    def scenario(self, field: str, value: Any) -> tuple[Mapping[str, Any], str] | None:
        if isinstance(value, Mapping):
            return value, f"inline ({field})"
        if not isinstance(value, str):
            self.problem(field, f"expected a scenario path or an inline scenario, got {_kind(value)}")
            return None
        path = Path(os.path.normpath(self.base_dir / value))
        try:
            data = yaml.safe_load(path.read_text())
        except OSError as error:
            self.problem(field, f"cannot read scenario file {path}: {error.strerror or error}")
            return None
        except yaml.YAMLError as error:
            self.problem(field, f"scenario file {path} is not valid YAML: {error}")
            return None
        if not isinstance(data, Mapping):
            self.problem(field, f"scenario file {path} must hold a mapping, got {_kind(data)}")
            return None
        return data, str(path)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return type(value).__name__


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    return None


def _spread(reader: _Reader, field: str, value: Any) -> Spread:
    if value is False:
        return Spread(0.0, 0.0, 0.0)
    data = reader.mapping(field, value)
    if data is None:
        return Spread()
    reader.unknown_keys(field, data, frozenset(_BASELINE_KEYS))
    defaults = Spread()
    values = {
        attr: reader.number(f"{field}.{key}", data.get(key), getattr(defaults, attr), 0.0, strict=False)
        for key, attr in _BASELINE_KEYS.items()
    }
    return Spread(**values)


@dataclasses.dataclass
class _Pool:
    name: str
    node_names: list[str]
    model: str | None
    gpu_count: int | None
    labels: dict[str, str]
    resources: dict[str, str]
    scenario: tuple[Mapping[str, Any], str] | None
    spread: Spread
    dra: bool


def _pool(reader: _Reader, index: int, raw: Any) -> _Pool | None:
    field = f"pools[{index}]"
    data = reader.mapping(field, raw)
    if data is None:
        return None
    reader.unknown_keys(field, data, _POOL_KEYS)
    name = data.get("name", f"pool-{index}")
    if not isinstance(name, str) or names.invalid_node_name(name):
        reader.problem(f"{field}.name", f"expected a lower-case name like h100, got {_kind(name)}")
        name = f"pool-{index}"
    node_names: list[str] = []
    if ("nodes" in data) == ("count" in data):
        reader.problem(field, "give exactly one of nodes (names or patterns like gpu-node-{0..11}) or count")
    elif "count" in data:
        count = reader.integer(f"{field}.count", data["count"], minimum=1)
        node_names = [f"{name}-{i}" for i in range(count or 0)]
    else:
        for pattern in reader.patterns(f"{field}.nodes", data["nodes"]):
            try:
                expanded = names.expand(pattern)
            except names.PatternError as error:
                reader.problem(f"{field}.nodes", str(error))
                continue
            for node_name in expanded:
                why = names.invalid_node_name(node_name)
                if why:
                    reader.problem(f"{field}.nodes", why)
                    break
            else:
                node_names.extend(expanded)
    gpu = reader.mapping(f"{field}.gpu", data.get("gpu")) or {}
    reader.unknown_keys(f"{field}.gpu", gpu, frozenset({"model", "count"}))
    model = gpu.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        reader.problem(f"{field}.gpu.model", f"expected a GPU model name, got {_kind(model)}")
        model = None
    gpu_count = reader.integer(f"{field}.gpu.count", gpu["count"], minimum=1) if "count" in gpu else None
    scenario = reader.scenario(f"{field}.scenario", data["scenario"]) if "scenario" in data else None
    dra = data.get("dra", False)
    if not isinstance(dra, bool):
        reader.problem(f"{field}.dra", f"expected true or false, got {_kind(dra)}")
        dra = False
    return _Pool(
        name=name,
        node_names=node_names,
        model=model,
        gpu_count=gpu_count,
        labels=reader.labels(f"{field}.labels", data.get("labels")),
        resources=reader.resources(f"{field}.resources", data.get("resources")),
        scenario=scenario,
        spread=_spread(reader, f"{field}.baseline", data.get("baseline")),
        dra=dra,
    )


def _hardware(
    reader: _Reader, field: str, pool: _Pool, scenario: Mapping[str, Any]
) -> tuple[str, int] | None:
    model = pool.model if pool.model is not None else scenario.get("model")
    count = pool.gpu_count if pool.gpu_count is not None else scenario.get("gpus")
    if not isinstance(model, str) or not model:
        reader.problem(f"{field}.gpu.model", "missing: set it here or as `model` in the pool's scenario")
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        reader.problem(f"{field}.gpu.count", "missing: set it here or as `gpus` in the pool's scenario")
        return None
    return model, count


def builtin_scenario() -> dict[str, Any]:
    """A healthy GPU under a training load, for pools that name no scenario."""
    return {
        "driverVersion": DEFAULT_DRIVER_VERSION,
        "defaults": {
            "temperatureCelsius": 45,
            "smClockMHz": 1980,
            "maxSmClockMHz": 1980,
            "powerWatts": 450,
            "utilizationPercent": 95,
        },
        "timeline": [],
    }


def parse(data: Any, source: str = "<fleet>", base_dir: Path | None = None) -> Fleet:
    """Build a Fleet from a parsed fleet file; scenario paths are relative to `base_dir`.

    One reader per section; each notes its problems and goes on, so one run reports them all.
    """
    reader = _Reader(source, base_dir or Path.cwd())
    top = reader.mapping("", data)
    if top is None or not top:
        raise FleetError(source, reader.problems or ["the file is empty; it needs at least `pools`"])
    reader.unknown_keys("", top, _TOP_KEYS)
    seed = _seed(reader, top.get("seed", 0))
    interval, heartbeat = _agent(reader, top.get("agent"))
    workers = reader.integer("workers", top["workers"], minimum=1) if "workers" in top else None
    fleet_labels = reader.labels("labels", top.get("labels"))
    pools = _pools(reader, top.get("pools"))
    overrides = _overrides(reader, top.get("overrides") or [], _node_names(reader, pools))
    plans = _plans(reader, pools, overrides, fleet_labels)
    _check_scenarios(reader, plans)
    if reader.problems:
        raise FleetError(source, reader.problems)
    return Fleet(
        source=source,
        seed=seed,
        interval_seconds=interval,
        heartbeat_seconds=heartbeat,
        workers=workers,
        nodes=tuple(plans),
    )


_Override = tuple[int, tuple[Mapping[str, Any], str] | None, dict[str, str]]
"""Which override (index) applies to a node, with its scenario and labels."""


def _seed(reader: _Reader, seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        reader.problem("seed", f"expected an integer, got {_kind(seed)}")
        return 0
    return seed


def _agent(reader: _Reader, raw: Any) -> tuple[float, float]:
    """`agent:`: the simulated agents' interval and heartbeat."""
    agent = reader.mapping("agent", raw) or {}
    reader.unknown_keys("agent", agent, frozenset({"intervalSeconds", "heartbeatSeconds"}))
    interval = reader.number(
        "agent.intervalSeconds", agent.get("intervalSeconds"), DEFAULT_INTERVAL_SECONDS, 0
    )
    heartbeat = reader.number(
        "agent.heartbeatSeconds", agent.get("heartbeatSeconds"), DEFAULT_HEARTBEAT_SECONDS, 0
    )
    if heartbeat < interval:
        reader.problem("agent.heartbeatSeconds", f"must be at least intervalSeconds ({interval:g})")
    if heartbeat > heartbeats.MAX_HEARTBEAT_SECONDS:
        reader.problem("agent.heartbeatSeconds", f"must be at most {heartbeats.MAX_HEARTBEAT_SECONDS}")
    return interval, heartbeat


def _pools(reader: _Reader, raw_pools: Any) -> list[_Pool]:
    """`pools:`, each read by `_pool`."""
    if not isinstance(raw_pools, list) or not raw_pools:
        reader.problem("pools", f"expected a non-empty list of pools, got {_kind(raw_pools)}")
        raw_pools = []
    return [p for i, raw in enumerate(raw_pools) if (p := _pool(reader, i, raw)) is not None]


def _node_names(reader: _Reader, pools: list[_Pool]) -> list[str]:
    """Every node of the fleet, in order; a node in two pools is a problem."""
    owner: dict[str, str] = {}
    for index, pool in enumerate(pools):
        for node_name in pool.node_names:
            if node_name in owner:
                reader.problem(f"pools[{index}].nodes", f"{node_name} is already in pool {owner[node_name]}")
            owner.setdefault(node_name, pool.name)
    return list(owner)


def _overrides(reader: _Reader, raw_overrides: Any, all_names: list[str]) -> dict[str, _Override]:
    """`overrides:`: per node, the one override that picks it."""
    overrides: dict[str, _Override] = {}
    if not isinstance(raw_overrides, list):
        reader.problem("overrides", f"expected a list, got {_kind(raw_overrides)}")
        raw_overrides = []
    for i, raw in enumerate(raw_overrides):
        field = f"overrides[{i}]"
        item = reader.mapping(field, raw)
        if item is None:
            continue
        reader.unknown_keys(field, item, _OVERRIDE_KEYS)
        if "nodes" not in item:
            reader.problem(f"{field}.nodes", "missing: the node names or patterns this override applies to")
            continue
        chosen = reader.scenario(f"{field}.scenario", item["scenario"]) if "scenario" in item else None
        labels = reader.labels(f"{field}.labels", item.get("labels"))
        for pattern in reader.patterns(f"{field}.nodes", item["nodes"]):
            try:
                picked = names.select(pattern, all_names)
            except names.PatternError as error:
                reader.problem(f"{field}.nodes", str(error))
                continue
            if not picked:
                reader.problem(f"{field}.nodes", f"{pattern!r} matches no node of the fleet")
            for node_name in picked:
                if node_name in overrides and overrides[node_name][0] != i:
                    reader.problem(
                        f"{field}.nodes",
                        f"{node_name} is also matched by overrides[{overrides[node_name][0]}]; "
                        "make the patterns disjoint",
                    )
                overrides[node_name] = (i, chosen, labels)
    return overrides


def _plans(
    reader: _Reader, pools: list[_Pool], overrides: dict[str, _Override], fleet_labels: dict[str, str]
) -> list[NodePlan]:
    """One NodePlan per node: its pool's hardware and scenario, with its override applied."""
    plans: list[NodePlan] = []
    for index, pool in enumerate(pools):
        pool_scenario, pool_source = pool.scenario or (builtin_scenario(), "built-in healthy scenario")
        hardware = _hardware(reader, f"pools[{index}]", pool, pool_scenario)
        if hardware is None:
            continue
        model, gpu_count = hardware
        resources = {**DEFAULT_RESOURCES, **pool.resources}
        for node_name in pool.node_names:
            scenario, scenario_source = pool_scenario, pool_source
            labels = {**fleet_labels, **pool.labels}
            if node_name in overrides:
                _, override_scenario, override_labels = overrides[node_name]
                labels.update(override_labels)
                if override_scenario is not None:
                    scenario, scenario_source = override_scenario
            plans.append(
                NodePlan(
                    name=node_name,
                    pool=pool.name,
                    gpu_model=model,
                    gpu_count=gpu_count,
                    labels=labels,
                    resources=resources,
                    scenario={**scenario, "model": model, "gpus": gpu_count},
                    scenario_source=scenario_source,
                    spread=pool.spread,
                    dra=pool.dra,
                )
            )
    return plans


def _check_scenarios(reader: _Reader, plans: list[NodePlan]) -> None:
    """Validate each distinct scenario (by source and hardware) the way the agent will."""
    checked: set[tuple[str, str, int]] = set()
    for plan in plans:
        key = (plan.scenario_source, plan.gpu_model, plan.gpu_count)
        if key not in checked:
            checked.add(key)
            try:
                agent_scenario.from_data(plan.scenario, plan.scenario_source)
            except agent_scenario.ScenarioError as error:
                reader.problem(f"scenario of {plan.name}", str(error))


def load(path: Path) -> Fleet:
    """Read and validate a fleet file; raises FleetError naming the file and every bad field."""
    try:
        text = path.read_text()
    except OSError as error:
        raise FleetError(str(path), [f"cannot read the file: {error.strerror or error}"]) from error
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise FleetError(str(path), [f"not valid YAML: {error}"]) from error
    return parse(data, source=str(path), base_dir=path.parent)
