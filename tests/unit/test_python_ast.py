"""The source-reading tests' parse survives CPython 3.11's spurious AST recursion SystemError."""

import ast
import threading
from pathlib import Path

import pytest

import python_ast


def test_a_spurious_system_error_is_parsed_again_on_a_fresh_thread(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = ast.parse
    caller = threading.current_thread()

    def flaky(source: str, filename: str = "<unknown>") -> ast.Module:
        if threading.current_thread() is caller:
            raise SystemError("AST constructor recursion depth mismatch (before=141, after=183)")
        return real(source, filename)

    monkeypatch.setattr(python_ast.ast, "parse", flaky)
    source = tmp_path / "m.py"
    source.write_text("x = 1\n")
    tree = python_ast.parse(source)
    assert isinstance(tree.body[0], ast.Assign)


def test_a_real_syntax_error_still_fails(tmp_path: Path) -> None:
    source = tmp_path / "bad.py"
    source.write_text("def (:\n")
    with pytest.raises(SyntaxError):
        python_ast.parse(source)
