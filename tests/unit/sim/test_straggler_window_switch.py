"""The replay's straggler switch (`replayer.run(straggler_window=False)`): the rule before the window, on
each sample alone, which bench/backtest_quality.py replays to compare with. It used to assign
`stragglers.windowed` for that; a benchmark must not assign to product modules (issue 46)."""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import pytest

from gpuhealth_operator.decisions import stragglers
from gpuhealth_sim.backtest import replayer, tracegen

ROOT = pathlib.Path(__file__).resolve().parents[3]
TRACE = tracegen.Options(10, 2)
"""Ten generated node-days, seed 2: the smallest seed-2 trace on which the window changes an action."""


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    tracegen.generate(TRACE, path := tmp_path_factory.mktemp("switch") / "seed2.jsonl.gz")
    return path


def test_per_sample_replay_is_the_old_judgement_and_differs_from_the_window(
    trace: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = replayer.load_policy(ROOT / "examples" / "default-policy.yaml")
    windowed = replayer.run(trace, policy, 30.0).to_json()
    per_sample = replayer.run(trace, policy, 30.0, straggler_window=False).to_json()
    # The old judgement as the benchmark used to get it (the test may patch; the benchmark may not).
    monkeypatch.setattr(stragglers, "windowed", lambda _samples, score, *_, **__: score)
    patched = replayer.run(trace, policy, 30.0).to_json()
    monkeypatch.undo()
    for run in (windowed, per_sample, patched):
        run.pop("replaySeconds")  # how long it took, not what it judged
        run.pop("replayCpuSeconds")
    assert per_sample == patched
    assert per_sample["nodeActions"] != windowed["nodeActions"], "the switch changed no judgement"


def _assigned_product_attributes(path: pathlib.Path) -> list[str]:
    """`module.name = ...` (or augmented) in `path` where `module` is imported from gpuhealth_*."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    product: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuhealth_"):
            product.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            product.update(
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("gpuhealth_")
            )
    found: list[str] = []
    for node in ast.walk(tree):
        targets: list[Any] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            base = target
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(target, ast.Attribute) and isinstance(base, ast.Name) and base.id in product:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(target)}")
    return found


def test_no_benchmark_assigns_to_product_code() -> None:
    found = [
        hit for path in sorted((ROOT / "bench").glob("*.py")) for hit in _assigned_product_attributes(path)
    ]
    assert not found, found
