"""`trace import --prometheus`: the agent's (or dcgm-exporter's) series in Prometheus become a trace.

The series→trace conversion runs on canned `query_range` answers served by a
fake Prometheus (each series a function of time, evaluated on the query's
step grid, refusing more than Prometheus' 11,000 points per series); the
HTTP client against a small local server that answers errors. What a fleet
operator sees: the faulty node in the imported history is drained by the
backtest, a fact Prometheus does not hold is absent, a long range is read in
chunks, and an unreachable Prometheus or a bad flag is one line and an exit
code, never a traceback or an empty trace.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import itertools
import json
import pathlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http import server
from typing import Any, Final

import pytest

from gpuhealth_sim import cli
from gpuhealth_sim.backtest import progress as progressing
from gpuhealth_sim.backtest import prometheus_import, replayer, traces
from gpuhealth_sim.controlplane import ports

START: Final = 1_767_571_200.0
"""2026-01-05T00:00:00.000000Z"""
UUIDS: Final = {("a", 0): "GPU-a0", ("a", 1): "GPU-a1", ("b", 0): "GPU-b0", ("b", 1): "GPU-b1"}
P: Final = "gpuhealth_agent_"
Value = Callable[[float], float | None]
"""A series' value at a time (None: no sample there)."""

REASONS: Final = (
    "GpuIdle",
    "ApplicationsClocksSetting",
    "SwPowerCap",
    "HwSlowdown",
    "SyncBoost",
    "SwThermalSlowdown",
    "HwThermalSlowdown",
    "HwPowerBrakeSlowdown",
    "DisplayClockSetting",
)


def const(value: float) -> Value:
    return lambda _t: value


def after(seconds: float, before: float, then: float) -> Value:
    return lambda t: then if t >= START + seconds else before


class FakePrometheus:
    """query_range over in-memory series: {(name, labels): value function}."""

    def __init__(self, series: Mapping[tuple[str, frozenset[tuple[str, str]]], Value]) -> None:
        self.series = series
        self.calls: list[dict[str, str]] = []

    def __call__(self, path: str, params: Mapping[str, str]) -> Any:
        assert path == "/api/v1/query_range"
        self.calls.append(dict(params))
        start, end, step = float(params["start"]), float(params["end"]), float(params["step"])
        points = round((end - start) / step) + 1
        assert points <= prometheus_import.MAX_POINTS, f"{points} points: Prometheus refuses this query"
        name = params["query"].split("{", 1)[0]
        result = []
        for (series_name, labels), value in self.series.items():
            if series_name != name:
                continue
            values = []
            for i in range(points):
                t = start + i * step
                v = value(t)
                if v is not None:
                    values.append([t, repr(float(v))])
            if values:
                result.append({"metric": {"__name__": name, **dict(labels)}, "values": values})
        return {"resultType": "matrix", "result": result}


def gpu_series(node: str, gpu: int, **override: Value) -> dict[tuple[str, frozenset[tuple[str, str]]], Value]:
    """A busy, healthy GPU as the agent exports it (labels as the chart's ServiceMonitor relabels)."""
    base = {"node": node, "gpu": str(gpu), "uuid": UUIDS[node, gpu], "job": "agent"}

    def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
        return (P + name, frozenset({**base, **labels}.items()))

    series: dict[tuple[str, frozenset[tuple[str, str]]], Value] = {
        key("gpu_temperature_celsius"): override.get("temperature", const(60)),
        key("gpu_slowdown_temperature_celsius"): const(87),
        key("gpu_sm_clock_mhz"): const(1980),
        key("gpu_max_sm_clock_mhz"): const(1980),
        key("gpu_utilization_percent"): const(97),
        key("gpu_ecc_errors", kind="uncorrected", scope="volatile"): override.get("dbe", const(0)),
        key("gpu_ecc_errors", kind="corrected", scope="volatile"): const(0),
        key("gpu_recovery_action"): const(0),
        key("gpu_row_remap_failure"): const(0),
        key("gpu_row_remap_pending"): const(0),
        key("gpu_lost"): override.get("lost", const(0)),
    }
    for reason in REASONS:
        series[key("gpu_clock_event_reason_active", reason=reason)] = const(0)
    if "xid79" in override:
        series[key("gpu_xid_errors_total", code="79")] = override["xid79"]
    return series


def node_series(node: str) -> dict[tuple[str, frozenset[tuple[str, str]]], Value]:
    return {(P + "expected_gpus", frozenset({"node": node, "job": "agent"}.items())): const(2)}


