"""A long-running child process with its own log file, stopped politely then firmly.

Children run in their own session so a Ctrl-C at the terminal reaches only
the test runner, which then tears them down in order. On Linux they also get
SIGKILL if the process that started them dies without cleaning up, so a
killed test run leaves no etcd or apiserver behind holding ports. Linux ties
that signal to the *thread* that started the child: start processes from a
thread that lives as long as they should (the main thread, as pytest
fixtures do), not from a short-lived worker thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

_PR_SET_PDEATHSIG: Final = 1
_TAIL_BYTES: Final = 64 * 1024


class ProcessError(RuntimeError):
    """A managed process failed to start or exited early; the message carries its log tail."""


class ManagedProcess:
    """One named child process whose stdout and stderr go to `log_path` (appended across restarts)."""

    def __init__(
        self, name: str, argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = dict(env) if env is not None else None
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def start(self) -> None:
        """Launch the process; a no-op if it is already running."""
        if self.running():
            return
        # The child keeps its own copy of the log descriptor; ours is closed right away.
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"===== starting: {' '.join(self.argv)}\n")
            log.flush()
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent(),  # noqa: PLW1509 - only calls prctl, safe after fork
                )
            except OSError as error:
                raise ProcessError(f"{self.name}: cannot start {self.argv[0]}: {error}") from error

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def returncode(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def signal(self, signum: int) -> None:
        if self.running() and self._popen is not None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.send_signal(signum)

    def stop(self, *, grace_seconds: float = 5.0) -> None:
        """SIGTERM, wait up to `grace_seconds`, then SIGKILL; always reaps the process."""
        self.signal(signal.SIGTERM)
        self.wait_stopped(grace_seconds=grace_seconds)

    def wait_stopped(self, *, grace_seconds: float) -> None:
        """Wait for an already signalled process to exit, SIGKILL it after `grace_seconds`."""
        if self._popen is not None:
            try:
                self._popen.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the log, for error messages."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, 2)
                size = log.tell()
                log.seek(max(0, size - _TAIL_BYTES))
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> ProcessError:
        """An error saying `what` went wrong, with the exit status and log tail."""
        code = self.returncode()
        state = f"exited with {code}" if code is not None else "still running"
        return ProcessError(
            f"{self.name} {what} ({state}); log {self.log_path}, last lines:\n{self.log_tail()}"
        )


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec function asking Linux to SIGKILL the child when its parent dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    prctl = ctypes.CDLL(libc_name, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec
