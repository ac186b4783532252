"""JSON merge patch (RFC 7386) as the API server applies it, in the replay's in-memory cluster and in the
trace reader: a null removes the key at every depth, also inside an object the target did not have
(the operator's `{"metadata": {"annotations": {KEY: null}}}` on a Node without annotations must leave no
KEY behind, or the replay would see, say, a repair annotation that the real cluster never stored)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpuhealth_sim.backtest import memcluster, traces

# RFC 7386, Appendix A, "Example Test Cases" (original, patch, result).
RFC_CASES: list[tuple[Any, Any, Any]] = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ({"a": "foo"}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ({}, {"metadata": {"annotations": {"k": None, "j": "x"}}}, {"metadata": {"annotations": {"j": "x"}}}),
]


@pytest.mark.parametrize(("original", "patch", "result"), RFC_CASES)
def test_the_in_memory_cluster_merges_as_the_rfc_says(original: Any, patch: Any, result: Any) -> None:
    assert memcluster.merge_patch(copy.deepcopy(original), patch) == result


@pytest.mark.parametrize(("original", "patch", "result"), RFC_CASES)
def test_the_trace_reader_merges_as_the_rfc_says(original: Any, patch: Any, result: Any) -> None:
    kept = copy.deepcopy(original)
    assert traces.merge_patch(original, patch) == result
    assert original == kept  # on a copy
