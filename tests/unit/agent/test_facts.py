"""The fact table: every row is read, simulated, accepted by scenarios, silenced by its group and exported."""

from typing import Any

import prometheus_client
import pynvml
import pytest

from gpuhealth_agent import collector, facts, metrics, nvml, scenario, simulated

START = 1_800_000_000.0


def unusual(fact: facts.Fact) -> Any:
    """A value of the fact that no GPU model's defaults have, so reading it proves the row works."""
    if fact.type in (facts.Type.INT, *facts.COUNTING_TYPES):
        return int(fact.default) + 7
    if fact.type is facts.Type.FLOAT:
        return float(fact.default) + 12.5
    if fact.type is facts.Type.BOOL:
        return not fact.default
    if fact.type is facts.Type.STR:
        return "1650000000042"
    if fact.type is facts.Type.REASONS:
        return ["SwPowerCap", "HwSlowdown"]  # in bit order, as NVML masks decode
    return "GpuReset"  # Type.RECOVERY


def dig(gpu: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(gpu, dict) or name not in gpu:
            return None
        gpu = gpu[name]
    return gpu


def read(data: dict[str, Any]) -> collector.Sample:
    plan = scenario.from_data(data, "test")
    sim = simulated.SimulatedNvml(plan, clock=lambda: 0.0, start=0.0, identity_seed="facts")
    return collector.Collector(sim, expected_gpus=plan.expected_gpus).sample(START)


def test_every_row_is_read_by_exactly_one_query() -> None:
    read_by = [fact for query in collector.QUERIES for fact in query.facts]
    assert sorted(f.key for f in read_by) == sorted(f.key for f in facts.FACTS)
    for query in collector.QUERIES:
        assert {f.tier for f in query.facts} == {query.tier}, query.function


def test_keys_and_paths_are_unique() -> None:
    assert len({f.key for f in facts.FACTS}) == len(facts.FACTS)
    assert len({f.path for f in facts.FACTS}) == len(facts.FACTS)


def test_every_function_is_pynvmls_and_a_fail_target() -> None:
    for name in facts.FUNCTIONS:
        assert hasattr(pynvml, name), name
        assert name in scenario.SIMULATED_FUNCTIONS, name


@pytest.mark.parametrize("fact", facts.FACTS, ids=lambda f: f.key)
def test_a_row_is_simulated_read_and_exported(fact: facts.Fact) -> None:
    value = unusual(fact)
    sample = read({"gpus": 1, "defaults": {fact.key: value}})
    gpu = sample.gpus[0]
    assert dig(gpu, fact.path) == value
    assert not sample.errors
    registry = prometheus_client.CollectorRegistry()
    metrics.AgentMetrics(registry).observe(sample)
    if fact.metric is None:
        assert fact.type is facts.Type.STR  # only text facts have no gauge
        return
    name = f"{metrics.PREFIX}_{fact.metric.name}"
    labels = {"gpu": "0", "uuid": gpu["uuid"], **dict(zip(fact.metric.labels, fact.labels, strict=False))}
    if fact.type is facts.Type.REASONS:
        assert registry.get_sample_value(name, {**labels, "reason": "HwSlowdown"}) == 1
        assert registry.get_sample_value(name, {**labels, "reason": "GpuIdle"}) == 0
    elif fact.type is facts.Type.RECOVERY:
        assert registry.get_sample_value(name, labels) == facts.RECOVERY_CODES[value]
    else:
        assert registry.get_sample_value(name, labels) == float(value)


@pytest.mark.parametrize("fact", facts.FACTS, ids=lambda f: f.key)
def test_a_rows_group_silences_it(fact: facts.Fact) -> None:
    sample = read({"gpus": 1, "defaults": {"notSupported": [fact.group]}})
    assert dig(sample.gpus[0], fact.path) is None
    assert not sample.errors  # NOT_SUPPORTED is not an error


@pytest.mark.parametrize("fact", facts.FACTS, ids=lambda f: f.key)
def test_a_scenario_can_make_a_rows_function_fail(fact: facts.Fact) -> None:
    sample = read(
        {
            "gpus": 1,
            "timeline": [{"after": 0, "gpu": 0, "fail": {"function": fact.function, "error": "Unknown"}}],
        }
    )
    assert dig(sample.gpus[0], fact.path) is None  # never read successfully: absent, not zero
    assert sample.errors[(fact.function, "Unknown")] >= 1


def test_memory_info_asks_for_version_2_and_falls_back() -> None:
    plan = scenario.from_data({"gpus": 1, "defaults": {"memoryUsedMiB": 100}})
    sim = simulated.SimulatedNvml(plan, clock=lambda: 0.0, start=0.0)
    asked: list[int | None] = []

    class OldDriver:
        """A driver without nvmlDeviceGetMemoryInfo_v2."""

        def __getattr__(self, name: str) -> Any:
            return getattr(sim, name)

        def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
            asked.append(version)
            if version is not None:
                raise nvml.error("FunctionNotFound")
            return sim.nvmlDeviceGetMemoryInfo(handle)

    handle = sim.nvmlDeviceGetHandleByIndex(0)
    assert nvml.call(sim, "nvmlDeviceGetMemoryInfo", handle).version == pynvml.nvmlMemory_v2
    info = nvml.call(OldDriver(), "nvmlDeviceGetMemoryInfo", handle)  # type: ignore[arg-type]
    assert asked == [pynvml.nvmlMemory_v2, None]
    assert info.used == 100 * 2**20
