"""Examples that users copy must not state a default XID set the catalogue does not have.

Every XID an example policy lists is one the catalogue knows, and the default set an example
(or the policy reference) writes out is exactly the catalogue's critical set.
"""

import re
from pathlib import Path

import pytest
import yaml

from gpuhealth_api import resources, xid_catalogue

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
DEFAULT_XIDS = re.compile(r"default XIDs?:\s*([\d ,]+)", re.IGNORECASE)
DOCUMENTED_DEFAULT = "pools/h100-training.yaml"
"""The example that writes the default set out in a comment (the others say "the catalogue's")."""


def _stated_defaults() -> list[tuple[str, frozenset[int]]]:
    stated = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if match := DEFAULT_XIDS.search(line):
                codes = frozenset(int(code) for code in re.findall(r"\d+", match.group(1)))
                stated.append((f"{path.relative_to(EXAMPLES)}:{number}", codes))
    return stated


def _listed_xids() -> list[tuple[str, int]]:
    """Every XID code an example policy's rules list, with where it is listed."""
    listed = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(document, dict) or document.get("kind") != resources.POLICY_KIND:
                continue
            for rule in document["spec"]["rules"]:
                for code in rule.get("xids") or []:
                    listed.append((f"{path.relative_to(EXAMPLES)} rule {rule['name']}", code))
    return listed


def test_the_documented_example_states_the_default_set() -> None:
    assert any(where.startswith(DOCUMENTED_DEFAULT + ":") for where, _ in _stated_defaults()), (
        f"{DOCUMENTED_DEFAULT} no longer writes out the default XID set: update DOCUMENTED_DEFAULT"
    )


@pytest.mark.parametrize(("where", "codes"), _stated_defaults())
def test_a_default_xid_set_stated_in_an_example_is_the_catalogues(where: str, codes: frozenset[int]) -> None:
    assert codes == xid_catalogue.default_critical(), (
        f"{where}: not the catalogue's default XID set {sorted(xid_catalogue.default_critical())}"
    )


def test_every_xid_an_example_policy_lists_is_in_the_catalogue() -> None:
    known = {info.code for info in xid_catalogue.Catalogue.packaged().entries()}
    unknown = [(where, code) for where, code in _listed_xids() if code not in known]
    assert unknown == [], f"example policies list XIDs the catalogue does not know: {unknown}"


def test_the_policy_reference_states_the_catalogues_default() -> None:
    (row,) = [r for r in (ROOT / "docs/policy.md").read_text().splitlines() if r.startswith("| `xids` |")]
    default = row.split("|")[3]
    assert frozenset(int(c) for c in re.findall(r"\d+", default)) == xid_catalogue.default_critical()
