"""The replay's straggler observer (`replay.StragglerObserver`): told each sample a straggler window takes,
and bench/straggler_quality.py failing loudly when the operator no longer calls it (issue 45: the
benchmark patched a function the operator had stopped calling, and measured nothing)."""

from __future__ import annotations

import datetime
import importlib.util
import pathlib
import types
from typing import Any

import pytest

from gpuhealth_sim.backtest import replayer, tracegen

ROOT = pathlib.Path(__file__).resolve().parents[3]
POLICY = ROOT / "examples" / "default-policy.yaml"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A small generated trace: 12 nodes, 4 hours (two node-days), cohorts of at least 5."""
    path = tmp_path_factory.mktemp("trace") / "stragglers.jsonl.gz"
    tracegen.generate(tracegen.Options(2, 7), path)
    return path


def bench_module() -> types.ModuleType:
    path = ROOT / "bench" / "straggler_quality.py"
    spec = importlib.util.spec_from_file_location("straggler_quality", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_observer_is_told_each_sample_once_with_its_score(trace: pathlib.Path) -> None:
    told: list[tuple[tuple[str, str], datetime.datetime, Any]] = []
    result = replayer.run(
        trace, replayer.load_policy(POLICY), 30.0, straggler_observer=lambda k, at, s: told.append((k, at, s))
    )
    assert told, "no sample told: the hook is not called"
    nodes = {key[1] for key, _, _ in told}
    assert nodes <= result.selected and len(nodes) == result.nodes, (nodes, result.nodes)
    pairs = [(key, at) for key, at, _ in told]
    assert len(pairs) == len(set(pairs)), "a sample told twice"
    assert all(isinstance(score.z_score, float) and score.peers >= 0 for _, _, score in told)


def test_the_benchmark_records_what_the_operator_saw(trace: pathlib.Path) -> None:
    seen: dict[str, list[tuple[float, float, int]]] = {}
    result = bench_module()._run_watching(trace, seen)
    assert set(seen) == result.selected and all(seen.values())


def test_the_benchmark_fails_loudly_when_its_hook_is_not_called(
    trace: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = bench_module()
    run = replayer.run

    def without_hook(*args: Any, straggler_observer: Any = None, **kwargs: Any) -> replayer.Result:
        return run(*args, **kwargs)  # the operator no longer calls the observer

    monkeypatch.setattr(bench.replayer, "run", without_hook)
    with pytest.raises(bench.HookNotCalled, match="never called its straggler observer"):
        bench._run_watching(trace, {})
