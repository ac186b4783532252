"""What a release ships: a licence, an image pinned by digest, a packaged chart, a multi-arch build.

The chart is rendered and packaged with the real helm (no cluster: `helm
template` and `helm package` need none). hack/build-image.sh is run only in
its dry-run mode (DRY_RUN=1), which checks the arguments and the builder's
emulation and prints the plan without an engine, so no image is built here.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth_sim.controlplane import binaries

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-health"
VARIANTS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.36.0"
DIGEST = "sha256:" + "0123456789abcdef" * 4
REPOSITORY = "registry.example.com/gpu/gpu-health"


@pytest.fixture(scope="module")
def helm() -> Path:
    return binaries.locate(cwd=ROOT) / "helm"


def template(
    helm: Path, chart: Path | str, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    command = [str(helm), "template", "release", str(chart), "-n", "gpu-health"]
    command += ["--kube-version", KUBE_VERSION]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def images(rendered: str) -> Iterator[tuple[str, str, str]]:
    """(object kind/name, container name, image) of every container, init container and hook pod."""

    def walk(node: Any, where: str) -> Iterator[tuple[str, str, str]]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in {"containers", "initContainers", "ephemeralContainers"} and isinstance(value, list):
                    for container in value:
                        yield where, container.get("name", "?"), container.get("image", "")
                else:
                    yield from walk(value, where)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item, where)

    for doc in yaml.safe_load_all(rendered):
        if doc:
            yield from walk(doc, f"{doc['kind']}/{doc['metadata']['name']}")


# -- image.digest --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_digest_pins_every_container_of_the_chart(helm: Path, variant: str) -> None:
    """image.digest set: agent, operator and any Job or test pod run repository@digest, the tag ignored."""
    out = template(
        helm,
        CHART,
        "-f",
        str(CHART / "ci" / variant),
        "--set",
        f"image.repository={REPOSITORY}",
        "--set",
        "image.tag=9.9.9",
        "--set",
        f"image.digest={DIGEST}",
    ).stdout
    found = list(images(out))
    components = {where.split("/")[0] for where, _, _ in found}
    assert {"Deployment", "DaemonSet"} <= components, found
    for where, container, image in found:
        assert image == f"{REPOSITORY}@{DIGEST}", (where, container, image)


def test_without_a_digest_the_tag_or_the_app_version_is_used(helm: Path) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    default = {image for _, _, image in images(template(helm, CHART).stdout)}
    assert default == {f"ghcr.io/gpu-health/gpu-health:{app_version}"}
    tagged = template(helm, CHART, "--set", "image.tag=1.2.3").stdout
    assert {image for _, _, image in images(tagged)} == {"ghcr.io/gpu-health/gpu-health:1.2.3"}


@pytest.mark.parametrize(
    "digest",
    ["sha256:abc", "0123456789abcdef" * 4, "sha256:" + "0123456789ABCDEF" * 4, "latest"],
    ids=["short", "no-algorithm", "upper-case", "a-tag"],
)
def test_a_malformed_digest_is_refused_naming_the_field(helm: Path, digest: str) -> None:
    result = template(helm, CHART, "--set-string", f"image.digest={digest}", check=False)
    assert result.returncode != 0, "helm rendered a malformed image.digest"
    assert re.search(r"image[./]digest", result.stderr), result.stderr


def test_values_yaml_documents_the_digest_empty_by_default() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["digest"] == ""
    assert "image.digest" in (ROOT / "docs" / "chart.md").read_text()


# -- make chart ----------------------------------------------------------------------------------------


def make_chart(helm: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBEBUILDER_ASSETS": str(helm.parent)}
    return subprocess.run(
        ["make", "--no-print-directory", "-s", "chart", f"CHART_DIST={tmp_path}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_make_chart_packages_a_chart_helm_lint_accepts(helm: Path, tmp_path: Path) -> None:
    result = make_chart(helm, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    package = tmp_path / f"gpu-health-{version}.tgz"
    assert sorted(p.name for p in tmp_path.iterdir()) == [package.name]
    with tarfile.open(package) as tar:
        names = set(tar.getnames())
    assert {"gpu-health/Chart.yaml", "gpu-health/values.schema.json"} <= names
    assert any(n.startswith("gpu-health/crds/") for n in names), names
    lint = subprocess.run(
        [str(helm), "lint", "--strict", str(package)], capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr


def test_make_chart_with_an_image_digest_pins_the_packaged_chart(helm: Path, tmp_path: Path) -> None:
    """The released chart carries the pushed image's digest; the checkout's values.yaml stays unpinned."""
    before = (CHART / "values.yaml").read_text()
    result = make_chart(helm, tmp_path, f"IMAGE_DIGEST={DIGEST}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (CHART / "values.yaml").read_text() == before
    (package,) = tmp_path.glob("gpu-health-*.tgz")
    rendered = {image for _, _, image in images(template(helm, package).stdout)}
    assert rendered == {f"ghcr.io/gpu-health/gpu-health@{DIGEST}"}


def test_make_chart_refuses_a_malformed_digest(helm: Path, tmp_path: Path) -> None:
    result = make_chart(helm, tmp_path, "IMAGE_DIGEST=sha256:abc")
    assert result.returncode != 0
    assert "IMAGE_DIGEST" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_make_chart_pushes_only_to_an_oci_registry(helm: Path, tmp_path: Path) -> None:
    """CHART_REGISTRY=oci://... pushes (shown with make -n: no registry here); anything else is refused."""
    env = {**os.environ, "KUBEBUILDER_ASSETS": str(helm.parent)}
    shown = subprocess.run(
        ["make", "-n", "chart", f"CHART_DIST={tmp_path}", "CHART_REGISTRY=oci://registry.example.com/charts"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'CHART_REGISTRY="oci://registry.example.com/charts" hack/package-chart.sh' in shown, shown
    refused = make_chart(helm, tmp_path, "CHART_REGISTRY=registry.example.com/charts")
    assert refused.returncode != 0
    assert "oci://" in refused.stderr, refused.stderr


def test_dist_is_ignored_by_git() -> None:
    result = subprocess.run(["git", "check-ignore", "-q", "dist/gpu-health-0.1.0.tgz"], cwd=ROOT, check=False)
    assert result.returncode == 0


# -- licence -------------------------------------------------------------------------------------------


def test_the_project_is_apache_2_licensed() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["project"].get("license-files", ["LICENSE"]) == ["LICENSE"]
    # A string licence (an SPDX expression, PEP 639) needs setuptools 77 or newer.
    requires = project["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(7[7-9]|[89]\d)(\.\d+)*", r) for r in requires), requires
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()


def test_changelog_and_release_checklist_exist() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert "release.md" in (ROOT / "docs" / "README.md").read_text()
    checklist = (ROOT / "docs" / "release.md").read_text()
    steps = ("make release VERSION=", "make release-check", "hack/version.py", "CHANGELOG.md", "SBOM")
    steps += ("PLATFORMS=linux/amd64,linux/arm64", "PUSH=1", "IMAGE_DIGEST", "CHART_REGISTRY", "git tag")
    for step in steps:
        assert step in checklist, step


def test_one_version_for_package_image_and_chart() -> None:
    """One source (gpuhealth_api.__version__); hack/version.py checks the derived places agree."""
    done = subprocess.run(
        [sys.executable, "hack/version.py", "check"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


# -- multi-arch image build (dry run) ------------------------------------------------------------------

HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "")
FOREIGN_ARCH = "arm64" if HOST_ARCH == "amd64" else "amd64"
QEMU = {"amd64": "qemu-x86_64", "arm64": "qemu-aarch64"}


def build_image(
    tmp_path: Path, platforms: str | None, binfmt: dict[str, str] | None, flags: str = "POCF", **extra: str
) -> subprocess.CompletedProcess[str]:
    """hack/build-image.sh in dry-run mode with podman and a stand-in binfmt_misc directory."""
    binfmt_dir = tmp_path / "binfmt_misc"
    binfmt_dir.mkdir(exist_ok=True)
    if binfmt is not None:
        (binfmt_dir / "status").write_text("enabled\n")
        for name, state in binfmt.items():
            entry = f"{state}\ninterpreter /usr/libexec/qemu-binfmt/{name}\nflags: {flags}\n"
            (binfmt_dir / name).write_text(entry)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "DRY_RUN": "1",
        "ENGINE": "podman",
        "BINFMT_DIR": str(binfmt_dir),
        **extra,
    }
    if platforms is not None:
        env["PLATFORMS"] = platforms
    script = str(ROOT / "hack" / "build-image.sh")
    return subprocess.run([script], env=env, capture_output=True, text=True, check=False, timeout=60)


pytest_host = pytest.mark.skipif(not HOST_ARCH, reason=f"builder arch {platform.machine()} has no image")


@pytest_host
def test_default_build_is_the_builders_arch_only(tmp_path: Path) -> None:
    result = build_image(tmp_path, None, binfmt=None)
    assert result.returncode == 0, result.stderr
    assert f"platforms: linux/{HOST_ARCH} (this machine)" in result.stdout
    assert "--platform" not in result.stdout and "--manifest" not in result.stdout


@pytest_host
def test_a_foreign_arch_without_emulation_is_refused_saying_what_is_missing(tmp_path: Path) -> None:
    platforms = f"linux/{HOST_ARCH},linux/{FOREIGN_ARCH}"
    cases: list[tuple[dict[str, str] | None, str, str]] = [
        (None, "POCF", "binfmt_misc is not mounted"),
        ({}, "POCF", f"no enabled binfmt_misc entry {QEMU[FOREIGN_ARCH]}"),
        ({QEMU[FOREIGN_ARCH]: "disabled"}, "POCF", f"no enabled binfmt_misc entry {QEMU[FOREIGN_ARCH]}"),
        # Registered without F: the interpreter is looked up inside the build's chroot.
        ({QEMU[FOREIGN_ARCH]: "enabled"}, "OC", "lacks the F flag"),
    ]
    for binfmt, flags, reason in cases:
        result = build_image(tmp_path, platforms, binfmt=binfmt, flags=flags)
        assert result.returncode == 2, (binfmt, result.stdout, result.stderr)
        assert f"linux/{FOREIGN_ARCH}: " in result.stderr and reason in result.stderr, result.stderr
        assert "qemu-user-static" in result.stderr, result.stderr
        assert "podman build" not in result.stdout
        for entry in (tmp_path / "binfmt_misc").iterdir():
            entry.unlink()


@pytest_host
def test_a_foreign_arch_with_emulation_builds_one_manifest_of_both(tmp_path: Path) -> None:
    result = build_image(
        tmp_path,
        f"linux/{HOST_ARCH},linux/{FOREIGN_ARCH}",
        binfmt={QEMU[FOREIGN_ARCH]: "enabled"},
        IMAGE="registry.example.com/gpu/gpu-health",
        VERSION="1.2.3",
    )
    assert result.returncode == 0, result.stderr
    builds = [line for line in result.stdout.splitlines() if "podman build" in line and "--manifest" in line]
    assert len(builds) == 2, result.stdout
    for arch, line in zip((HOST_ARCH, FOREIGN_ARCH), builds, strict=True):
        assert f"--platform linux/{arch}" in line
        assert "--manifest registry.example.com/gpu/gpu-health:1.2.3" in line
        assert f"-t registry.example.com/gpu/gpu-health:1.2.3-{arch}" in line
    # Each arch on its own Debian base, the foreign one debootstrapped for that arch.
    assert f"--arch={FOREIGN_ARCH}" in result.stdout
    assert "manifest push" not in result.stdout


@pytest_host
def test_push_needs_a_multi_arch_build_and_prints_the_digest_step(tmp_path: Path) -> None:
    single = build_image(tmp_path, None, binfmt=None, PUSH="1")
    assert single.returncode == 2 and "PLATFORMS" in single.stderr, single.stderr
    pushed = build_image(
        tmp_path,
        f"linux/{HOST_ARCH},linux/{FOREIGN_ARCH}",
        binfmt={QEMU[FOREIGN_ARCH]: "enabled"},
        IMAGE="registry.example.com/gpu/gpu-health",
        PUSH="1",
    )
    assert pushed.returncode == 0, pushed.stderr
    assert "podman manifest push --all" in pushed.stdout
    assert "--digestfile" in pushed.stdout


@pytest.mark.parametrize(
    "platforms", ["arm64", "linux/riscv64", "linux/amd64,,linux/arm64", "windows/amd64", ","]
)
def test_an_unknown_platform_is_refused(tmp_path: Path, platforms: str) -> None:
    result = build_image(tmp_path, platforms, binfmt={})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "linux/amd64" in result.stderr and "linux/arm64" in result.stderr, result.stderr
