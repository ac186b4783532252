"""`make release VERSION=X.Y.Z`: one command, on a copy of this checkout, makes every artefact and the tag.

The image step needs podman and (for the foreign arch) QEMU, which test_chart_release.py and
test_chart_image.py cover; here SKIP_IMAGE=1, so the chart is packaged without a digest. Nothing is
pushed: no registry is reachable from the tests.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from gpuhealth_sim.controlplane import binaries

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
VERSION = "9.8.7"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "release test",
    "GIT_AUTHOR_EMAIL": "release@example.com",
    "GIT_COMMITTER_NAME": "release test",
    "GIT_COMMITTER_EMAIL": "release@example.com",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """This working tree as it is (tracked and new files, not ignored ones), committed in a new repository."""
    files = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    repo = tmp_path / "repo"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_bytes((ROOT / name).read_bytes())
            (repo / name).chmod((ROOT / name).stat().st_mode)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the checkout")
    return repo


def release(repo: Path, dist: Path, **env: str) -> subprocess.CompletedProcess[str]:
    helm = binaries.locate(cwd=ROOT) / "helm"
    variables = {"VERSION": VERSION, "PY": sys.executable, "HELM": str(helm), "DIST": str(dist), **env}
    return subprocess.run(
        ["hack/release.sh"],
        cwd=repo,
        env={**os.environ, **GIT_ENV, **variables},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_make_release_builds_wheel_sdist_sbom_and_chart_then_tags(checkout: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    done = release(checkout, dist, SKIP_IMAGE="1", DATE="2030-01-02")
    assert done.returncode == 0, done.stdout + done.stderr

    # The release commit carries the version everywhere; the tag is on it.
    assert git(checkout, "log", "-1", "--format=%s").strip() == f"Release {VERSION}"
    assert git(checkout, "rev-parse", f"v{VERSION}^{{commit}}") == git(checkout, "rev-parse", "HEAD")
    assert (
        subprocess.run(
            [sys.executable, "hack/version.py", "check"], cwd=checkout, capture_output=True, check=False
        ).returncode
        == 0
    )
    changelog = (checkout / "CHANGELOG.md").read_text()
    assert f"## [Unreleased]\n\n## [{VERSION}] - 2030-01-02\n" in changelog

    wheel = dist / f"gpu_health-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"gpu_health-{VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in metadata
    with tarfile.open(dist / f"gpu_health-{VERSION}.tar.gz") as sdist:
        assert f"gpu_health-{VERSION}/pyproject.toml" in sdist.getnames()

    sbom = json.loads((dist / f"gpu-health-{VERSION}.cdx.json").read_text())
    assert (sbom["bomFormat"], sbom["specVersion"]) == ("CycloneDX", "1.5")
    assert sbom["metadata"]["component"]["purl"] == f"pkg:pypi/gpu-health@{VERSION}"
    names = {c["name"]: c["version"] for c in sbom["components"]}
    assert names["kopf"] == importlib.metadata.version("kopf")  # the version installed, not the pin
    assert {"kubernetes", "nvidia-ml-py", "prometheus-client", "pyyaml"} <= set(names)
    assert "pytest" not in names  # a dev extra, not shipped

    with tarfile.open(dist / f"gpu-health-{VERSION}.tgz") as chart:
        member = chart.extractfile("gpu-health/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(member.read())
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)

    # Once tagged, the same release cannot be made again.
    again = release(checkout, tmp_path / "again", SKIP_IMAGE="1")
    assert again.returncode == 2
    assert f"tag v{VERSION} exists already" in again.stderr


@pytest.mark.parametrize("version", ["0.3.0.dev0", "v1.0.0", ""])
def test_make_release_takes_only_a_release_version(checkout: Path, tmp_path: Path, version: str) -> None:
    done = release(checkout, tmp_path / "dist", VERSION=version, SKIP_IMAGE="1")
    assert done.returncode == 2
    assert "VERSION must be a release" in done.stderr
    assert git(checkout, "tag") == ""


def test_make_release_refuses_a_dirty_checkout(checkout: Path, tmp_path: Path) -> None:
    (checkout / "README.md").write_text("changed\n")
    done = release(checkout, tmp_path / "dist", SKIP_IMAGE="1")
    assert done.returncode == 2
    assert "uncommitted changes" in done.stderr
