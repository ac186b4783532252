"""Managed child processes: logs captured, early exits explained, stubborn ones killed."""

import signal
import sys
import time
from pathlib import Path

from gpuhealth_sim import waiting
from gpuhealth_sim.controlplane import processes

IGNORE_TERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_failure_reports_exit_code_and_log_tail(tmp_path: Path) -> None:
    child = processes.ManagedProcess(
        "failing", [sys.executable, "-c", "print('bad flag --foo'); raise SystemExit(3)"], tmp_path / "f.log"
    )
    child.start()
    waiting.wait_until(lambda: not child.running(), timeout_seconds=10, message="child exits")

    message = str(child.failure("did not become ready"))

    assert "failing did not become ready (exited with 3)" in message
    assert "bad flag --foo" in message


def test_stop_kills_a_process_that_ignores_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    child = processes.ManagedProcess("stubborn", [sys.executable, "-c", IGNORE_TERM], log)
    child.start()
    waiting.wait_until(
        lambda: "ready" in log.read_text().splitlines(), timeout_seconds=10, message="child ready"
    )

    began = time.monotonic()
    child.stop(grace_seconds=0.2)

    assert not child.running()
    assert child.returncode() == -signal.SIGKILL
    assert time.monotonic() - began < 5


def test_restart_appends_to_the_same_log(tmp_path: Path) -> None:
    log = tmp_path / "echo.log"
    child = processes.ManagedProcess("echo", [sys.executable, "-c", "print('hello')"], log)
    for _ in range(2):
        child.start()
        waiting.wait_until(lambda: not child.running(), timeout_seconds=10, message="child exits")

    assert log.read_text().splitlines().count("hello") == 2
    child.stop()
