"""`gpu-health-sim backtest` and `trace generate` refuse what they cannot do with a message and an exit code.

A bad argument exits 2 and a file that cannot be read or written exits 3
(docs/backtest.md), each with one line on stderr: never a hang, never a traceback.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Final

import pytest

from gpuhealth_sim import cli
from gpuhealth_sim.backtest import tracegen

ROOT: Final = pathlib.Path(__file__).resolve().parents[3]
POLICY: Final = ROOT / "examples" / "default-policy.yaml"
SIM: Final = [
    sys.executable,
    "-c",
    "import sys; from gpuhealth_sim import cli; sys.exit(cli.main(sys.argv[1:]))",
]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("trace") / "t.jsonl"
    tracegen.generate(tracegen.Options(node_days=0.2, seed=3, nodes=12), path)
    return path


@pytest.mark.parametrize("tick", ["0", "-30", "nan", "inf"])
def test_a_tick_that_is_not_a_positive_number_is_refused_not_replayed_forever(
    trace: pathlib.Path, tick: str
) -> None:
    # A subprocess with a deadline: on the old code `--tick-seconds 0` never returned. The deadline is
    # generous because the CLI's start-up alone took over 20 s with parallel test workers on a busy machine.
    args = ["backtest", "--policy", str(POLICY), "--trace", str(trace), f"--tick-seconds={tick}"]
    done = subprocess.run([*SIM, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert done.returncode == cli.USAGE_ERROR, done.stderr
    assert "--tick-seconds must be a positive number" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_policy_file_is_named_with_exit_3(
    trace: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert cli.main(["backtest", "--policy", str(missing), "--trace", str(trace)]) == 3
    assert "nope.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["no-such-dir/t.jsonl", "a-directory"])
def test_generate_to_a_path_it_cannot_write_says_so_with_exit_3(tmp_path: pathlib.Path, where: str) -> None:
    (tmp_path / "a-directory").mkdir()
    out = tmp_path / where
    args = ["trace", "generate", "--node-days", "0.1", "--nodes", "12", "--out", str(out)]
    done = subprocess.run([*SIM, *args], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    assert str(out) in done.stderr and "cannot write" in done.stderr, done.stderr


def test_generate_that_fails_mid_write_says_so_with_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    # /dev/full takes the open and refuses every write (ENOSPC), for root too: a full disk.
    out = pathlib.Path("/dev/full")
    args = ["trace", "generate", "--node-days", "0.1", "--nodes", "12", "--out", str(out)]
    assert cli.main(args) == 3
    assert "cannot write /dev/full" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--sample-seconds=nan", "--node-days=inf", "--heartbeat-seconds=nan"])
def test_generate_refuses_numbers_that_are_not_finite(
    tmp_path: pathlib.Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["trace", "generate", "--node-days", "0.1", "--out", str(tmp_path / "t.jsonl"), flag]
    assert cli.main(args) == cli.USAGE_ERROR
    assert "gpu-health-sim:" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()
