"""A script of hack/ imported as a module, for the tests that check what it prints or computes."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HACK = Path(__file__).resolve().parents[2] / "hack"


def load(filename: str, name: str) -> ModuleType:
    """hack/`filename` as module `name` (registered in sys.modules first, so its dataclasses resolve)."""
    spec = importlib.util.spec_from_file_location(name, HACK / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module
