"""The examples a user copies from: every policy parses, every scenario loads, the index lists them all."""

from pathlib import Path

import pytest
import yaml

from gpuhealth_agent import scenario
from gpuhealth_api import resources
from gpuhealth_operator.decisions import policies

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _documents(path: Path) -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _policy_files() -> list[Path]:
    return sorted(
        path
        for path in EXAMPLES.rglob("*.yaml")
        if any(d.get("kind") == resources.POLICY_KIND for d in _documents(path))
    )


def _scenario_files() -> list[Path]:
    return sorted((EXAMPLES / "scenarios").glob("*.yaml"))


def test_examples_hold_policies_and_scenarios() -> None:
    names = {p.relative_to(EXAMPLES).as_posix() for p in _policy_files()}
    assert {"default-policy.yaml", "dry-run-policy.yaml"} <= names
    assert any(name.startswith("pools/") for name in names)
    assert len(_scenario_files()) >= 8


@pytest.mark.parametrize("path", _policy_files(), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_policy_parses_with_the_operators_parser(path: Path) -> None:
    for document in _documents(path):
        assert document["apiVersion"] == resources.API_VERSION
        metadata = document["metadata"]
        assert isinstance(metadata, dict)
        spec = document["spec"]
        assert isinstance(spec, dict)
        policy = policies.parse_policy(str(metadata["name"]), 1, spec)
        assert policy.rules, f"{path}: a policy without rules does nothing"


def test_dry_run_example_is_conservative() -> None:
    (document,) = _documents(EXAMPLES / "dry-run-policy.yaml")
    spec = document["spec"]
    assert isinstance(spec, dict)
    policy = policies.parse_policy("dry-run", 1, spec)
    assert policy.dry_run is True
    assert policies.resolve_max_unavailable(policy, 1000) == 1
    sustained = [r for r in policy.rules if r.action.value in {"Label", "Event"} and r.for_seconds]
    assert sustained and min(r.for_seconds for r in sustained) >= 600


@pytest.mark.parametrize("path", _scenario_files(), ids=lambda p: p.name)
def test_scenario_loads_with_the_agents_loader(path: Path) -> None:
    loaded = scenario.load(path)
    assert loaded.gpus >= 1


def test_readme_lists_every_example_file() -> None:
    readme = (EXAMPLES / "README.md").read_text()
    missing = [
        p.relative_to(EXAMPLES).as_posix()
        for p in sorted(EXAMPLES.rglob("*.yaml"))
        if f"({p.relative_to(EXAMPLES).as_posix()})" not in readme
    ]
    assert missing == [], f"examples/README.md does not link: {missing}"
