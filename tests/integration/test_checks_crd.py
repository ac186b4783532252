"""spec.activeChecks as the API server validates it: a bad check is rejected naming the field.

Policies here select only a label no Node has (objects are cluster-scoped in a shared cluster).
"""

import json
import re
from typing import Any

import pytest
from kubernetes import client

from gpuhealth_api import resources
from gpuhealth_operator.decisions import model, policies
from gpuhealth_sim.controlplane import local

pytestmark = pytest.mark.integration

SELECTOR_LABEL = "gpuhealth.io/test-checks-crd"
RULES = [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}]
QUICK = {"name": "quick", "template": "DcgmDiagQuick"}


def body(name: str, checks: object) -> dict[str, Any]:
    return {
        "apiVersion": resources.API_VERSION,
        "kind": resources.POLICY_KIND,
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": {SELECTOR_LABEL: name}},
            "rules": RULES,
            "activeChecks": checks,
        },
    }


def check(**fields: object) -> dict[str, object]:
    return {**QUICK, **fields}


# (id, spec.activeChecks, the field the error must name)
MALFORMED: list[tuple[str, object, str]] = [
    ("no-name", [{"template": "DcgmDiag"}], "spec.activeChecks[0].name"),
    ("name-uppercase", [check(name="Quick")], "spec.activeChecks[0].name"),
    ("no-template", [{"name": "quick"}], "spec.activeChecks[0].template"),
    ("empty-template", [check(template="")], "spec.activeChecks[0].template"),
    ("template-with-space", [check(template="Dcgm Diag")], "spec.activeChecks[0].template"),
    ("every-59", [check(everySeconds=59)], "spec.activeChecks[0].everySeconds"),
    ("timeout-0", [check(timeoutSeconds=0)], "spec.activeChecks[0].timeoutSeconds"),
    ("idle-negative", [check(idleForSeconds=-1)], "spec.activeChecks[0].idleForSeconds"),
    ("concurrent-0", [check(maxConcurrent=0)], "spec.activeChecks[0].maxConcurrent"),
    ("concurrent-0-percent", [check(maxConcurrent="0%")], "spec.activeChecks[0].maxConcurrent"),
    ("concurrent-word", [check(maxConcurrent="five")], "spec.activeChecks[0].maxConcurrent"),
    ("threshold-0", [check(threshold=0)], "spec.activeChecks[0].threshold"),
    ("duplicate-name", [QUICK, check(template="DcgmDiag")], "spec.activeChecks[1]"),
    ("too-many", [check(name=f"c{i}") for i in range(policies.MAX_ACTIVE_CHECKS + 1)], "spec.activeChecks"),
    ("check-typo", [check(every=60)], "spec.activeChecks[0].every"),
]
PRUNED = {"check-typo"}
OPERATOR_FIELD = {"duplicate-name": "spec.activeChecks[1].name"}


def names_field(message: str, field: str) -> bool:
    """Whether an error message names exactly this field (not only a parent or child of it)."""
    return re.search(rf"(?:^|[^\w.\]])\.?{re.escape(field)}(?![\w.\[])", message) is not None


def exists(k8s: client.ApiClient, name: str) -> bool:
    try:
        client.CustomObjectsApi(k8s).get_cluster_custom_object(
            resources.GROUP, resources.VERSION, resources.POLICY_PLURAL, name
        )
    except client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


@pytest.mark.parametrize(("case", "checks", "field"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
def test_a_bad_check_is_rejected_naming_the_field(
    crds: local.ControlPlane, k8s: client.ApiClient, case: str, checks: object, field: str
) -> None:
    name = f"checks-crd-{case}"
    result = crds.kubectl("apply", "-f", "-", input=json.dumps(body(name, checks)), check=False)
    assert result.returncode != 0, f"accepted: {json.dumps(checks)}"
    assert names_field(result.stderr, field), result.stderr
    assert not exists(k8s, name), "a rejected policy must not be stored"
    if case in PRUNED:
        return  # the API server's decoder refuses it; the operator never sees the unknown field
    with pytest.raises(ValueError, match=re.escape(OPERATOR_FIELD.get(case, field))):  # the operator agrees
        policies.parse_policy(name, 1, body(name, checks)["spec"])


def test_a_good_check_is_stored_with_its_defaults_and_parses(crds: local.ControlPlane) -> None:
    checks = [
        check(),
        check(name="deep", template="DcgmDiag", everySeconds=604800, maxConcurrent="5%", threshold=3.5),
    ]
    result = crds.kubectl(
        "apply", "--server-side", "--dry-run=server", "-o", "json", "-f", "-",
        input=json.dumps(body("checks-crd-good", checks)),
    )  # fmt: skip
    spec = json.loads(result.stdout)["spec"]
    assert spec["activeChecks"][0] == {
        **QUICK, "everySeconds": 604800, "idleForSeconds": 900, "timeoutSeconds": 900, "maxConcurrent": 1,
    }  # fmt: skip
    parsed = policies.parse_policy("checks-crd-good", 1, spec).active_checks
    assert parsed == (
        model.ActiveCheck("quick", "DcgmDiagQuick", 604800.0, 900.0, 900.0, 1),
        model.ActiveCheck("deep", "DcgmDiag", 604800.0, 900.0, 900.0, "5%", 3.5),
    )
