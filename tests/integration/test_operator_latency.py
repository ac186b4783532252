"""The operator's own share of a fault's latency, on its /metrics (issue 52).

`gpuhealth_operator_event_to_write_seconds`: from a watch event received to the first write its pass
sends; `gpuhealth_operator_events_total`: the watch events handled, so that CPU per event is
`rate(process_cpu_seconds_total) / rate(gpuhealth_operator_events_total)` (docs/metrics.md).
"""

from __future__ import annotations

import re

import pytest

import gpunode_facts
import operator_fixtures
import operator_harness
from gpuhealth_sim import waiting

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
ECC = {"ecc": {"uncorrectedVolatile": 1}}

operator = operator_fixtures.operator_fixture("latency")
fleet = operator_fixtures.fleet_fixture("lat")


def sample(text: str, name: str, labels: str = "") -> float | None:
    """The value of one series in a /metrics page (None if it is not there)."""
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else r"(?:\{\})?") + r" (\S+)$"
    for line in text.splitlines():
        if found := re.match(pattern, line):
            return float(found.group(1))
    return None


def test_a_faults_event_to_its_cordon_is_observed_as_the_operators_own_time(
    operator: operator_harness.OperatorProcess, fleet: operator_harness.Fleet
) -> None:
    name = f"{fleet.label}-a"[:63]
    fleet.add_node(name)
    fleet.policy(
        fleet.label,
        {
            "maxUnavailable": 2,
            "rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "Cordon"}],
        },
    )
    # The policy's own pass judges the node first (Healthy): the fault's report is then the event that acts.
    waiting.wait_until(
        lambda: fleet.gpunode(name).get("status", {}).get("health") == "Healthy",
        timeout_seconds=TIMEOUT,
        message="judged Healthy under the policy",
    )
    before = operator.metrics()
    written = sample(before, "gpuhealth_operator_event_to_write_seconds_count", 'handler="gpunode"') or 0.0
    events = sample(before, "gpuhealth_operator_events_total", 'kind="gpunode"')
    assert events is not None and events >= 1, "the GPUNode's first report was an event"

    fleet.report(name, gpunode_facts.agent_status(overrides={0: ECC}))
    waiting.wait_until(
        lambda: fleet.node(name)["spec"].get("unschedulable"), timeout_seconds=TIMEOUT, message="cordoned"
    )

    def observed() -> float | None:
        count = sample(
            operator.metrics(), "gpuhealth_operator_event_to_write_seconds_count", 'handler="gpunode"'
        )
        return count if count is not None and count > written else None

    waiting.wait_until(observed, timeout_seconds=TIMEOUT, message="the report's pass observed")
    after = operator.metrics()
    assert (sample(after, "gpuhealth_operator_events_total", 'kind="gpunode"') or 0) > events
    assert (sample(after, "process_cpu_seconds_total") or 0) > 0, "CPU per event needs the process CPU"
    total = sample(after, "gpuhealth_operator_event_to_write_seconds_sum", 'handler="gpunode"')
    count = sample(after, "gpuhealth_operator_event_to_write_seconds_count", 'handler="gpunode"')
    assert total is not None and count is not None
    # The operator's own share: well under the test's deadline, above nothing.
    assert 0 < total / count < TIMEOUT, (total, count)
