"""Only the NVML module talks to pynvml; everything else goes through its Library protocol."""

import ast
from pathlib import Path

import python_ast

PACKAGE = Path(__file__).resolve().parents[3] / "agent" / "gpuhealth_agent"


def test_only_nvml_py_imports_pynvml() -> None:
    importers = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(python_ast.parse(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "pynvml" for name in names):
                importers.append(path.name)
    assert importers == ["nvml.py"]