def fleet(**b0: Value) -> FakePrometheus:
    series: dict[tuple[str, frozenset[tuple[str, str]]], Value] = {}
    for node in ("a", "b"):
        series |= node_series(node)
        for gpu in (0, 1):
            series |= gpu_series(node, gpu, **(b0 if (node, gpu) == ("b", 0) else {}))
    return FakePrometheus(series)


def options(seconds: float = 3600, step: float = 30, **more: Any) -> prometheus_import.Options:
    return prometheus_import.Options("http://prometheus:9090", START, START + seconds, step, **more)


def read(path: pathlib.Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with traces.open_trace(path) as (header, records):
        return header, list(records)


def statuses(records: list[dict[str, Any]], node: str) -> list[tuple[float, dict[str, Any]]]:
    """Each written status of a node, in full (patches applied)."""
    out: list[tuple[float, dict[str, Any]]] = []
    current: dict[str, Any] = {}
    for r in records:
        if r["kind"] == "gpunode" and r["name"] == node:
            current = r["status"] if "status" in r else traces.apply_status_patch(current, r["patch"])
            out.append((r["t"], current))
    return out


DRAIN_POLICY: Final = {
    "apiVersion": "gpuhealth.io/v1alpha1",
    "kind": "GPUHealthPolicy",
    "metadata": {"name": "drain"},
    "spec": {
        "nodeSelector": {"matchLabels": {"nvidia.com/gpu.present": "true"}},
        "dryRun": False,
        "maxUnavailable": 1,
        "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Drain"}],
        "recovery": {"uncordon": True, "healthyForSeconds": 600},
    },
}


