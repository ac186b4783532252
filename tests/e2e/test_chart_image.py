"""The image's build rules and the chart's CRD copy, checked without Docker or a cluster.

hack/check_dockerfile.py holds the Dockerfile rules the chart relies on (non-root
numeric user, multi-stage wheel build, slim Python 3.11); it must pass on our
Dockerfile and fail on each way of breaking them. hack/sync-chart-crds.sh must
report drift of the chart's CRDs. (hack/check-image.sh adds hadolint and the
clean-venv install; it needs PyPI, so it runs as its own make target.)
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
DOCKERIGNORE = (ROOT / ".dockerignore").read_text()


def check(
    tmp_path: Path, dockerfile: str, dockerignore: str = DOCKERIGNORE
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "Dockerfile").write_text(dockerfile)
    (tmp_path / ".dockerignore").write_text(dockerignore)
    return subprocess.run(
        [sys.executable, str(ROOT / "hack" / "check_dockerfile.py"), "Dockerfile", ".dockerignore"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )


def test_our_dockerfile_keeps_the_rules(tmp_path: Path) -> None:
    result = check(tmp_path, DOCKERFILE)
    assert result.returncode == 0, result.stderr


BREAKAGES = [
    ("USER 65532:65532", "USER root", "final USER must be 65532:65532"),
    ("USER 65532:65532\n", "", "must set USER"),
    ("ARG PYTHON_IMAGE=python:3.11-slim-bookworm", "ARG PYTHON_IMAGE=python:3.11", "not a slim Python 3.11"),
    ("RUN pip wheel --wheel-dir /wheels .", "RUN pip install .", "build our wheel"),
    (
        "COPY --from=builder /opt/gpu-health /opt/gpu-health",
        "ADD dist.tar /opt/gpu-health",
        "use COPY, not ADD",
    ),
    ("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=1 API_TOKEN=abc", "no secrets"),
]


@pytest.mark.parametrize(("old", "new", "message"), BREAKAGES, ids=[m for _, _, m in BREAKAGES])
def test_each_broken_rule_is_reported(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in DOCKERFILE, f"the test's anchor {old!r} is gone from the Dockerfile"
    result = check(tmp_path, DOCKERFILE.replace(old, new, 1))
    assert result.returncode == 1
    assert message in result.stderr, result.stderr


def test_a_build_context_without_a_default_exclude_is_reported(tmp_path: Path) -> None:
    result = check(tmp_path, DOCKERFILE, dockerignore=".git\n")
    assert result.returncode == 1
    assert ".dockerignore must first exclude everything" in result.stderr


def test_crd_sync_reports_drift_and_repairs_it(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    (tree / "hack").mkdir(parents=True)
    shutil.copy(ROOT / "hack" / "sync-chart-crds.sh", tree / "hack")
    shutil.copytree(ROOT / "crds", tree / "crds")
    script = str(tree / "hack" / "sync-chart-crds.sh")
    subprocess.run([script], check=True, capture_output=True)
    assert subprocess.run([script, "--check"], capture_output=True, check=False).returncode == 0
    copy = next((tree / "charts" / "gpu-health" / "crds").glob("*.yaml"))
    copy.write_text(copy.read_text() + "# drift\n")
    drift = subprocess.run([script, "--check"], capture_output=True, text=True, check=False)
    assert drift.returncode == 1
    assert "differs from crds/" in drift.stderr
    subprocess.run([script], check=True, capture_output=True)
    assert subprocess.run([script, "--check"], capture_output=True, check=False).returncode == 0
