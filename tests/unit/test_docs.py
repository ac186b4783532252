"""The docs say what the code does: generated tables are current, links resolve."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import hack_scripts
from gpuhealth_agent import xids
from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import policies

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OWN_PAGES = [
    "README.md",
    "alerts.md",
    "architecture.md",
    "policy.md",
    "conditions.md",
    "operations.md",
    "troubleshooting.md",
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_xid_table_in_conditions_md_matches_the_catalogue() -> None:
    generator = hack_scripts.load("gen-xid-table.py", "gen_xid_table")
    table = generator.render(generator.entries())
    document = (DOCS / "conditions.md").read_text()
    assert generator.splice(document, table) == document, (
        "docs/conditions.md's XID table differs from api/gpuhealth_api/xid_catalogue.yaml: "
        "run .venv/bin/python hack/gen-xid-table.py"
    )


def test_xid_table_has_a_row_per_catalogue_entry() -> None:
    generator = hack_scripts.load("gen-xid-table.py", "gen_xid_table")
    rows = generator.render(generator.entries()).splitlines()[2:]
    assert len(rows) == len(xids.Catalogue.packaged())
    assert any(row.startswith("| 79 |") and row.endswith("| yes |") for row in rows)


def test_the_default_critical_xids_are_the_catalogues() -> None:
    assert xids.Catalogue.packaged().critical == policies.DEFAULT_CRITICAL_XIDS


def test_condition_catalogue_names_every_condition() -> None:
    text = (DOCS / "conditions.md").read_text()
    for condition in vocabulary.Condition:
        assert f"| `{condition.value}` |" in text, f"docs/conditions.md has no row for {condition.value}"


def test_operations_md_explains_every_event_reason_and_node_action() -> None:
    text = (DOCS / "operations.md").read_text()
    for reason in [*vocabulary.EventReason, *vocabulary.Condition]:
        assert f"`{reason.value}`" in text, f"docs/operations.md does not explain Event reason {reason.value}"
    for action in vocabulary.NodeAction:
        assert f"| `{action.value}` |" in text, (
            f"docs/operations.md does not explain status.action {action.value}"
        )


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", OWN_PAGES)
def test_links_resolve(page: str) -> None:
    path = DOCS / page
    if not path.exists():
        pytest.fail(f"docs/{page} is missing")
    broken = []
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", path.read_text(), flags=re.S))
    for target in LINK.findall(prose):
        if re.match(r"^[a-z]+:", target):
            continue  # external
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        missing_anchor = bool(anchor) and linked.suffix == ".md" and anchor not in _anchors(linked)
        if not linked.exists() or missing_anchor:
            broken.append(target)
    assert broken == [], f"docs/{page}: broken links {broken}"


def test_index_lists_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    missing = [
        p.name for p in sorted(DOCS.glob("*.md")) if p.name != "README.md" and f"]({p.name})" not in index
    ]
    assert missing == [], f"docs/README.md does not list {missing}"


def _crd_spec_properties() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / "crds" / "gpuhealth.io_gpuhealthpolicies.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    properties: dict[str, Any] = schema["properties"]["spec"]["properties"]
    return properties


def _documented_default(field: str) -> str:
    """The `default` cell of the row for `field` in one of policy.md's field tables."""
    for line in (DOCS / "policy.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] == f"`{field}`":
            return cells[2]
    raise AssertionError(f"docs/policy.md has no row for `{field}`")


def test_policy_md_defaults_match_the_crd_and_the_operator() -> None:
    spec = _crd_spec_properties()
    rule = spec["rules"]["items"]["properties"]
    crd_defaults = {
        "dryRun": spec["dryRun"]["default"],
        "maxUnavailable": spec["maxUnavailable"]["default"],
        "forSeconds": rule["forSeconds"]["default"],
        "timeoutSeconds": spec["drain"]["properties"]["timeoutSeconds"]["default"],
        "deleteEmptyDirData": spec["drain"]["properties"]["deleteEmptyDirData"]["default"],
        "force": spec["drain"]["properties"]["force"]["default"],
        "uncordon": spec["recovery"]["properties"]["uncordon"]["default"],
        "healthyForSeconds": spec["recovery"]["properties"]["healthyForSeconds"]["default"],
        "maxNewUnhealthy": spec["breaker"]["properties"]["maxNewUnhealthy"]["default"],
        "windowSeconds": spec["breaker"]["properties"]["windowSeconds"]["default"],
        "maxUnavailableGPUs": spec["maxUnavailableGPUs"]["default"],
        "maxGPUsPerNode": spec["isolation"]["properties"]["maxGPUsPerNode"]["default"],
        "effect": spec["isolation"]["properties"]["effect"]["default"],
    }
    for field, default in crd_defaults.items():
        shown = json.dumps(default).lower() if isinstance(default, bool) else json.dumps(default)
        assert _documented_default(field) == f"`{shown}`", f"policy.md default of {field}"
    assert _documented_default("threshold") == f"`{policies.DEFAULT_STRAGGLER_THRESHOLD:g}`"
    assert _documented_default("maxGPUsPerNode") == f"`{policies.DEFAULT_MAX_GPUS_PER_NODE}`"
    xid_list = ", ".join(str(x) for x in sorted(policies.DEFAULT_CRITICAL_XIDS))
    assert _documented_default("xids") == f"`[{xid_list}]`"


def _operator_module_table() -> set[str]:
    """The module paths the operator's module table in architecture.md names (its first column)."""
    text = (DOCS / "architecture.md").read_text()
    start = text.index("### `operator/gpuhealth_operator`")
    section = text[start : text.index("\n### ", start + 1)]
    named: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            named.update(re.findall(r"`([\w/]+\.py)`", line.split(" | ")[0]))
    return named


def test_architecture_md_module_table_names_every_operator_module() -> None:
    # A new contributor finds the room for a change from this table: every module is in it, by
    # its path under operator/gpuhealth_operator/, and every path in it exists.
    package = ROOT / "operator" / "gpuhealth_operator"
    modules = {str(path.relative_to(package)) for path in package.rglob("*.py") if path.name != "__init__.py"}
    named = _operator_module_table()
    assert sorted(modules - named) == [], "modules missing from docs/architecture.md's operator table"
    assert sorted(named - modules) == [], "paths in docs/architecture.md's operator table that do not exist"
