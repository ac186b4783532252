"""Only the replica that leads exports the fleet's gauges.

A replica that lost the Lease keeps the numbers of its last term in memory;
exported, a `sum` over both replicas double-counts and an alert on them never
resolves (the standby's last `Unhealthy 2` stays for ever). Counters are each
replica's own events and stay.
"""

from __future__ import annotations

import datetime

import prometheus_client

from gpuhealth_operator.shared import gpu_meters, metrics

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
FLEET_GAUGES = {
    "gpuhealth_operator_nodes",
    "gpuhealth_operator_budget_pending_nodes",
    "gpuhealth_operator_isolated_gpus",
    "gpuhealth_operator_drill_nodes",
    "gpuhealth_operator_breaker_open",
    "gpuhealth_operator_gpus",
    "gpuhealth_operator_gpus_healthy",
    "gpuhealth_operator_gpus_out_of_service",
    "gpuhealth_operator_drain_failed_nodes",
}


def scraped(meters: metrics.Metrics) -> dict[str, float]:
    """What a scrape of /metrics yields: sample name and labels to value."""
    text = prometheus_client.generate_latest(meters.registry).decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def names(meters: metrics.Metrics) -> set[str]:
    return {key.split("{")[0] for key in scraped(meters)}


def a_term(meters: metrics.Metrics) -> None:
    """What a leading replica's passes set: every fleet gauge, and one counter."""
    meters.nodes.labels("p", "Unhealthy").set(2)
    meters.budget_pending.labels("p").set(1)
    meters.isolated_gpus.labels("p").set(1)
    meters.drill_nodes.labels("p", "Unhealthy").set(1)
    meters.breaker_open.labels("p").set(1)
    meters.drain_failed_nodes.labels("p").set(1)
    tally = gpu_meters.GPUTally()
    tally.add("H100", 8, healthy=False, out_reason="cordoned")
    meters.record_gpus("p", tally, NOW)
    meters.actions.labels("Cordon", "EccUncorrectable").inc()


def test_a_replica_that_lost_the_lease_exports_no_fleet_gauge_only_its_own_counters() -> None:
    meters = metrics.Metrics.create()
    meters.set_leading(True)
    a_term(meters)
    assert names(meters) >= FLEET_GAUGES
    assert scraped(meters)["gpuhealth_operator_leader"] == 1

    meters.set_leading(False)
    after = scraped(meters)
    assert not FLEET_GAUGES & names(meters), "a standby's last counts would be summed with the leader's"
    assert after["gpuhealth_operator_leader"] == 0, "NotLeading reads it on every replica"
    assert after['gpuhealth_operator_actions_total{action="Cordon",reason="EccUncorrectable"}'] == 1


def test_a_pass_still_running_as_the_term_ends_exports_nothing_either() -> None:
    # The timer is cancelled after the lease is lost: its last pass may still set a gauge.
    meters = metrics.Metrics.create()
    meters.set_leading(True)
    meters.set_leading(False)
    a_term(meters)
    assert not FLEET_GAUGES & names(meters)


def test_a_new_term_starts_without_the_old_terms_numbers() -> None:
    meters = metrics.Metrics.create()
    meters.set_leading(True)
    a_term(meters)
    meters.nodes.labels("deleted-while-standby", "Unhealthy").set(4)
    meters.set_leading(False)
    meters.set_leading(True)
    assert not FLEET_GAUGES & names(meters), "a policy deleted meanwhile would fire for ever"
    assert meters.gpus_due("p", NOW), "the first pass of the term counts GPUs at once"
    a_term(meters)
    assert names(meters) >= FLEET_GAUGES
    assert not any("deleted-while-standby" in key for key in scraped(meters))


def test_a_replica_without_leader_election_exports_from_the_start() -> None:
    # --leader-elect=false: set_leading(True) before the first pass, as a campaign that won.
    meters = metrics.Metrics.create()
    meters.set_leading(True)
    a_term(meters)
    assert names(meters) >= FLEET_GAUGES


def test_the_registry_still_describes_every_family_for_rule_checks() -> None:
    # tests/e2e/test_alert_rules.py derives the exported names from describe(): hidden is not unknown.
    meters = metrics.Metrics.create()
    meters.set_leading(False)
    described = {f.name for g in meters.fleet_gauges() for f in g.describe()}
    assert set(meters.registry._names_to_collectors) >= FLEET_GAUGES
    assert described >= FLEET_GAUGES
