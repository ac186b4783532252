"""Which bundled CRD the operator's `apply-crds` step applies: only onto an older one, never a downgrade.

Helm never upgrades a chart's crds/, so the chart hands its CRDs to the operator (issue 49, item 7);
a rollback to an older chart, or an older second release, must not take fields away.
"""

from typing import Any

from gpuhealth_operator.runtime import crd_upgrade


def live(version: str | None) -> dict[str, Any]:
    annotations = {} if version is None else {crd_upgrade.VERSION_ANNOTATION: version}
    return {"metadata": {"name": "gpunodes.gpuhealth.io", "annotations": annotations}}


def test_a_crd_helm_installed_without_our_stamp_is_upgraded() -> None:
    assert crd_upgrade.should_apply(live(None), "0.1.0")


def test_a_newer_chart_upgrades_an_older_stamp() -> None:
    assert crd_upgrade.should_apply(live("0.1.0"), "0.2.0")
    assert crd_upgrade.should_apply(live("0.9.0"), "0.10.0")  # numbers, not strings
    assert crd_upgrade.should_apply(live("0.2.0-rc.1"), "0.2.0")  # a release is newer than its candidate


def test_the_same_or_an_older_chart_leaves_the_crd_alone() -> None:
    assert not crd_upgrade.should_apply(live("0.2.0"), "0.2.0")
    assert not crd_upgrade.should_apply(live("0.2.0"), "0.1.0")
    assert not crd_upgrade.should_apply(live("0.2.0"), "0.2.0-rc.1")


def test_a_missing_crd_is_left_to_helm() -> None:
    """Helm creates crds/ on install; the step may patch our two CRDs, never create one."""
    assert not crd_upgrade.should_apply(None, "0.2.0")


def test_the_bundled_manifest_is_stamped_with_the_chart_version() -> None:
    manifest = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "x"},
    }
    stamped = crd_upgrade.stamped(manifest, "0.2.0")
    assert stamped["metadata"]["annotations"][crd_upgrade.VERSION_ANNOTATION] == "0.2.0"
    assert "annotations" not in manifest["metadata"]  # the input is not changed
