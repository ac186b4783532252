"""Every `.labels(...)` call on an operator metric passes as many values as the metric has labels.

prometheus_client checks this only when the line runs, so a label added to a
metric (a `condition` on the detection histogram, say) and forgotten at one
call site raises 'Incorrect label count' in production, on the rare path that
observes it. This reads the operator's source instead.
"""

import ast
from pathlib import Path

import python_ast
from gpuhealth_operator.shared import metrics

PACKAGE = Path(metrics.__file__).parent.parent  # the operator package, every sub-package


def calls() -> list[tuple[str, int, str, int]]:
    """(file, line, metric attribute, number of positional values) of each `<x>.<metric>.labels(...)`."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(python_ast.parse(path)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "labels" or not isinstance(node.func.value, ast.Attribute):
                continue
            found.append((path.name, node.lineno, node.func.value.attr, len(node.args) + len(node.keywords)))
    return found


def test_every_labels_call_matches_its_metric() -> None:
    meters = metrics.Metrics.create()
    checked = 0
    wrong = []
    for file, line, attribute, given in calls():
        metric = getattr(meters, attribute, None)
        if metric is None:
            continue  # not one of ours (another object's `.labels`)
        checked += 1
        expected = len(metric._labelnames)
        if given != expected:
            wrong.append(f"{file}:{line} {attribute}.labels() with {given} values, the metric has {expected}")
    assert checked > 10
    assert wrong == []
