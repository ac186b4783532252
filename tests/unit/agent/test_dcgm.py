"""DCGM facts from a dcgm-exporter: parsing, folding into NVML facts, and an unreachable exporter."""

import http.server
import threading
from collections.abc import Iterator

import prometheus_client
import pytest

from gpuhealth_agent import dcgm, metrics, runner, scenario, simulated
from gpuhealth_api import status

EXPORTER_TEXT = """\
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaa",device="nvidia0",Hostname="n1"} 0
DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-bbb",device="nvidia1",Hostname="n1"} 74
# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL Total number of double-bit volatile ECC errors.
# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="0",UUID="GPU-aaa",device="nvidia0"} 2
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1",UUID="GPU-bbb",device="nvidia1"} 0
# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed
# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0",UUID="GPU-aaa",device="nvidia0"} 0
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="1",UUID="GPU-bbb",device="nvidia1"} 1
# HELP DCGM_FI_DEV_THERMAL_VIOLATION Throttling duration due to thermal constraints (in us).
# TYPE DCGM_FI_DEV_THERMAL_VIOLATION counter
DCGM_FI_DEV_THERMAL_VIOLATION{gpu="0",UUID="GPU-aaa",device="nvidia0"} 1000
DCGM_FI_DEV_THERMAL_VIOLATION{gpu="1",UUID="GPU-bbb",device="nvidia1"} 0
# HELP DCGM_FI_DEV_POWER_VIOLATION Throttling duration due to power constraints (in us).
# TYPE DCGM_FI_DEV_POWER_VIOLATION counter
DCGM_FI_DEV_POWER_VIOLATION{gpu="0",UUID="GPU-aaa",device="nvidia0"} 50
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",device="nvidia0"} 44
"""


def test_parse_exporter_text() -> None:
    facts = dcgm.parse_text(EXPORTER_TEXT)
    assert set(facts) == {"GPU-aaa", "GPU-bbb"}  # by UUID: DCGM's gpu index need not be NVML's
    assert facts["GPU-aaa"] == dcgm.GpuFacts(
        uuid="GPU-aaa",
        index=0,
        last_xid=0,
        dbe_volatile=2,
        remap_failure=False,
        thermal_violation=1000,
        power_violation=50,
    )
    assert facts["GPU-bbb"].last_xid == 74
    assert facts["GPU-bbb"].remap_failure is True
    assert facts["GPU-bbb"].power_violation is None


def test_a_record_without_a_uuid_is_left_out() -> None:
    assert dcgm.parse_text('DCGM_FI_DEV_XID_ERRORS{gpu="0"} 79\n') == {}


def gpus() -> list[status.GPUStatus]:
    return [
        status.GPUStatus(index=0, uuid="GPU-aaa", ecc={"uncorrectedVolatile": 0}, clockEventReasons=[]),
        status.GPUStatus(index=1, uuid="GPU-bbb", remappedRows={"failure": False}),
        status.GPUStatus(index=2, uuid="GPU-ccc", lost=True),
    ]


def test_fold_adds_faults_and_never_clears_them() -> None:
    before = dcgm.parse_text(EXPORTER_TEXT)
    now_text = EXPORTER_TEXT.replace('device="nvidia0"} 1000', 'device="nvidia0"} 5000')
    facts = gpus()
    changed = dcgm.fold(facts, dcgm.parse_text(now_text), before)
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 2  # DCGM saw more than NVML
    assert facts[0]["clockEventReasons"] == [dcgm.THERMAL_REASON]  # violation time grew since last scrape
    assert facts[1]["remappedRows"]["failure"] is True
    assert "clockEventReasons" not in facts[1]
    assert changed == []  # XID 74 on GPU 1 was already known in the previous scrape


def test_the_first_scrape_is_a_baseline_not_news() -> None:
    # dcgm-exporter reports a GPU's last XID until DCGM restarts: at the first scrape of a new
    # agent process that XID is old (counted by an earlier agent, or cured by a repair since).
    first = gpus()
    assert dcgm.fold(first, dcgm.parse_text(EXPORTER_TEXT), {}) == []
    assert "clockEventReasons" not in first[1]
    later = dcgm.parse_text(
        EXPORTER_TEXT.replace('device="nvidia1",Hostname="n1"} 74', 'device="nvidia1"} 79')
    )
    changed = dcgm.fold(gpus(), later, dcgm.parse_text(EXPORTER_TEXT))
    assert [(gpu["index"], gpu["uuid"], code) for gpu, code in changed] == [(1, "GPU-bbb", 79)]


