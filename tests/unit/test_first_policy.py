"""The first policy a new user applies only records what it would do.

README's real-cluster path is what a new user copies: its first `kubectl apply`
of an example policy must be a dry-run policy, or that first apply drains nodes.
The same holds for every example file whose header comments tell the user to apply it first.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Final

import yaml

from gpuhealth_api import resources

ROOT: Final = Path(__file__).resolve().parents[2]
APPLY: Final = re.compile(r"kubectl apply -f (examples/\S+\.yaml)")


def policy(path: Path) -> dict[str, Any]:
    (found,) = [
        d
        for d in yaml.safe_load_all(path.read_text())
        if isinstance(d, dict) and d.get("kind") == resources.POLICY_KIND
    ]
    return found


def applied_in_order(markdown: str) -> list[str]:
    return APPLY.findall(markdown)


def test_the_readme_applies_a_dry_run_policy_first() -> None:
    readme = (ROOT / "README.md").read_text()
    real_cluster = readme[readme.index("## On a real cluster") :]
    applied = applied_in_order(real_cluster)
    assert applied, "README's real-cluster path applies a policy"
    first = policy(ROOT / applied[0])
    assert first["spec"].get("dryRun") is True, f"README's first `kubectl apply -f {applied[0]}` would act"


def test_every_doc_that_walks_a_first_install_applies_a_dry_run_policy_first() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        applied = applied_in_order(doc.read_text())
        if applied:
            first = policy(ROOT / applied[0])
            assert first["spec"].get("dryRun") is True, f"{doc.name}: first apply of {applied[0]} would act"


def test_an_acting_example_does_not_claim_to_start_in_dry_run() -> None:
    """A line that says `dryRun: true` beside an acting policy is how the README misled."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            match = APPLY.search(line)
            if match and "dryRun: true" in line:
                assert policy(ROOT / match.group(1))["spec"].get("dryRun") is True, f"{doc.name}: {line}"
