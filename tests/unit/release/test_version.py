"""One version: `gpuhealth_api.__version__`; the package, chart, image and CHANGELOG agree with it."""

import importlib.metadata
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import hack_scripts
from gpuhealth_api import __version__

ROOT = Path(__file__).resolve().parents[3]


version = hack_scripts.load("version.py", "hack_version")


def _copy(tmp_path: Path) -> Path:
    for relative in (version.SOURCE, version.CHART, version.DOCKERFILE, version.PYPROJECT, version.CHANGELOG):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, tmp_path / relative)
    return tmp_path


def test_every_place_agrees_with_the_one_version():
    assert version.problems(ROOT) == []
    chart = yaml.safe_load((ROOT / version.CHART).read_text())
    assert (chart["appVersion"], chart["version"]) == (__version__, version.chart_version(__version__))


def test_make_release_check_passes():
    done = subprocess.run(
        ["make", "--no-print-directory", "release-check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"version {__version__}" in done.stdout


def test_the_installed_package_reports_the_source_version():
    # pyproject.toml reads the version from gpuhealth_api at build time (make venv reinstalls on a bump).
    assert importlib.metadata.version("gpu-health") == __version__


@pytest.mark.parametrize(
    ("pep440", "semver"),
    [
        ("0.2.0", "0.2.0"),
        ("0.2.0.dev0", "0.2.0-dev.0"),
        ("1.0.0rc2", "1.0.0-rc.2"),
        ("1.0.0b1.dev3", "1.0.0-b.1.dev.3"),
    ],
)
def test_the_charts_version_is_the_same_version_in_semver(pep440, semver):
    assert version.chart_version(pep440) == semver


def test_a_release_with_unreleased_entries_is_refused(tmp_path):
    # Today's mistake: 0.1.0 was released, features kept landing, and the version still said 0.1.0.
    root = _copy(tmp_path)
    version.set_version("0.1.0", root)
    changelog = root / version.CHANGELOG
    text = changelog.read_text()
    if not text.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0].strip():
        changelog.write_text(text.replace("## [Unreleased]\n", "## [Unreleased]\n\n- a new feature\n", 1))
    assert any("[Unreleased] has entries" in p for p in version.problems(root))


def test_set_then_cut_makes_a_consistent_release(tmp_path):
    root = _copy(tmp_path)
    version.set_version("9.8.7", root)
    assert any("no section ## [9.8.7]" in p for p in version.problems(root))
    version.cut_changelog("9.8.7", "2030-01-02", root)
    assert version.problems(root) == []
    text = (root / version.CHANGELOG).read_text()
    assert "## [Unreleased]\n\n## [9.8.7] - 2030-01-02\n" in text
    assert f"[Unreleased]: {version.REPOSITORY}/compare/v9.8.7...HEAD" in text
    version.set_version("9.9.0.dev0", root)  # the next development version
    assert version.problems(root) == []
    assert "version: 9.9.0-dev.0" in (root / version.CHART).read_text()


def test_a_drifted_chart_is_named(tmp_path):
    root = _copy(tmp_path)
    chart = root / version.CHART
    chart.write_text(chart.read_text().replace(f'appVersion: "{__version__}"', 'appVersion: "0.0.1"'))
    assert any(p.startswith(f"{version.CHART}: appVersion is 0.0.1") for p in version.problems(root))