def test_facts_go_to_the_gpu_with_the_same_uuid_whatever_its_index() -> None:
    swapped = EXPORTER_TEXT.replace('gpu="0",UUID="GPU-aaa"', 'gpu="9",UUID="GPU-aaa"')
    facts = gpus()
    dcgm.fold(facts, dcgm.parse_text(swapped), {})
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 2  # NVML index 0 holds GPU-aaa, DCGM calls it 9
    strangers = EXPORTER_TEXT.replace("GPU-aaa", "GPU-zzz")
    facts = gpus()
    dcgm.fold(facts, dcgm.parse_text(strangers), {})
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 0  # same index, another GPU: not ours


def test_nvml_keeps_higher_counts() -> None:
    facts = [status.GPUStatus(index=0, uuid="GPU-aaa", ecc={"uncorrectedVolatile": 5})]
    dcgm.fold(facts, dcgm.parse_text(EXPORTER_TEXT), {})
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 5


@pytest.fixture
def exporter() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = EXPORTER_TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_scrape_a_local_exporter(exporter: str) -> None:
    source = dcgm.DcgmSource(exporter)
    facts = gpus()
    recorded: list[tuple[int, str, int]] = []
    assert source.apply(facts, lambda index, uuid, code: recorded.append((index, uuid, code)), 0.0)
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 2
    assert recorded == []  # the first scrape is the baseline
    assert source.failures == 0


def test_an_unreachable_exporter_is_counted_and_nvml_facts_stand() -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as probe:
        port = probe.server_address[1]  # a port that was free a moment ago and now has no listener
    source = dcgm.DcgmSource(f"http://127.0.0.1:{port}/metrics", timeout_seconds=2)
    facts = gpus()
    assert not source.apply(facts, lambda *_: None, 0.0)
    assert source.failures == 1
    assert facts == gpus()


def test_the_agent_folds_dcgm_facts_into_its_report() -> None:
    # Was: the first scrape's XID 74 counted as a fresh XID (gpus[1]["xids"] == [74 once]); on every
    # agent restart that re-drained repaired nodes and undid human overrides.
    uuids = [simulated.gpu_uuid("n", i) for i in range(2)]
    exporter = Scripted(text(uuids, xids=(0, 74), dbe=(2, 0), remap=(0, 1)))
    agent, moment = sim_agent("gpus: 2\n", exporter)
    gpus = agent.run_once().status["gpus"]
    assert gpus[0]["ecc"]["uncorrectedVolatile"] == 2
    assert gpus[1]["remappedRows"]["failure"] is True
    assert "xids" not in gpus[1]
    exporter.text = text(uuids, xids=(0, 79), dbe=(2, 0), remap=(0, 1))
    moment[0] = 5
    gpus = agent.run_once().status["gpus"]
    assert gpus[1]["xids"] == [{"code": 79, "count": 1, "lastSeen": "2027-01-15T08:00:05.000000Z"}]
    labels = {"gpu": "1", "uuid": gpus[1]["uuid"], "code": "79"}
    assert agent_metrics(agent).get_sample_value("gpuhealth_agent_gpu_xid_errors_total", labels) == 1
    moment[0] = 10
    assert agent.run_once().status["gpus"][1]["xids"][0]["count"] == 1  # the same last XID again: no news
    agent.dcgm = dcgm.DcgmSource("http://127.0.0.1:9/metrics", timeout_seconds=1)  # nothing listens on port 9
    assert agent.run_once().status["gpus"][0]["ecc"]["uncorrectedVolatile"] == 0  # NVML facts still reported
    assert agent_metrics(agent).get_sample_value("gpuhealth_agent_dcgm_scrape_failures_total") == 1


def test_an_agent_restart_does_not_count_the_exporters_last_xid_again() -> None:
    """The false drain of issue 24: a rollout restarts the agent; DCGM still shows XID 79 from before
    the GPU was repaired (and its XIDs cleared). The new agent must report no XID."""
    uuids = [simulated.gpu_uuid("n", i) for i in range(2)]
    exporter = Scripted(text(uuids, xids=(0, 79)))
    agent, moment = sim_agent("gpus: 2\n", exporter)
    for second in (0, 5, 10):
        moment[0] = second
        assert all("xids" not in gpu for gpu in agent.run_once().status["gpus"])


