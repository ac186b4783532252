"""The examples a user copies from: every policy parses, every scenario loads, the index lists them all."""

import re
from pathlib import Path

import pytest
import yaml

from gpuhealth_agent import scenario
from gpuhealth_api import keys, resources
from gpuhealth_api.vocabulary import Health
from gpuhealth_operator.decisions import policies
from gpuhealth_operator.runtime import reconciler

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


# -- remediation tools that read the operator's GPUHealthy Node condition --------------------------------

REMEDIATION = {
    # file: (apiVersion, kind, field of the duration in each unhealthy condition)
    "remediation/capi-machinehealthcheck.yaml": ("cluster.x-k8s.io/v1beta1", "MachineHealthCheck", "timeout"),
    "remediation/medik8s-nodehealthcheck.yaml": (
        "remediation.medik8s.io/v1alpha1",
        "NodeHealthCheck",
        "duration",
    ),
}
DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")
"""A Go duration (metav1.Duration), as both CRDs validate it."""


@pytest.mark.parametrize("name", sorted(REMEDIATION))
def test_remediation_example_matches_the_condition_the_operator_writes(name: str) -> None:
    api_version, kind, duration_field = REMEDIATION[name]
    (document,) = _documents(EXAMPLES / name)
    assert (document["apiVersion"], document["kind"]) == (api_version, kind)
    spec = document["spec"]
    assert isinstance(spec, dict)
    conditions = spec["unhealthyConditions"]
    assert all(set(c) == {"type", "status", duration_field} for c in conditions), conditions
    assert all(DURATION.match(str(c[duration_field])) for c in conditions), conditions
    ours = [c for c in conditions if c["type"] == keys.NODE_CONDITION_TYPE]
    # What the operator writes on the Node for each health, and which of them mean "replace me".
    unhealthy = {reconciler.NODE_CONDITION[Health.UNHEALTHY]}
    assert [c["status"] for c in ours] == sorted(unhealthy), (
        f"{name}: must remediate GPUHealthy={sorted(unhealthy)} only"
    )
    working = {reconciler.NODE_CONDITION[h] for h in (Health.HEALTHY, Health.DEGRADED)}
    stale = reconciler.NODE_CONDITION[Health.UNKNOWN]
    assert not {c["status"] for c in ours} & (working | {stale}), (
        "never remediate working GPUs, nor a node whose agent is only stale (missing data)"
    )
