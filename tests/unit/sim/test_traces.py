"""Trace files: a clear error naming the line for bad or truncated input, and lossless patches."""

import gzip
import json
import pathlib
import re

import pytest

from gpuhealth_sim.backtest import traces

HEADER = {"kind": "header", "format": traces.FORMAT, "version": traces.VERSION, "start": 0}
NODE = {"kind": "node", "t": 0, "object": {"metadata": {"name": "n1"}}}


def write(path: pathlib.Path, lines: list[str]) -> pathlib.Path:
    path.write_text("".join(lines), encoding="utf-8")
    return path


def read_all(path: pathlib.Path) -> list[dict]:
    with traces.open_trace(path) as (_, records):
        return list(records)


def line(record: object) -> str:
    return json.dumps(record) + "\n"


def test_a_good_trace_reads_back(tmp_path: pathlib.Path) -> None:
    with traces.Writer(tmp_path / "t.jsonl.gz", {"start": 5.0}) as writer:
        writer.write(NODE)
        writer.write({"kind": "truth", "type": "fatal", "node": "n1", "start": 1, "end": 2})
    assert [r["kind"] for r in read_all(tmp_path / "t.jsonl.gz")] == ["node", "truth"]


def test_bad_json_names_the_line(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "t.jsonl", [line(HEADER), line(NODE), "{not json\n"])
    with pytest.raises(traces.TraceError, match=r"t\.jsonl:3: not valid JSON"):
        read_all(path)


def test_unknown_kind_and_missing_fields_name_the_line(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "t.jsonl", [line(HEADER), line({"kind": "pod", "t": 1})])
    with pytest.raises(traces.TraceError, match=r":2: unknown record kind 'pod'"):
        read_all(path)
    path = write(tmp_path / "u.jsonl", [line(HEADER), line({"kind": "gpunode", "t": 1, "name": "n"})])
    with pytest.raises(traces.TraceError, match=r":2: gpunode record needs a `status` or a `patch`"):
        read_all(path)


def test_a_missing_or_foreign_header_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(traces.TraceError, match="empty trace"):
        read_all(write(tmp_path / "e.jsonl", []))
    with pytest.raises(traces.TraceError, match=r":1: not a gpu-health trace"):
        read_all(write(tmp_path / "f.jsonl", [line(NODE)]))
    with pytest.raises(traces.TraceError, match="version 99 is not supported"):
        read_all(write(tmp_path / "v.jsonl", [line({**HEADER, "version": 99})]))


def test_a_cut_last_line_is_a_truncated_trace(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path / "t.jsonl", [line(HEADER), line(NODE), line(NODE)[:20]])
    with pytest.raises(traces.TraceError, match=r":3: truncated trace"):
        read_all(path)


def test_a_truncated_gzip_stream_is_named(tmp_path: pathlib.Path) -> None:
    data = gzip.compress(("".join([line(HEADER)] + [line(NODE)] * 2000)).encode())
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(traces.TraceError, match=r"t\.jsonl\.gz:\d+: truncated"):
        read_all(path)


def test_status_patches_round_trip() -> None:
    before = {"agent": {"lastHeartbeatTime": "a", "version": "1"}, "gpus": [{"index": 0, "smClockMHz": 1}]}
    after = {
        "agent": {"lastHeartbeatTime": "b", "version": "1"},
        "gpus": [{"index": 0, "smClockMHz": 2, "lost": True}, {"index": 1}],
    }
    patch = traces.status_patch(before, after)
    assert traces.apply_status_patch(before, patch) == after
    assert before["gpus"][0]["smClockMHz"] == 1, "the previous status is not changed"
    assert traces.apply_status_patch(after, traces.status_patch(after, before)) == before


def test_deletions_of_nodes_and_gpunodes_read_back_and_a_record_without_its_object_is_named(
    tmp_path: pathlib.Path,
) -> None:
    gone = [{"kind": kind, "t": 5, "name": "n1", "deleted": True} for kind in ("node", "gpunode")]
    assert read_all(write(tmp_path / "t.jsonl", [line(HEADER), line(NODE), *map(line, gone)]))[1:] == gone
    for record, said in (
        ({"kind": "node", "t": 5, "name": "n1"}, "node record needs an `object`"),
        ({"kind": "node", "t": 5, "name": "", "deleted": True}, "node record needs an `object`"),
        ({"kind": "gpunode", "t": 5, "name": "n1", "deleted": "yes"}, "or `deleted: true`"),
    ):
        with pytest.raises(traces.TraceError, match=rf":2: .*{re.escape(said)}"):
            read_all(write(tmp_path / "b.jsonl", [line(HEADER), line(record)]))


@pytest.mark.parametrize("version", sorted(traces.READS))
def test_every_older_version_still_reads(tmp_path: pathlib.Path, version: int) -> None:
    path = write(tmp_path / "t.jsonl", [line({**HEADER, "version": version}), line(NODE)])
    assert read_all(path) == [NODE]


def test_agent_pods_read_back_and_a_malformed_one_is_named(tmp_path: pathlib.Path) -> None:
    pod = {
        "kind": "agentpod",
        "t": 3,
        "name": "gpu-health/agent-x",
        "node": "n1",
        "ready": False,
        "since": None,
    }
    gone = {"kind": "agentpod", "t": 4, "name": "gpu-health/agent-x", "deleted": True}
    assert read_all(write(tmp_path / "t.jsonl", [line(HEADER), line(pod), line(gone)])) == [pod, gone]
    for broken in ({**pod, "ready": "False"}, {**pod, "node": ""}, {**pod, "since": 5}):
        with pytest.raises(traces.TraceError, match=r":2: agentpod record needs a `name`, a `node`"):
            read_all(write(tmp_path / "b.jsonl", [line(HEADER), line(broken)]))


def test_a_gpunode_records_operator_part_must_be_an_object(tmp_path: pathlib.Path) -> None:
    from gpuhealth_operator.ladder.isolate import isolating  # noqa: PLC0415 - the field's own name

    assert isolating.STATUS_FIELD in traces.RESUMED_STATUS_FIELDS
    record = {"kind": "gpunode", "t": 1, "name": "n1", "status": {}, "operator": [{"type": "Ready"}]}
    with pytest.raises(traces.TraceError, match=r":2: gpunode record's `operator` must be an object"):
        read_all(write(tmp_path / "c.jsonl", [line(HEADER), line(record)]))
