"""Every example policy is accepted by a real API server with the CRDs installed.

Applied with server-side apply and `--dry-run=server`: the schema, defaults
and CEL rules run exactly as for a real apply, and nothing is persisted, so
the shared cluster keeps no example policy that could select other tests' nodes.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_api import resources
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FIELD_MANAGER = "gpu-health-examples-test"


def _policy_files() -> list[Path]:
    return sorted(
        path
        for path in EXAMPLES.rglob("*.yaml")
        if any(
            isinstance(d, dict) and d.get("kind") == resources.POLICY_KIND
            for d in yaml.safe_load_all(path.read_text())
        )
    )


def test_there_are_example_policies() -> None:
    assert len(_policy_files()) >= 4


@pytest.mark.parametrize("path", _policy_files(), ids=lambda p: p.relative_to(EXAMPLES).as_posix())
def test_example_policy_is_accepted(crds: local.ControlPlane, path: Path) -> None:
    result = crds.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        f"--field-manager={FIELD_MANAGER}",
        "-o",
        "yaml",
        "-f",
        str(path),
        check=False,
    )
    assert result.returncode == 0, f"{path} was rejected: {result.stderr}"
    applied = yaml.safe_load(result.stdout)
    expected = yaml.safe_load(path.read_text())
    assert applied["kind"] == resources.POLICY_KIND
    assert applied["metadata"]["name"] == expected["metadata"]["name"]
    # The API server kept every rule and filled the documented defaults.
    assert [r["name"] for r in applied["spec"]["rules"]] == [r["name"] for r in expected["spec"]["rules"]]
    assert all("forSeconds" in r for r in applied["spec"]["rules"])
    assert applied["spec"]["drain"]["timeoutSeconds"] >= 1
    assert "healthyForSeconds" in applied["spec"]["recovery"]
    if "repair" in expected["spec"]:
        # Nothing of spec.repair is pruned: every field written is kept as written (defaults may be added).
        assert _kept(expected["spec"]["repair"], applied["spec"]["repair"]), applied["spec"]["repair"]


def test_a_repair_example_is_applied() -> None:
    assert [p for p in _policy_files() if "repair" in yaml.safe_load(p.read_text())["spec"]]


def _kept(written: Any, stored: Any) -> bool:
    """Whether `stored` holds everything of `written` as written (objects may gain defaulted fields)."""
    if isinstance(written, dict):
        return isinstance(stored, dict) and all(
            k in stored and _kept(v, stored[k]) for k, v in written.items()
        )
    if isinstance(written, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(written)
            and all(_kept(w, s) for w, s in zip(written, stored, strict=True))
        )
    return bool(written == stored)