def test_series_become_a_trace_saying_where_from_and_at_which_resolution(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "t.jsonl.gz"
    counts = prometheus_import.run(options(), out, fleet())
    header, records = read(out)
    assert header["start"] == START
    assert header["source"]["kind"] == "prometheus"
    assert header["source"]["url"] == "http://prometheus:9090"
    assert header["source"]["stepSeconds"] == 30
    assert header["resolutionSeconds"] == 30
    assert counts.nodes == 2
    nodes = [r for r in records if r["kind"] == "node"]
    assert [n["object"]["metadata"]["name"] for n in nodes] == ["a", "b"]
    assert nodes[0]["t"] == 0
    assert nodes[0]["object"]["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert nodes[0]["object"]["status"]["capacity"] == {"nvidia.com/gpu": "2"}
    assert {r["kind"] for r in records} == {"node", "gpunode"}  # no pods, no truth, no DRA
    (t, first), *_ = statuses(records, "a")
    assert t == 0
    gpu = first["gpus"][0]
    assert gpu["index"] == 0 and gpu["uuid"] == "GPU-a0"
    assert gpu["temperatureCelsius"] == 60 and gpu["smClockMHz"] == 1980
    assert gpu["ecc"] == {"uncorrectedVolatile": 0, "correctedVolatile": 0}
    assert gpu["clockEventReasons"] == []
    assert gpu["recoveryAction"] == "None"
    assert gpu["remappedRows"] == {"failure": False, "pending": False}
    # Absent, never invented: Prometheus holds no model, serial, power or pages series here.
    for absent in ("model", "serial", "pciBusId", "powerWatts", "retiredPages", "xids"):
        assert absent not in gpu
    assert "model" not in first["summary"]
    assert first["summary"]["gpuCount"] == 2
    assert first["agent"]["expectedGpuCount"] == 2
    assert first["agent"]["lastHeartbeatTime"] == "2026-01-05T00:00:00.000000Z"
    assert first["agent"]["heartbeatSeconds"] == 300
    # Written as the agent writes: nothing significant changes, so a heartbeat every 300 s.
    assert [t for t, _ in statuses(records, "a")] == [
        0,
        300,
        600,
        900,
        1200,
        1500,
        1800,
        2100,
        2400,
        2700,
        3000,
        3300,
        3600,
    ]


def test_a_dbe_in_the_series_is_written_at_its_step_and_the_backtest_drains_that_node(
    tmp_path: pathlib.Path,
) -> None:
    out = tmp_path / "t.jsonl"
    prometheus_import.run(options(seconds=7200), out, fleet(dbe=after(1000, 0, 1)))
    _, records = read(out)
    written = statuses(records, "b")
    changed = next((t, s) for t, s in written if s["gpus"][0]["ecc"]["uncorrectedVolatile"] == 1)
    assert changed[0] == 1020  # the first step at or after the fault (a 30 s step), not the heartbeat
    assert changed[1]["gpus"][0]["observedTime"] == "2026-01-05T00:17:00.000000Z"

    result = replayer.run(out, DRAIN_POLICY, tick_seconds=30)
    acted = [(a.node, a.action) for a in result.actions if not a.action.startswith("Label")]
    assert ("b", "Drain") in acted, acted
    assert not [a for a in acted if a[0] == "a"], acted


def test_an_xid_is_the_counter_growing_in_the_window_and_one_counted_before_is_not_in_the_trace(
    tmp_path: pathlib.Path,
) -> None:
    series: dict[tuple[str, frozenset[tuple[str, str]]], Value] = {}
    for node in ("a", "b"):
        series |= node_series(node)
        for gpu in (0, 1):
            series |= gpu_series(node, gpu)
    series |= gpu_series("a", 0, xid79=const(1))  # counted before the window: its time is unknown
    series |= gpu_series("b", 0, xid79=after(600, 0, 1))
    out = tmp_path / "t.jsonl"
    prometheus_import.run(options(), out, FakePrometheus(series))
    _, records = read(out)
    assert all("xids" not in g for _, s in statuses(records, "a") for g in s["gpus"])
    t, seen = next((t, s) for t, s in statuses(records, "b") if "xids" in s["gpus"][0])
    assert t == 600
    assert seen["gpus"][0]["xids"] == [{"code": 79, "count": 1, "lastSeen": "2026-01-05T00:10:00.000000Z"}]
    assert statuses(records, "b")[-1][1]["gpus"][0]["xids"][0]["count"] == 1  # kept, not counted again


def test_a_lost_gpu_is_lost_and_its_frozen_values_are_dropped(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "t.jsonl"
    prometheus_import.run(options(), out, fleet(lost=after(900, 0, 1)))
    _, records = read(out)
    t, lost = next((t, s) for t, s in statuses(records, "b") if s["gpus"][0].get("lost"))
    assert t == 900
    assert {k: v for k, v in lost["gpus"][0].items() if k != "observedTime"} == {
        "index": 0,
        "uuid": "GPU-b0",
        "lost": True,
    }
    assert lost["summary"]["gpuCount"] == 1


def test_a_lost_gpu_keeps_its_xids_as_the_agent_reports_them(tmp_path: pathlib.Path) -> None:
    # XID 79 (fallen off the bus) at 600 s, the GPU lost from 630 s: the agent keeps a lost GPU's XIDs
    # (history.stamp), so XidCritical holds while it is lost. Before issue 52 the import dropped them with
    # the lost GPU's frozen values: the node turned healthy at 630 s and a policy without a GPULost rule
    # uncordoned a node whose GPU had fallen off the bus.
    series: dict[tuple[str, frozenset[tuple[str, str]]], Value] = {}
    for node in ("a", "b"):
        series |= node_series(node)
        for gpu in (0, 1):
            series |= gpu_series(node, gpu)
    series |= gpu_series("b", 0, xid79=after(600, 0, 1), lost=after(630, 0, 1))
    out = tmp_path / "t.jsonl"
    prometheus_import.run(options(seconds=7200), out, FakePrometheus(series))
    _, records = read(out)
    last = statuses(records, "b")[-1][1]["gpus"][0]
    assert last.get("lost") is True, last
    assert last.get("xids") == [{"code": 79, "count": 1, "lastSeen": "2026-01-05T00:10:00.000000Z"}], last

    policy = json.loads(json.dumps(DRAIN_POLICY))
    policy["spec"]["rules"] = [{"name": "xid", "condition": "XidCritical", "action": "Drain"}]
    result = replayer.run(out, policy, tick_seconds=30)
    acted = [a.action for a in result.actions if a.node == "b" and not a.action.startswith("Label")]
    assert acted == ["Drain"], result.actions


def test_where_the_series_stop_no_status_is_written_and_when_they_return_one_is_at_once(
    tmp_path: pathlib.Path,
) -> None:
    def gap(value: Value) -> Value:
        return lambda t: None if START + 1200 <= t < START + 2400 else value(t)

    prom = fleet()
    prom.series = {k: (gap(v) if dict(k[1])["node"] == "b" else v) for k, v in prom.series.items()}
    out = tmp_path / "t.jsonl"
    prometheus_import.run(options(), out, prom)
    _, records = read(out)
    times = [t for t, _ in statuses(records, "b")]
    assert not [t for t in times if 1200 <= t < 2400]
    assert 2400 in times  # the agent is back: it writes at once, not at its next heartbeat


def test_a_long_range_is_read_in_queries_prometheus_accepts_without_a_step_lost_or_twice(
    tmp_path: pathlib.Path,
) -> None:
    prom = FakePrometheus(
        {
            **node_series("a"),
            (
                P + "gpu_temperature_celsius",
                frozenset({"node": "a", "gpu": "0", "uuid": "GPU-a0"}.items()),
            ): const(50),
        }
    )
    out = tmp_path / "t.jsonl.gz"
    days = 14
    counts = prometheus_import.run(options(seconds=days * 86_400, step=60), out, prom)
    steps = days * 1440 + 1
    assert counts.steps == steps
    temperature = [c for c in prom.calls if c["query"].startswith(P + "gpu_temperature_celsius")]
    # One GPU: after the first (the fleet's size unknown), chunks as long as allowed.
    first = prometheus_import.FIRST_CHUNK_STEPS
    assert len(temperature) == 1 + -(-(steps - first) // prometheus_import.POINTS_PER_QUERY)
    covered = [(float(c["start"]), float(c["end"])) for c in temperature]
    assert covered[0][0] == START and covered[-1][1] == START + days * 86_400
    assert all(b[0] - a[1] == 60 for a, b in itertools.pairwise(covered))
    _header, records = read(out)
    assert records[-1]["t"] == days * 86_400  # the last step, written (a heartbeat falls on it)


def test_a_large_fleet_is_read_in_shorter_chunks_so_a_chunk_fits_in_memory(tmp_path: pathlib.Path) -> None:
    prom = fleet()  # 4 GPUs
    opts = options(seconds=3000, step=1, gpu_steps_per_chunk=200)
    counts = prometheus_import.run(opts, tmp_path / "t.jsonl", prom)
    assert counts.steps == 3001
    spans = [
        round((float(c["end"]) - float(c["start"])) / 1) + 1
        for c in prom.calls
        if c["query"].startswith(P + "gpu_temperature_celsius")
    ]
    assert spans[0] == prometheus_import.FIRST_CHUNK_STEPS
    assert set(spans[1:-1]) == {50}  # 200 GPU statuses / 4 GPUs
    assert sum(spans) == 3001


def test_a_selector_narrows_every_query(tmp_path: pathlib.Path) -> None:
    prom = fleet()
    prometheus_import.run(options(selector='job="agent"'), tmp_path / "t.jsonl", prom)
    assert all(c["query"].endswith('{job="agent"}') for c in prom.calls)


def test_dcgm_exporter_series_become_the_agents_facts(tmp_path: pathlib.Path) -> None:
    labels = {"gpu": "0", "UUID": "GPU-d0", "Hostname": "d", "modelName": "NVIDIA H100 80GB HBM3"}
    series: dict[tuple[str, frozenset[tuple[str, str]]], Value] = {
        ("DCGM_FI_DEV_GPU_TEMP", frozenset(labels.items())): const(55),
        ("DCGM_FI_DEV_SM_CLOCK", frozenset(labels.items())): const(1980),
        ("DCGM_FI_DEV_XID_ERRORS", frozenset(labels.items())): after(600, 13, 79),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", frozenset(labels.items())): const(0),
    }
    out = tmp_path / "t.jsonl"
    prometheus_import.run(options(source="dcgm"), out, FakePrometheus(series))
    _, records = read(out)
    first = statuses(records, "d")[0][1]
    assert first["gpus"][0]["temperatureCelsius"] == 55
    assert first["summary"]["model"] == "NVIDIA H100 80GB HBM3"
    assert "xids" not in first["gpus"][0]  # the last XID at the first sample is old news (as the agent)
    t, seen = next((t, s) for t, s in statuses(records, "d") if "xids" in s["gpus"][0])
    assert t == 600 and seen["gpus"][0]["xids"][0]["code"] == 79


def test_no_series_at_all_is_said_and_no_trace_written(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "t.jsonl"
    with pytest.raises(prometheus_import.PrometheusError, match="holds no gpuhealth_agent_gpu_"):
        prometheus_import.run(options(), out, FakePrometheus({}))
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "seconds"), [("14d", 14 * 86_400), ("1h30m", 5400), ("90", 90), ("500ms", 0.5)]
)
def test_durations_read_as_prometheus_writes_them(text: str, seconds: float) -> None:
    assert prometheus_import.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "14 days", "d", "nan", "1h foo"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        prometheus_import.parse_duration(text)


def test_progress_is_printed_at_most_every_few_seconds() -> None:
    now = [0.0]
    stream = io.StringIO()
    progress = progressing.Progress(stream, every_seconds=5, clock=lambda: now[0])
    for i in range(20):
        now[0] = i * 0.5
        progress.update(i * 10, i * 3600.0, 86_400 * 2)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2  # at 0 s and 5 s of 9.5 s
    assert lines[1] == "100 records, 10:00:00 of 2d 00:00:00 covered"


# -- the HTTP client and the command line ----------------------------------------------------------


@contextlib.contextmanager
def answering(code: int, body: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """A local server answering every GET with `code` and `body`; yields its URL and the paths asked."""
    asked: list[str] = []

    class Handler(server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    http = server.ThreadingHTTPServer((ports.LOOPBACK, 0), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{ports.LOOPBACK}:{http.server_address[1]}", asked
    finally:
        http.shutdown()
        http.server_close()


def test_a_bad_query_is_not_retried_and_prometheus_own_error_is_said() -> None:
    body = {
        "status": "error",
        "errorType": "bad_data",
        "error": "exceeded maximum resolution of 11,000 points",
    }
    with answering(400, body) as (url, asked):
        fetch = prometheus_import.HttpFetch(url, sleep=lambda _s: None)
        with pytest.raises(prometheus_import.PrometheusError, match="HTTP 400: exceeded maximum resolution"):
            fetch("/api/v1/query_range", {"query": "x"})
    assert len(asked) == 1


def test_a_failing_prometheus_is_retried_a_bounded_number_of_times() -> None:
    slept: list[float] = []
    with answering(503, {"status": "error", "error": "overloaded"}) as (url, asked):
        fetch = prometheus_import.HttpFetch(url, sleep=slept.append)
        with pytest.raises(prometheus_import.PrometheusError, match="HTTP 503: overloaded"):
            fetch("/api/v1/query_range", {"query": "x"})
    assert len(asked) == prometheus_import.RETRIES + 1
    assert len(slept) == prometheus_import.RETRIES


def test_an_unreachable_prometheus_exits_3_with_one_line_and_no_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "sleep", lambda _s: None)  # the retries' backoff
    (port,) = ports.free_ports(1)
    out = tmp_path / "t.jsonl"
    argv = [
        "trace",
        "import",
        "--prometheus",
        f"http://{ports.LOOPBACK}:{port}",
        "--since",
        "1h",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 3
    err = capsys.readouterr().err
    assert f"cannot read Prometheus at http://{ports.LOOPBACK}:{port}" in err
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "flags",
    [
        ["--since", "fortnight"],
        ["--since", "0s"],
        ["--step", "0"],
        ["--step=-1m"],
        ["--until", "yesterday"],
        ["--since", "1h", "--until", "1000"],  # before the epoch's first hour: a negative start
        ["--node-labels", "pool"],
        ["--heartbeat-seconds", "-1"],
    ],
)
def test_bad_flags_exit_2_before_asking_prometheus(
    flags: list[str], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    argv = ["trace", "import", "--prometheus", "http://127.0.0.1:1", "--out", str(out), *flags]
    assert cli.main(argv) == 2
    assert "gpu-health-sim:" in capsys.readouterr().err
    assert not out.exists()


def test_the_command_line_imports_and_prints_what_it_wrote(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prom = fleet()
    monkeypatch.setattr(prometheus_import, "HttpFetch", lambda *_a, **_k: prom)
    out = tmp_path / "t.jsonl.gz"
    argv = [
        "trace", "import", "--prometheus", "http://p:9090", "--since", "1h", "--until", str(START + 3600),
        "--step", "30s", "--node-labels", "pool=train,zone=a", "--out", str(out),
    ]  # fmt: skip
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert f"{out}: 2 nodes" in captured.out
    assert "covered" in captured.err  # progress (the first update is printed at once)
    with gzip.open(out, "rt") as handle:
        lines = [json.loads(line) for line in handle]
    assert lines[0]["start"] == START
    node = next(r for r in lines if r["kind"] == "node")
    assert node["object"]["metadata"]["labels"]["pool"] == "train"

    assert cli.main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_prometheus_failing_midway_leaves_no_trace_that_would_read_as_a_quiet_fleet(
    tmp_path: pathlib.Path,
) -> None:
    prom = fleet()

    def failing(path: str, params: Mapping[str, str]) -> Any:
        if float(params["start"]) >= START + 2000:  # the third chunk on
            raise prometheus_import.PrometheusError(
                "cannot read Prometheus at http://p (/api/v1/query_range)"
            )
        return prom(path, params)

    out = tmp_path / "t.jsonl.gz"
    opts = options(seconds=3000, step=1, gpu_steps_per_chunk=4000)  # chunks of 1,000 steps
    with pytest.raises(prometheus_import.PrometheusError):
        prometheus_import.run(opts, out, failing)
    assert not out.exists()


def test_an_out_that_cannot_be_written_is_an_os_error_and_nothing_is_deleted(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    with pytest.raises(OSError):
        prometheus_import.run(options(), directory, fleet())
    assert directory.is_dir()
