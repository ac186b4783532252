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
    assert set(facts) == {0, 1}
    assert facts[0] == dcgm.GpuFacts(
        uuid="GPU-aaa",
        last_xid=0,
        dbe_volatile=2,
        remap_failure=False,
        thermal_violation=1000,
        power_violation=50,
    )
    assert facts[1].last_xid == 74
    assert facts[1].remap_failure is True
    assert facts[1].power_violation is None


def gpus() -> list[status.GPUStatus]:
    return [
        status.GPUStatus(index=0, ecc={"uncorrectedVolatile": 0}, clockEventReasons=[]),
        status.GPUStatus(index=1, remappedRows={"failure": False}),
        status.GPUStatus(index=2, lost=True),
    ]


def test_fold_adds_faults_and_never_clears_them() -> None:
    seen: list[tuple[int, int]] = []
    before = dcgm.parse_text(EXPORTER_TEXT)
    now_text = EXPORTER_TEXT.replace('device="nvidia0"} 1000', 'device="nvidia0"} 5000')
    facts = gpus()
    dcgm.fold(facts, dcgm.parse_text(now_text), before, lambda index, code: seen.append((index, code)))
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 2  # DCGM saw more than NVML
    assert facts[0]["clockEventReasons"] == [dcgm.THERMAL_REASON]  # violation time grew since last scrape
    assert facts[1]["remappedRows"]["failure"] is True
    assert "clockEventReasons" not in facts[1]
    assert seen == []  # XID 74 on GPU 1 was already known in the previous scrape
    first = gpus()
    dcgm.fold(first, before, {}, lambda index, code: seen.append((index, code)))
    assert seen == [(1, 74)]
    assert "clockEventReasons" not in first[1]


def test_nvml_keeps_higher_counts() -> None:
    facts = [status.GPUStatus(index=0, ecc={"uncorrectedVolatile": 5})]
    dcgm.fold(facts, dcgm.parse_text(EXPORTER_TEXT), {}, lambda *_: None)
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
    recorded: list[tuple[int, int]] = []
    assert source.apply(facts, lambda index, code: recorded.append((index, code)))
    assert facts[0]["ecc"]["uncorrectedVolatile"] == 2
    assert recorded == [(1, 74)]
    assert source.failures == 0


def test_an_unreachable_exporter_is_counted_and_nvml_facts_stand() -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as probe:
        port = probe.server_address[1]  # a port that was free a moment ago and now has no listener
    source = dcgm.DcgmSource(f"http://127.0.0.1:{port}/metrics", timeout_seconds=2)
    facts = gpus()
    assert not source.apply(facts, lambda *_: None)
    assert source.failures == 1
    assert facts == gpus()


def test_the_agent_folds_dcgm_facts_into_its_report(exporter: str) -> None:
    lib = simulated.library(scenario.parse("gpus: 2\n"), clock=lambda: 0.0, start=0.0)
    registry = prometheus_client.CollectorRegistry()
    agent = runner.Agent(
        runner.Settings("n", runner.BACKEND_SIM, event_thread=False),
        lib,
        agent_metrics=metrics.AgentMetrics(registry),
        dcgm_source=dcgm.DcgmSource(exporter),
        clock=lambda: 1_800_000_000.0,
    )
    gpus = agent.run_once().status["gpus"]
    assert gpus[0]["ecc"]["uncorrectedVolatile"] == 2
    assert gpus[1]["remappedRows"]["failure"] is True
    assert gpus[1]["xids"] == [{"code": 74, "count": 1, "lastSeen": "2027-01-15T08:00:00.000Z"}]
    labels = {"gpu": "1", "uuid": gpus[1]["uuid"], "code": "74"}
    assert registry.get_sample_value("gpuhealth_agent_gpu_xid_errors_total", labels) == 1
    agent.dcgm = dcgm.DcgmSource("http://127.0.0.1:9/metrics", timeout_seconds=1)  # nothing listens on port 9
    assert agent.run_once().status["gpus"][0]["ecc"]["uncorrectedVolatile"] == 0  # NVML facts still reported
    assert registry.get_sample_value("gpuhealth_agent_dcgm_scrape_failures_total") == 1
