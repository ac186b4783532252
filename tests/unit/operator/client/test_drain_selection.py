"""Which pods a drain evicts, waits for, or leaves in place, and what its Events say."""

import dataclasses

from gpuhealth_operator.client import drain

OPTIONS = drain.Options(
    grace_period_seconds=None, delete_empty_dir_data=False, backoff_initial_seconds=1, backoff_max_seconds=30
)
OWNED = {"metadata__ownerReferences": [{"kind": "ReplicaSet", "name": "r", "controller": True}]}


def pod(name: str, **extra: object) -> dict:
    body: dict = {"metadata": {"name": name, "namespace": "ns"}, "spec": {"containers": [{"name": "c"}]}}
    for key, value in extra.items():
        section, field = key.split("__")
        body.setdefault(section, {})[field] = value
    return body


def keys(selection: drain.Selection) -> list[str]:
    return [drain.pod_key(p) for p in selection.wanted]


def test_daemonset_and_mirror_pods_are_not_evicted() -> None:
    pods = [
        pod("agent", metadata__ownerReferences=[{"kind": "DaemonSet", "name": "a", "controller": True}]),
        pod("static", metadata__annotations={drain.MIRROR_ANNOTATION: "x"}),
        pod("owned-by-rs", **OWNED),
    ]
    selection = drain.classify(pods, OPTIONS)
    assert keys(selection) == ["ns/owned-by-rs"]
    assert selection.skipped == [] and selection.unmanaged == []


def test_pods_without_a_controller_need_force() -> None:
    bare = pod("notebook")
    not_controller = pod("adopted", metadata__ownerReferences=[{"kind": "ConfigMap", "name": "c"}])
    selection = drain.classify([bare, not_controller], OPTIONS)
    assert selection.wanted == []
    assert selection.unmanaged == ["ns/notebook", "ns/adopted"]
    forced = drain.classify([bare, not_controller], dataclasses.replace(OPTIONS, force=True))
    assert keys(forced) == ["ns/notebook", "ns/adopted"]
    assert forced.unmanaged == []


def test_finished_pods_are_ignored() -> None:
    pods = [pod("done", status__phase="Succeeded"), pod("crashed", status__phase="Failed")]
    assert drain.classify(pods, OPTIONS) == drain.Selection(wanted=[], skipped=[], unmanaged=[])


def test_excluded_namespaces_are_left_in_place() -> None:
    agent = pod("site-agent", **OWNED)
    options = dataclasses.replace(OPTIONS, exclude_namespaces=frozenset({"ns"}))
    selection = drain.classify([agent], options)
    assert selection.wanted == []
    assert selection.skipped == [("ns/site-agent", drain.EXCLUDED_NAMESPACE)]


def test_empty_dir_pods_stay_unless_their_data_may_be_deleted() -> None:
    scratch = pod("scratch", spec__volumes=[{"name": "tmp", "emptyDir": {}}], **OWNED)
    assert drain.classify([scratch], OPTIONS).skipped == [("ns/scratch", drain.EMPTY_DIR_DATA)]
    allowed = dataclasses.replace(OPTIONS, delete_empty_dir_data=True)
    assert drain.classify([scratch], allowed).wanted == [scratch]


def test_terminating_pods_are_waited_for() -> None:
    going = pod("going", metadata__deletionTimestamp="2026-01-01T00:00:00Z")
    assert drain.classify([going], OPTIONS).wanted == [going]
    assert drain.is_terminating(going)


def test_waiting_backs_off_to_a_cap() -> None:
    waits = [drain.next_poll(None)]
    for _ in range(8):
        waits.append(drain.next_poll(waits[-1]))
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(waits) == drain.POLL_MAX_SECONDS == waits[-1]


def test_failure_names_blocking_and_unmanaged_pods() -> None:
    result = drain.Result(
        completed=False,
        blocking=("ns/guarded (This pod has more than one PodDisruptionBudget)",),
        evicted=1,
        skipped=(("kube-system/agent", drain.EXCLUDED_NAMESPACE),),
        unmanaged=("ns/notebook",),
    )
    message = drain.failed_message("p", 60, result)
    assert "did not finish within 60s" in message
    assert "ns/guarded (This pod has more than one PodDisruptionBudget)" in message
    assert "no controller" in message and "spec.drain.force: ns/notebook" in message
    assert "Left in place (excluded namespace): kube-system/agent." in message


def test_a_drain_stopped_by_pods_without_controller_says_so() -> None:
    result = drain.Result(completed=False, blocking=(), evicted=2, skipped=(), unmanaged=("ns/notebook",))
    message = drain.failed_message("p", 900, result)
    assert message.startswith("Drain by policy p stopped; the node stays cordoned.")
    assert "within" not in message


def test_drained_message_groups_pods_left_in_place() -> None:
    result = drain.Result(
        completed=True,
        blocking=(),
        evicted=3,
        skipped=(("ns/a", drain.EMPTY_DIR_DATA), ("sys/b", drain.EXCLUDED_NAMESPACE)),
    )
    assert drain.drained_message("p", result) == (
        "Node drained by policy p. Left in place (emptyDir data): ns/a. "
        "Left in place (excluded namespace): sys/b."
    )
