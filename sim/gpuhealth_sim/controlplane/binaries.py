"""Locate the local control-plane binaries (etcd, kube-apiserver, kwok, ...).

`$KUBEBUILDER_ASSETS` wins when set (the controller-runtime envtest
convention), so CI or a developer can point at prebuilt binaries. Otherwise
`hack/testbin.sh` builds them once from Go modules into a versioned cache and
prints that directory; it is a no-op once built.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

REQUIRED: Final = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)
ASSETS_ENV: Final = "KUBEBUILDER_ASSETS"
REPO_ENV: Final = "GPUHEALTH_REPO"
SCRIPT: Final = Path("hack") / "testbin.sh"
_LOG_TAIL_LINES: Final = 30


class BinariesNotFoundError(RuntimeError):
    """The control-plane binaries are missing or could not be built; the message says what to do."""


def missing(directory: Path, names: Sequence[str] = REQUIRED) -> list[str]:
    """Those of `names` that are not executable files in `directory`."""
    return [name for name in names if not _is_executable(directory / name)]


def locate(*, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """Return the directory holding every REQUIRED binary, building them if needed.

    Raises BinariesNotFoundError with an actionable message otherwise.
    """
    env = os.environ if environ is None else environ
    assets = env.get(ASSETS_ENV, "")
    if assets:
        return _from_assets(Path(assets))
    script = find_script(environ=env, cwd=cwd)
    if script is None:
        raise BinariesNotFoundError(
            f"cannot find {SCRIPT} above {cwd or Path.cwd()} (nor via ${REPO_ENV}); "
            f"run from the gpu-health checkout, set {REPO_ENV} to it, "
            f"or set {ASSETS_ENV} to a directory holding: {', '.join(REQUIRED)}"
        )
    return _build(script, env)


def find_script(*, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path | None:
    """The repository's hack/testbin.sh: from $GPUHEALTH_REPO, else walking up from `cwd`."""
    env = os.environ if environ is None else environ
    starts = []
    if env.get(REPO_ENV):
        starts.append(Path(env[REPO_ENV]))
    starts.append(cwd or Path.cwd())
    for start in starts:
        for folder in (start.resolve(), *start.resolve().parents):
            if (folder / SCRIPT).is_file():
                return folder / SCRIPT
    return None


def _from_assets(directory: Path) -> Path:
    absent = missing(directory)
    if absent:
        raise BinariesNotFoundError(
            f"{ASSETS_ENV}={directory} lacks executable {', '.join(absent)} "
            f"(needs all of: {', '.join(REQUIRED)}); put them there, "
            f"or unset {ASSETS_ENV} to build them once with 'make testbin'"
        )
    return directory


def _build(script: Path, env: Mapping[str, str]) -> Path:
    try:
        result = subprocess.run(
            ["bash", str(script)],
            env=dict(env),
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as error:
        raise BinariesNotFoundError(f"cannot run {script}: {error}") from error
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-_LOG_TAIL_LINES:])
        raise BinariesNotFoundError(
            f"{script} failed (exit {result.returncode}); fix the cause below and run 'make testbin', "
            f"or set {ASSETS_ENV} to a directory holding: {', '.join(REQUIRED)}\n{tail}"
        )
    lines = result.stdout.strip().splitlines()
    directory = Path(lines[-1]) if lines else Path()
    absent = missing(directory) if lines else list(REQUIRED)
    if absent:
        raise BinariesNotFoundError(
            f"{script} printed {directory!s} but it lacks {', '.join(absent)}; "
            "delete that directory and run 'make testbin' again"
        )
    return directory


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
