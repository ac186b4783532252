"""spec.activeChecks[]: parsing active checks into typed, frozen entries with the contract's defaults."""

import dataclasses
import re

import pytest

from gpuhealth_operator.decisions import model, policies

RULES = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]

DESIGN_CHECK = {
    "name": "quick",
    "template": "DcgmDiagQuick",
    "everySeconds": 86400,
    "idleForSeconds": 900,
    "timeoutSeconds": 900,
    "maxConcurrent": "5%",
    "threshold": 3.5,
}


def parse(checks: object) -> model.Policy:
    return policies.parse_policy("p", 1, {"rules": RULES, "activeChecks": checks})


def test_the_contracts_example_parses_field_for_field() -> None:
    (check,) = parse([DESIGN_CHECK]).active_checks
    assert check == model.ActiveCheck(
        name="quick",
        template="DcgmDiagQuick",
        every_seconds=86400.0,
        idle_for_seconds=900.0,
        timeout_seconds=900.0,
        max_concurrent="5%",
        threshold=3.5,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        check.name = "other"  # type: ignore[misc]


def test_omitted_means_no_checks_and_optional_fields_take_the_defaults() -> None:
    assert policies.parse_policy("p", 1, {"rules": RULES}).active_checks == ()
    assert parse(None).active_checks == ()
    (check,) = parse([{"name": "full", "template": "DcgmDiag"}]).active_checks
    assert check.every_seconds == policies.DEFAULT_CHECK_EVERY_SECONDS == 604800.0
    assert check.idle_for_seconds == policies.DEFAULT_CHECK_IDLE_FOR_SECONDS == 900.0
    assert check.timeout_seconds == policies.DEFAULT_CHECK_TIMEOUT_SECONDS == 900.0
    assert check.max_concurrent == policies.DEFAULT_CHECK_MAX_CONCURRENT == 1
    assert check.threshold is None


def test_an_integer_max_concurrent_and_zero_idle_time_are_kept() -> None:
    (check,) = parse([{**DESIGN_CHECK, "maxConcurrent": 3, "idleForSeconds": 0}]).active_checks
    assert (check.max_concurrent, check.idle_for_seconds) == (3, 0.0)


def test_several_checks_keep_their_order() -> None:
    checks = parse([DESIGN_CHECK, {"name": "deep", "template": "DcgmDiag", "everySeconds": 604800}])
    assert [c.name for c in checks.active_checks] == ["quick", "deep"]


# (id, the activeChecks value, the field the error names)
BAD: list[tuple[str, object, str]] = [
    ("not-a-list", DESIGN_CHECK, "spec.activeChecks: must be a list"),
    ("entry-not-an-object", ["quick"], "spec.activeChecks[0]: must be an object"),
    ("no-name", [{"template": "DcgmDiag"}], "spec.activeChecks[0].name"),
    ("name-uppercase", [{**DESIGN_CHECK, "name": "Quick"}], "spec.activeChecks[0].name"),
    ("name-too-long", [{**DESIGN_CHECK, "name": "a" * 64}], "spec.activeChecks[0].name"),
    ("duplicate-name", [DESIGN_CHECK, DESIGN_CHECK], "spec.activeChecks[1].name: duplicate"),
    ("no-template", [{"name": "quick"}], "spec.activeChecks[0].template"),
    ("empty-template", [{**DESIGN_CHECK, "template": ""}], "spec.activeChecks[0].template"),
    ("template-with-space", [{**DESIGN_CHECK, "template": "Dcgm Diag"}], "spec.activeChecks[0].template"),
    ("every-59", [{**DESIGN_CHECK, "everySeconds": 59}], "spec.activeChecks[0].everySeconds"),
    ("every-fraction", [{**DESIGN_CHECK, "everySeconds": 60.5}], "spec.activeChecks[0].everySeconds"),
    ("timeout-0", [{**DESIGN_CHECK, "timeoutSeconds": 0}], "spec.activeChecks[0].timeoutSeconds"),
    ("timeout-string", [{**DESIGN_CHECK, "timeoutSeconds": "900"}], "spec.activeChecks[0].timeoutSeconds"),
    ("idle-negative", [{**DESIGN_CHECK, "idleForSeconds": -1}], "spec.activeChecks[0].idleForSeconds"),
    ("concurrent-0", [{**DESIGN_CHECK, "maxConcurrent": 0}], "spec.activeChecks[0].maxConcurrent"),
    ("concurrent-0%", [{**DESIGN_CHECK, "maxConcurrent": "0%"}], "spec.activeChecks[0].maxConcurrent"),
    ("concurrent-bool", [{**DESIGN_CHECK, "maxConcurrent": True}], "spec.activeChecks[0].maxConcurrent"),
    ("threshold-0", [{**DESIGN_CHECK, "threshold": 0}], "spec.activeChecks[0].threshold"),
    ("threshold-nan", [{**DESIGN_CHECK, "threshold": float("nan")}], "spec.activeChecks[0].threshold"),
    (
        "too-many",
        [{"name": f"c{i}", "template": "T"} for i in range(9)],
        "spec.activeChecks: must have at most 8",
    ),
]


@pytest.mark.parametrize(("case", "checks", "message"), BAD, ids=[case for case, _, _ in BAD])
def test_a_bad_check_raises_naming_the_field(case: str, checks: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse(checks)


def test_a_bad_check_leaves_the_spec_it_was_given_unchanged() -> None:
    checks = [DESIGN_CHECK, {"name": "quick", "template": "DcgmDiag"}]
    before = [dict(c) for c in checks]
    with pytest.raises(ValueError):
        parse(checks)
    assert checks == before


def test_resolve_check_max_concurrent_counts_nodes_and_is_at_least_one() -> None:
    (pct,) = parse([DESIGN_CHECK]).active_checks
    assert policies.resolve_check_max_concurrent(pct, 200) == 10
    assert policies.resolve_check_max_concurrent(pct, 10) == 1
    assert policies.resolve_check_max_concurrent(dataclasses.replace(pct, max_concurrent=4), 2) == 4
