"""The operator's series as a scraper sees them: present from the start, gone with their policy."""

import datetime

import pytest

from gpuhealth_operator.shared import gpu_meters, metric_labels, metrics


def samples(meters: metrics.Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in meters.registry.collect()
        for s in family.samples
        if s.name == name
    }


def test_error_counters_exist_at_zero_for_every_handler_before_any_error() -> None:
    errors = samples(metrics.Metrics.create(), "gpuhealth_operator_reconcile_errors_total")
    assert errors == {(("handler", h),): 0.0 for h in metric_labels.HANDLERS}


def test_a_deleted_policy_leaves_no_series_for_alerts_to_fire_on() -> None:
    meters = metrics.Metrics.create()
    for policy in ("gone", "kept"):
        meters.nodes.labels(policy, "Unhealthy").set(3)
        meters.budget_pending.labels(policy).set(2)
        meters.isolated_gpus.labels(policy).set(1)
    meters.forget_policy("gone")
    meters.forget_policy("never-seen")  # nothing to drop is no error
    nodes = samples(meters, "gpuhealth_operator_nodes")
    pending = samples(meters, "gpuhealth_operator_budget_pending_nodes")
    assert {dict(k)["policy"] for k in nodes} == {"kept"}
    assert {dict(k)["policy"] for k in pending} == {"kept"}
    isolated = samples(meters, "gpuhealth_operator_isolated_gpus")
    assert {dict(k)["policy"] for k in isolated} == {"kept"}


NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def by_labels(meters: metrics.Metrics, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(v for _, v in key): value for key, value in samples(meters, name).items()}


def test_gpu_gauges_count_each_model_and_every_out_of_service_reason_even_at_zero() -> None:
    meters = metrics.Metrics.create()
    tally = gpu_meters.GPUTally()
    tally.add(H100, 8, healthy=True, out_reason=None)
    tally.add(H100, 8, healthy=False, out_reason="cordoned")
    tally.add(A100, 4, healthy=False, out_reason=None)  # Degraded, in service: neither healthy nor out
    meters.record_gpus("p", tally, NOW)
    assert by_labels(meters, "gpuhealth_operator_gpus") == {(H100, "p"): 16, (A100, "p"): 4}
    assert by_labels(meters, "gpuhealth_operator_gpus_healthy") == {(H100, "p"): 8, (A100, "p"): 0}
    out = by_labels(meters, "gpuhealth_operator_gpus_out_of_service")
    expected = {(m, "p", r): 0.0 for m in (H100, A100) for r in metric_labels.OUT_OF_SERVICE_REASONS}
    assert out == expected | {(H100, "p", "cordoned"): 8.0}


def test_gpu_hours_lost_count_cordoned_and_isolated_gpus_over_time_not_unknown_ones() -> None:
    meters = metrics.Metrics.create()
    tally = gpu_meters.GPUTally()
    tally.add(H100, 8, healthy=False, out_reason="cordoned")
    tally.add(H100, 4, healthy=False, out_reason="isolated")
    tally.add(H100, 8, healthy=False, out_reason="unknown")
    moment = NOW
    for _ in range(121):  # a pass every 30 s for an hour
        meters.record_gpus("p", tally, moment)
        moment += datetime.timedelta(seconds=30)
    lost = by_labels(meters, "gpuhealth_operator_gpu_hours_lost_total")
    assert lost == {(H100, "p"): pytest.approx(12.0)}


def test_a_gap_between_passes_counts_at_most_the_step_limit() -> None:
    meters = metrics.Metrics.create()
    tally = gpu_meters.GPUTally()
    tally.add(H100, 8, healthy=False, out_reason="cordoned")
    meters.record_gpus("p", tally, NOW)
    meters.record_gpus("p", tally, NOW + datetime.timedelta(hours=2))  # leadership lost in between
    lost = by_labels(meters, "gpuhealth_operator_gpu_hours_lost_total")
    assert lost == {(H100, "p"): pytest.approx(8 * gpu_meters.LOST_MAX_STEP_SECONDS / 3600)}


def test_a_model_gone_from_a_policy_and_a_deleted_policy_leave_no_gpu_series() -> None:
    meters = metrics.Metrics.create()
    both = gpu_meters.GPUTally()
    both.add(H100, 8, healthy=True, out_reason=None)
    both.add(A100, 8, healthy=True, out_reason=None)
    meters.record_gpus("p", both, NOW)
    meters.record_gpus("q", both, NOW)
    only = gpu_meters.GPUTally()
    only.add(H100, 8, healthy=True, out_reason=None)
    meters.record_gpus("p", only, NOW)
    meters.forget_policy("q")
    for name in (
        "gpuhealth_operator_gpus",
        "gpuhealth_operator_gpus_healthy",
        "gpuhealth_operator_gpus_out_of_service",
        "gpuhealth_operator_gpu_hours_lost_total",
    ):
        assert {(dict(k)["policy"], dict(k)["model"]) for k in samples(meters, name)} == {("p", H100)}, name
