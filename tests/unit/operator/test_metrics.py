"""The operator's series as a scraper sees them: present from the start, gone with their policy."""

from gpuhealth_operator import metrics


def samples(meters: metrics.Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in meters.registry.collect()
        for s in family.samples
        if s.name == name
    }


def test_error_counters_exist_at_zero_for_every_handler_before_any_error() -> None:
    errors = samples(metrics.Metrics.create(), "gpuhealth_operator_reconcile_errors_total")
    assert errors == {(("handler", h),): 0.0 for h in metrics.HANDLERS}


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
