"""The repository layout DESIGN.md promises: plain source roots, no package markers in tests."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = {
    "api": "gpuhealth_api",
    "agent": "gpuhealth_agent",
    "operator": "gpuhealth_operator",
    "sim": "gpuhealth_sim",
    "plugin": "gpuhealth_kubectl",
}


def test_source_roots_are_plain_folders_with_one_package() -> None:
    for root, package in SOURCE_ROOTS.items():
        folder = ROOT / root
        assert not (folder / "__init__.py").exists(), f"{root}/ must not be a package"
        packages = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").exists())
        assert packages == [package], f"{root}/ must hold exactly {package}, found {packages}"
        assert (folder / package / "py.typed").exists(), f"{package} must ship py.typed"


def test_no_init_files_under_tests() -> None:
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("__init__.py")]
    assert found == []


def test_chart_crds_do_not_drift_from_top_level_crds() -> None:
    chart_crds = ROOT / "charts" / "gpu-health" / "crds"
    if not chart_crds.exists():
        return
    top = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in chart_crds.glob("*.yaml")}
    assert chart == top, "charts/gpu-health/crds/ differs from crds/: run 'make chart-crds'"
