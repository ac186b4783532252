"""Healthy baselines with a realistic spread, so a simulated fleet does not look cloned.

Real GPUs of one model differ a little: a node near the CRAC runs cooler,
one board draws a few watts more, boost clocks settle a few MHz apart. The
operator's straggler detection compares nodes with robust z-scores, so a
fleet of identical numbers would be unrealistic (a MAD of zero) and a spread
with long tails would make healthy nodes look like stragglers. Offsets are
therefore drawn from a normal distribution truncated at two standard
deviations, per node and (smaller) per GPU, seeded by the fleet seed and the
node name so that a node gets the same baseline whatever the fleet's order.

The spread is applied to the scenario's `defaults` (node offset) and as
`after: 0s` timeline entries per GPU, ahead of the scenario's own timeline,
so faults the scenario scripts later still win.
"""

import copy
import dataclasses
import random
from collections.abc import Mapping
from typing import Any

from gpuhealth_agent import models as agent_models
from gpuhealth_agent import scenario as agent_scenario
from gpuhealth_sim.fleet import fleetfile

TRUNCATE_AT_SIGMAS = 2.0
"""No healthy node strays further than this from its cohort (straggler thresholds are ~3.5)."""
PER_GPU_FRACTION = 1 / 3
"""GPUs of one node differ less than nodes do: same chassis, same airflow, same job."""


def _offset(rng: random.Random, sigma: float) -> float:
    if sigma <= 0:
        return 0.0
    limit = TRUNCATE_AT_SIGMAS * sigma
    return max(-limit, min(limit, rng.gauss(0.0, sigma)))


def node_rng(seed: int, node_name: str) -> random.Random:
    """A generator that depends only on the seed and the node's name."""
    return random.Random(f"{seed}:{node_name}")


@dataclasses.dataclass(frozen=True)
class Baseline:
    """One node's healthy values: changes to the scenario's defaults, and per-GPU values at 0 s."""

    defaults: Mapping[str, Any]
    per_gpu: tuple[Mapping[str, Any], ...]


def draw(
    defaults: Mapping[str, Any], model: str, gpus: int, spread: fleetfile.Spread, rng: random.Random
) -> Baseline:
    """This node's baseline around a scenario's `defaults` (absent fields: the model's healthy defaults)."""
    fallback = agent_models.defaults_for(model)
    temperature = defaults.get("temperatureCelsius", fallback["temperatureCelsius"])
    power = defaults.get("powerWatts", fallback["powerWatts"])
    clock = defaults.get("smClockMHz", fallback["smClockMHz"])
    max_clock = defaults.get("maxSmClockMHz", fallback["maxSmClockMHz"])

    node_temperature = _offset(rng, spread.temperature_celsius)
    node_power = _offset(rng, spread.power_watts)
    changed: dict[str, Any] = {}
    if isinstance(clock, int | float) and spread.sm_clock_mhz > 0:
        # Under load clocks sit just below the boost limit; centre the spread
        # there so it stays symmetric instead of piling up at the maximum.
        ceiling = max_clock if isinstance(max_clock, int | float) else clock
        centre = min(clock, ceiling - TRUNCATE_AT_SIGMAS * spread.sm_clock_mhz)
        changed["smClockMHz"] = round(min(ceiling, centre + _offset(rng, spread.sm_clock_mhz)))

    per_gpu: list[dict[str, Any]] = []
    for _ in range(gpus):
        values: dict[str, Any] = {}
        if isinstance(temperature, int | float) and spread.temperature_celsius > 0:
            gpu_offset = _offset(rng, spread.temperature_celsius * PER_GPU_FRACTION)
            values["temperatureCelsius"] = round(temperature + node_temperature + gpu_offset)
        if isinstance(power, int | float) and spread.power_watts > 0:
            gpu_offset = _offset(rng, spread.power_watts * PER_GPU_FRACTION)
            values["powerWatts"] = round(max(0.0, power + node_power + gpu_offset), 1)
        per_gpu.append(values)
    return Baseline(defaults=changed, per_gpu=tuple(per_gpu))


def apply(scenario: Mapping[str, Any], spread: fleetfile.Spread, rng: random.Random) -> dict[str, Any]:
    """A copy of a scenario mapping with this node's baseline folded into its healthy values."""
    result = copy.deepcopy(dict(scenario))
    model = str(result.get("model") or agent_scenario.DEFAULT_MODEL)
    baseline = draw(result.get("defaults") or {}, model, int(result.get("gpus") or 0), spread, rng)
    result["defaults"] = {**(result.get("defaults") or {}), **baseline.defaults}
    entries = [{"after": "0s", "gpu": i, "set": dict(v)} for i, v in enumerate(baseline.per_gpu) if v]
    if entries:
        result["timeline"] = entries + list(result.get("timeline") or [])
    return result


def apply_to(
    scenario: agent_scenario.Scenario, spread: fleetfile.Spread, rng: random.Random
) -> agent_scenario.Scenario:
    """The same as `apply`, on a scenario the agent has already parsed and validated.

    A thousand nodes share a handful of scenario files: validating each file
    once and drawing each node's numbers here keeps fleet start-up cheap.
    """
    baseline = draw(scenario.defaults, scenario.model, scenario.gpus, spread, rng)
    entries = tuple(
        agent_scenario.Entry(after_seconds=0.0, gpu=i, set=dict(v))
        for i, v in enumerate(baseline.per_gpu)
        if v
    )
    return dataclasses.replace(
        scenario,
        defaults={**scenario.defaults, **baseline.defaults},
        timeline=entries + scenario.timeline,
    )


def for_node(fleet: fleetfile.Fleet, plan: fleetfile.NodePlan) -> dict[str, Any]:
    """The scenario mapping a node runs: its plan's scenario with its own seeded baseline."""
    return apply(plan.scenario, plan.spread, node_rng(fleet.seed, plan.name))
