"""Finding the control-plane binaries: what a developer is told when they are missing."""

import os
import stat
from pathlib import Path

import pytest

from gpuhealth_sim.controlplane import binaries


def make_executable(path: Path) -> None:
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_assets_directory_with_every_binary_is_used_as_is(tmp_path: Path) -> None:
    for name in binaries.REQUIRED:
        make_executable(tmp_path / name)

    assert binaries.locate(environ={binaries.ASSETS_ENV: str(tmp_path)}) == tmp_path


def test_assets_directory_missing_binaries_names_them_and_the_fix(tmp_path: Path) -> None:
    for name in binaries.REQUIRED:
        if name not in ("kwok", "helm"):
            make_executable(tmp_path / name)

    with pytest.raises(binaries.BinariesNotFoundError) as raised:
        binaries.locate(environ={binaries.ASSETS_ENV: str(tmp_path)})

    message = str(raised.value)
    assert f"KUBEBUILDER_ASSETS={tmp_path} lacks executable kwok, helm" in message
    assert "make testbin" in message


def test_non_executable_file_counts_as_missing(tmp_path: Path) -> None:
    for name in binaries.REQUIRED:
        make_executable(tmp_path / name)
    (tmp_path / "etcd").chmod(0o644)

    assert binaries.missing(tmp_path) == ["etcd"]


def test_without_assets_runs_the_repository_script_and_returns_what_it_prints(tmp_path: Path) -> None:
    out = tmp_path / "cache"
    out.mkdir()
    for name in binaries.REQUIRED:
        make_executable(out / name)
    repo = tmp_path / "repo"
    (repo / "hack").mkdir(parents=True)
    (repo / "hack" / "testbin.sh").write_text(f"echo building >&2\necho {out}\n")
    nested = repo / "tests" / "unit"
    nested.mkdir(parents=True)

    assert binaries.locate(environ={"PATH": os.environ["PATH"]}, cwd=nested) == out


def test_failed_build_reports_the_script_error(tmp_path: Path) -> None:
    (tmp_path / "hack").mkdir()
    (tmp_path / "hack" / "testbin.sh").write_text("echo 'testbin: error: Go is not installed' >&2\nexit 1\n")

    with pytest.raises(binaries.BinariesNotFoundError) as raised:
        binaries.locate(environ={"PATH": os.environ["PATH"]}, cwd=tmp_path)

    message = str(raised.value)
    assert "Go is not installed" in message
    assert binaries.ASSETS_ENV in message


def test_repository_found_through_gpuhealth_repo(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "hack").mkdir(parents=True)
    (repo / "hack" / "testbin.sh").write_text("exit 0\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    found = binaries.find_script(environ={binaries.REPO_ENV: str(repo)}, cwd=elsewhere)

    assert found == repo / "hack" / "testbin.sh"


def test_no_repository_and_no_assets_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(binaries.BinariesNotFoundError, match="GPUHEALTH_REPO"):
        binaries.locate(environ={}, cwd=tmp_path)
