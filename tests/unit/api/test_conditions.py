"""The conditions table (`gpuhealth_api.conditions`): one row per condition, consistent, and the CRDs and the
chart's values schema say what the rows say.

The CRDs and the chart are read, not generated: a condition added to the table but not to a manifest (or the
other way round) fails here, naming the manifest.
"""

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_api import conditions, status, vocabulary

Condition = vocabulary.Condition
Kind = conditions.Kind
Scope = conditions.Scope

ROOT = Path(__file__).resolve().parents[3]
POLICY_CRDS = [
    ROOT / "crds" / "gpuhealth.io_gpuhealthpolicies.yaml",
    ROOT / "charts" / "gpu-health" / "crds" / "gpuhealth.io_gpuhealthpolicies.yaml",
]
VALUES_SCHEMA = ROOT / "charts" / "gpu-health" / "values.schema.json"


def path_type(record: type, path: str) -> Any:
    """The annotated type at a dotted path of a status TypedDict (`ecc.uncorrectedVolatile` → int)."""
    kind: Any = record
    for part in path.split("."):
        hints = typing.get_type_hints(kind)
        assert part in hints, f"{path}: {part} is no field of {kind.__name__}"
        kind = hints[part]
    return kind


def test_every_condition_has_exactly_one_row() -> None:
    named = [row.condition for row in conditions.ROWS]
    assert sorted(named) == sorted(Condition)
    assert len(set(named)) == len(named)


@pytest.mark.parametrize("row", conditions.ROWS, ids=lambda row: row.condition.value)
def test_a_row_is_consistent(row: conditions.Row) -> None:
    judged_per_gpu = row.scope is Scope.GPU
    assert (row.check is not None) is judged_per_gpu
    assert bool(row.reads) is (row.scope in (Scope.GPU, Scope.NODE))
    assert bool(row.healthy) is (row.scope in (Scope.GPU, Scope.NODE))
    for path in row.reads:
        path_type(status.GPUStatus if judged_per_gpu else status.Nic, path)
    assert row.moving <= row.fields
    assert row.waits <= set(row.reads)
    assert (row.default_threshold is not None) is bool(row.counters)
    if row.counters:
        assert row.rule_threshold
        assert all(any(c == p or c.startswith(f"{p}.") for p in row.reads) for c in row.counters)
    if row.isolatable:
        assert (row.kind, row.scope) == (Kind.FATAL, Scope.GPU)
    if row.kind is Kind.BLIND:
        assert row.scope is Scope.AGENT
    if not row.rule:
        assert row.kind is Kind.BLIND


def test_derived_sets_partition_the_conditions() -> None:
    assert set(Condition) == conditions.FATAL | conditions.SUSTAINED | conditions.BLIND
    assert not conditions.FATAL & conditions.SUSTAINED
    assert list(conditions.gpu_checks(frozenset())) == list(conditions.GPU_CONDITIONS)
    assert set(conditions.READS) == set(conditions.GPU_CONDITIONS)
    assert list(conditions.ORDER) == [row.condition for row in conditions.ROWS]
    assert set(conditions.DEFAULT_THRESHOLDS) < set(conditions.THRESHOLD_CONDITIONS)


def test_a_trend_predicate_reads_its_counters() -> None:
    for condition, counters in conditions.GPU_COUNTERS.items():
        fields = conditions.BY_CONDITION[condition].fields
        assert {counter.split(".", 1)[0] for counter in counters} <= fields


def policy_rule_schema(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (version,) = crd["spec"]["versions"]
    rules = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["rules"]
    items: dict[str, Any] = rules["items"]
    return items


def cel_list(schema: dict[str, Any], field: str) -> set[str]:
    """The names a CEL rule of `schema` lists for `field` (`... self.condition in ['A', 'B'] ...`)."""
    for rule in schema["x-kubernetes-validations"]:
        if rule.get("fieldPath") == f".{field}" and "self.condition in [" in rule["rule"]:
            listed = re.search(r"self\.condition in \[([^\]]*)\]", rule["rule"])
            assert listed is not None
            return set(re.findall(r"'([^']*)'", listed.group(1)))
    raise AssertionError(f"no CEL rule lists the conditions for {field}")


@pytest.mark.parametrize("path", POLICY_CRDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_policy_crd_enums_are_the_rows(path: Path) -> None:
    schema = policy_rule_schema(path)
    assert schema["properties"]["condition"]["enum"] == [c.value for c in conditions.RULE_CONDITIONS]
    assert cel_list(schema, "action") == {c.value for c in conditions.PER_GPU_CONDITIONS}
    assert cel_list(schema, "threshold") == {c.value for c in conditions.THRESHOLD_CONDITIONS}


def condition_enums(schema: object) -> list[list[str]]:
    """Every enum of a `condition` property in a JSON schema."""
    found = []
    if isinstance(schema, dict):
        condition = schema.get("properties", {}).get("condition")
        if isinstance(condition, dict) and "enum" in condition:
            found.append(condition["enum"])
        for value in schema.values():
            found += condition_enums(value)
    elif isinstance(schema, list):
        for value in schema:
            found += condition_enums(value)
    return found


def test_the_chart_values_schema_names_the_rule_conditions() -> None:
    enums = condition_enums(json.loads(VALUES_SCHEMA.read_text()))
    assert enums
    for enum in enums:
        assert sorted(enum) == sorted(c.value for c in conditions.RULE_CONDITIONS)


def test_gpu_paths_are_what_the_rows_read_in_status_order() -> None:
    for row in conditions.ROWS:
        for path in row.reads if row.scope is Scope.GPU else ():
            field, _, rest = path.partition(".")
            keys = conditions.GPU_PATHS[field]
            assert keys is None or rest.split(".", 1)[0] in keys, path
    order = [field for field in status.GPUStatus.__annotations__ if field in conditions.GPU_PATHS]
    assert list(conditions.GPU_PATHS) == order