def test_an_xid_from_nvml_and_dcgm_counts_once() -> None:
    uuids = [simulated.gpu_uuid("n", i) for i in range(2)]
    exporter = Scripted(text(uuids, xids=(0, 0)))
    agent, moment = sim_agent("gpus: 2\ntimeline:\n- {after: 3s, gpu: 1, xid: 48}\n", exporter)
    agent.run_once()  # the baseline
    moment[0] = 5
    gpus = agent.run_once().status["gpus"]  # the NVML event
    assert gpus[1]["xids"][0]["count"] == 1
    exporter.text = text(uuids, xids=(0, 48))  # dcgm-exporter catches up a collection later
    moment[0] = 35
    gpus = agent.run_once().status["gpus"]
    assert gpus[1]["xids"][0]["count"] == 1


def test_an_xid_dcgm_reports_before_nvml_counts_once() -> None:
    uuids = [simulated.gpu_uuid("n", i) for i in range(2)]
    exporter = Scripted(text(uuids, xids=(0, 0)))
    agent, moment = sim_agent("gpus: 2\ntimeline:\n- {after: 6s, gpu: 1, xid: 48}\n", exporter)
    agent.run_once()
    exporter.text = text(uuids, xids=(0, 48))
    moment[0] = 5
    assert agent.run_once().status["gpus"][1]["xids"][0]["count"] == 1  # from DCGM
    moment[0] = 10
    assert agent.run_once().status["gpus"][1]["xids"][0]["count"] == 1  # NVML's event of the same XID


def test_two_xids_of_one_code_far_apart_count_twice() -> None:
    uuids = [simulated.gpu_uuid("n", i) for i in range(2)]
    exporter = Scripted(text(uuids, xids=(0, 0)))
    agent, moment = sim_agent(
        "gpus: 2\ntimeline:\n- {after: 3s, gpu: 1, xid: 48}\n- {after: 1000s, gpu: 1, xid: 48}\n", exporter
    )
    agent.run_once()
    moment[0] = 5
    agent.run_once()
    exporter.text = text(uuids, xids=(0, 48))
    moment[0] = 35
    agent.run_once()
    moment[0] = 1005
    assert agent.run_once().status["gpus"][1]["xids"][0]["count"] == 2


class Scripted(dcgm.DcgmSource):
    """A dcgm-exporter whose text the test sets."""

    def __init__(self, text: str) -> None:
        super().__init__("http://scripted.invalid/metrics")
        self.text = text

    def scrape(self) -> dict[str, dcgm.GpuFacts] | None:
        return dcgm.parse_text(self.text)


def text(
    uuids: list[str], *, xids: tuple[int, ...], dbe: tuple[int, ...] = (), remap: tuple[int, ...] = ()
) -> str:
    lines = []
    for index, uuid in enumerate(uuids):
        where = f'gpu="{index}",UUID="{uuid}"'
        lines.append(f"{dcgm.XID}{{{where}}} {xids[index]}")
        if dbe:
            lines.append(f"{dcgm.DBE_VOLATILE}{{{where}}} {dbe[index]}")
        if remap:
            lines.append(f"{dcgm.ROW_REMAP_FAILURE}{{{where}}} {remap[index]}")
    return "\n".join(lines) + "\n"


def sim_agent(plan: str, exporter: dcgm.DcgmSource) -> tuple[runner.Agent, list[float]]:
    moment = [0.0]
    lib = simulated.library(scenario.parse(plan), clock=lambda: moment[0], start=0.0, identity_seed="n")
    agent = runner.Agent(
        runner.Settings("n", runner.BACKEND_SIM, event_thread=False),
        lib,
        agent_metrics=metrics.AgentMetrics(prometheus_client.CollectorRegistry()),
        dcgm_source=exporter,
        clock=lambda: 1_800_000_000.0 + moment[0],
    )
    return agent, moment


def agent_metrics(agent: runner.Agent) -> prometheus_client.CollectorRegistry:
    found = [o for o in agent.outputs if isinstance(o, metrics.AgentMetrics)]
    return found[0].registry


def test_a_count_nvml_cannot_read_but_dcgm_can_is_read() -> None:
    facts = [status.GPUStatus(index=0, uuid="GPU-aaa", unreadable=["ecc.uncorrectedVolatile", "powerWatts"])]
    dcgm.fold(facts, dcgm.parse_text(EXPORTER_TEXT), {})
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 2
    assert facts[0]["unreadable"] == ["powerWatts"]
    only = [status.GPUStatus(index=0, uuid="GPU-aaa", unreadable=["ecc.uncorrectedVolatile"])]
    dcgm.fold(only, dcgm.parse_text(EXPORTER_TEXT), {})
    assert "unreadable" not in only[0]
