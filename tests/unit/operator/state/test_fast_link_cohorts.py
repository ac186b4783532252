"""Issue 52: the fleet's link cohorts kept report by report are the cohorts counted afresh.

`LinkCohorts.replace` looks only at the GPUs of a report that are other objects than the last report's
(the cache keeps the unchanged ones): held here equal to counting every stored report from nothing.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhealth_operator.state import compaction, link_cohorts

_GPU = st.fixed_dictionaries(
    {"model": st.sampled_from(["H100", "A100"])},
    optional={
        "nvlink": st.fixed_dictionaries({"linksUp": st.integers(15, 18), "linksDown": st.integers(0, 3)})
    },
)


@settings(max_examples=300, deadline=None)
@given(
    first=st.lists(st.lists(_GPU, max_size=3), min_size=1, max_size=3),
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.one_of(st.none(), st.tuples(st.integers(0, 2), _GPU))), max_size=15
    ),
)
def test_cohorts_kept_by_replacing_reports_are_the_cohorts_counted_afresh(
    first: list[list[dict[str, Any]]], steps: list[tuple[int, tuple[int, dict[str, Any]] | None]]
) -> None:
    """Each step replaces one GPU of one node's report (the others kept, as the cache keeps them), or
    removes the node's GPUNode; after each, the expected links up per cohort are those counted anew."""
    kept = link_cohorts.LinkCohorts()
    reports: dict[int, list[Any] | None] = {}
    for node, gpus in enumerate(first):
        reports[node] = [compaction.compact_gpu(g) for g in gpus]
        kept.replace(None, reports[node])
    for node, change in steps:
        old = reports.get(node)
        if change is None:
            new = None
        else:
            place, gpu = change
            new = list(old or [])
            if place < len(new):
                new[place] = compaction.compact_gpu(gpu)
            else:
                new.append(compaction.compact_gpu(gpu))
        kept.replace(old, new)
        reports[node] = new
        afresh = link_cohorts.LinkCohorts()
        for gpus in reports.values():
            afresh.replace(None, gpus)
        assert dict(kept.expected) == dict(afresh.expected)
