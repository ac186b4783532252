"""Both backends agree: every example scenario, on the Python backend and on the simulated library.

The whole agent (runner.Agent: collector, events, history, XID catalogue) runs twice over the same
scenario and the same clock: once with `--backend sim` (simulated.SimulatedNvml in place of pynvml),
once with `--backend nvml` (the real pynvml over the simulated libnvidia-ml.so.1). At every step of
the timeline, as `gpu-health-agent check` steps it, what each would report as `status.gpus[]`,
`status.summary` and `status.nics` must be equal.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

import simnvml_build
from gpuhealth_agent import nvml, runner, scenario, simnvml, simulated

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = sorted((ROOT / "examples" / "scenarios").glob("*.yaml"))
START = 1_800_000_000.0
COMPARED = ("gpus", "summary", "nics")


class Clock:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def _agents(
    library: ctypes.CDLL, plan: scenario.Scenario, clock: Clock
) -> tuple[runner.Agent, runner.Agent, simnvml.Driver]:
    python = simulated.SimulatedNvml(
        plan, clock=clock, start=0.0, sleep=lambda _: None, identity_seed="node-a"
    )
    sim_agent = runner.Agent(
        runner.Settings("node-a", runner.BACKEND_SIM, expected_gpus=plan.expected_gpus, event_thread=False),
        python,
        clock=lambda: START + clock.seconds,
    )
    driver = simnvml.Driver(plan, clock=clock, start=0.0, identity_seed="node-a", lib=library)
    nvml_agent = runner.Agent(
        runner.Settings(
            "node-a",
            runner.BACKEND_NVML,
            expected_gpus=plan.expected_gpus,
            event_thread=False,
            sysfs_root=str(driver.sysfs_root) if driver.sysfs_root else None,
        ),
        nvml.real(),
        clock=lambda: START + clock.seconds,
    )
    return sim_agent, nvml_agent, driver


def _compared(turn: runner.TurnResult) -> dict[str, Any]:
    report: dict[str, Any] = dict(turn.status)
    return {key: report.get(key) for key in COMPARED}


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_scenario_reports_the_same_on_both_backends(path: Path) -> None:
    library = simnvml_build.preload()
    plan = scenario.load(str(path))
    clock = Clock()
    sim_agent, nvml_agent, driver = _agents(library, plan, clock)
    steps = sorted({0.0} | {e.after_seconds for e in plan.timeline} | {plan.end_seconds + 1})
    sim_agent.start(START)
    nvml_agent.start(START)
    try:
        for step in steps:
            clock.seconds = step
            expected = _compared(sim_agent.run_once(START + step))
            got = _compared(nvml_agent.run_once(START + step))
            assert got == expected, f"{path.name} at {step:g}s"
            assert expected["gpus"], "the scenario reports GPUs at all"
    finally:
        sim_agent.close()
        nvml_agent.close()
        driver.close()
