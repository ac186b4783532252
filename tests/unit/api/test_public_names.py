"""Every public name gpu-health writes under `gpuhealth.io/` is spelled once, in `api/gpuhealth_api/keys.py`.

The operator, the agent and the kubectl plugin use `keys.X`; a `"gpuhealth.io/..."` string literal or an
f-string that builds one from `keys.PREFIX` elsewhere is a second spelling that can drift. Docstrings and
comments may name the keys (they are prose); the allow-list below names every other literal that must stay.
The policy-status condition types and reasons live in `gpuhealth_api.vocabulary` and are held to the CRD's
documentation and the writers here too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import python_ast
from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.client import nodes
from gpuhealth_operator.ladder.isolate import isolation_support
from gpuhealth_operator.state import breakers

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("operator/gpuhealth_operator", "agent/gpuhealth_agent", "plugin/gpuhealth_kubectl")
NEEDLE = f"{keys.PREFIX}/"

ALLOWED: dict[tuple[str, str], str] = {
    # (file, the literal's text) → why it stays a literal. None today: messages and help texts format the
    # keys' names in (f"... {keys.DRILL_ANNOTATION} ..."), which is no second spelling.
}


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (of a module, class or function, or after an
    assignment: the attribute docstrings this project writes under its constants)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                found.add(id(statement.value))
    return found


def _prefix_fstring(node: ast.JoinedStr) -> bool:
    """f"{keys.PREFIX}/name" or f"{PREFIX}/name": a key built in place (f"{keys.PREFIX}/" alone, a filter
    for every key of ours, is no spelling of one)."""
    for first, second in zip(node.values, node.values[1:], strict=False):
        if (
            isinstance(first, ast.FormattedValue)
            and ast.unparse(first.value) in {"keys.PREFIX", "PREFIX"}
            and isinstance(second, ast.Constant)
            and str(second.value).startswith("/")
            and len(str(second.value)) > 1
        ):
            return True
    return False


def _spellings(path: Path) -> Iterator[tuple[int, str]]:
    tree = python_ast.parse(path)
    docstrings = _docstrings(tree)
    inside_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and (_prefix_fstring(node) or NEEDLE in ast.unparse(node)):
            yield node.lineno, ast.unparse(node)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and NEEDLE in node.value
            and id(node) not in docstrings
            and id(node) not in inside_fstrings
        ):
            yield node.lineno, node.value


def test_no_gpuhealth_io_key_is_spelled_outside_api() -> None:
    found = []
    for root in SCANNED:
        for path in sorted((ROOT / root).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            found += [
                f"{where}:{line}: {text}" for line, text in _spellings(path) if (where, text) not in ALLOWED
            ]
    assert found == [], "spell these as gpuhealth_api.keys names:\n" + "\n".join(found)


def test_the_allow_list_is_not_stale() -> None:
    for where, text in ALLOWED:
        assert text in (ROOT / where).read_text(encoding="utf-8"), f"{where} no longer has {text!r}"


def test_node_annotations_are_the_apis() -> None:
    assert nodes.DRAIN_STARTED_ANNOTATION == keys.DRAIN_STARTED_ANNOTATION
    assert nodes.CORDONED_AT_ANNOTATION == keys.CORDONED_AT_ANNOTATION
    assert set(keys.NODE_FLAG_LABELS) < set(keys.OPERATOR_LABELS)
    assert all(label.startswith(NEEDLE) for label in keys.OPERATOR_LABELS)


def test_policy_conditions_are_the_apis() -> None:
    assert breakers.PAUSED == vocabulary.PolicyConditionType.PAUSED
    assert isolation_support.CONDITION == vocabulary.PolicyConditionType.GPU_ISOLATION
    crd = (ROOT / "crds/gpuhealth.io_gpuhealthpolicies.yaml").read_text(encoding="utf-8")
    assert all(t.value in crd for t in vocabulary.PolicyConditionType), "the CRD documents every type"
