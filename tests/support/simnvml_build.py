"""The simulated NVML library for tests: built once by hack/simnvml.sh, loaded under its soname.

`directory()` runs the build script (cached outside the checkout, so after the first build it only
prints the path) and skips the test, saying why, only where there is no C compiler. `preload()` loads
the `full` profile into this process so that pynvml's own `CDLL("libnvidia-ml.so.1")` gets it
(gpuhealth_agent.simnvml.preload). Other profiles need a process of their own (`environment`):
the loader keeps the first library of a soname for the life of the process.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhealth_agent import simnvml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "simnvml.sh"


@functools.cache
def _build() -> Path:
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"hack/simnvml.sh failed ({done.returncode}):\n{done.stderr}")
    return Path(done.stdout.strip())


def directory() -> Path:
    """Where the builds are (one folder per profile); skips the test only when there is no C compiler."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler (cc) to build the simulated NVML library; CI has one")
    return _build()


@functools.cache
def _preload() -> ctypes.CDLL:
    return simnvml.preload(simnvml.library_path("full", directory()))


def preload() -> ctypes.CDLL:
    """The `full` library, loaded in this process where pynvml will find it."""
    directory()
    return _preload()


def environment(profile: str = "full") -> dict[str, str]:
    """The environment of a process whose pynvml loads `profile` (LD_LIBRARY_PATH, as on a node)."""
    folder = simnvml.library_path(profile, directory()).parent
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(folder), env.get("LD_LIBRARY_PATH", "")) if p)
    env[simnvml.DIR_ENV] = str(directory())
    return env
