"""Which pods a drain evicts, waits for, or leaves in place."""

from gpuhealth_operator.actions import drain

OPTIONS = drain.Options(
    grace_period_seconds=None, delete_empty_dir_data=False, backoff_initial_seconds=1, backoff_max_seconds=30
)


def pod(name: str, **extra: object) -> dict:
    body: dict = {"metadata": {"name": name, "namespace": "ns"}, "spec": {"containers": [{"name": "c"}]}}
    for key, value in extra.items():
        section, field = key.split("__")
        body.setdefault(section, {})[field] = value
    return body


def test_daemonset_and_mirror_pods_are_not_evicted() -> None:
    pods = [
        pod("web"),
        pod("agent", metadata__ownerReferences=[{"kind": "DaemonSet", "name": "a", "controller": True}]),
        pod("static", metadata__annotations={drain.MIRROR_ANNOTATION: "x"}),
        pod(
            "owned-by-rs", metadata__ownerReferences=[{"kind": "ReplicaSet", "name": "r", "controller": True}]
        ),
    ]
    wanted, skipped = drain.classify(pods, OPTIONS)
    assert [drain.pod_key(p) for p in wanted] == ["ns/web", "ns/owned-by-rs"]
    assert skipped == []


def test_empty_dir_pods_stay_unless_their_data_may_be_deleted() -> None:
    scratch = pod("scratch", spec__volumes=[{"name": "tmp", "emptyDir": {}}])
    assert drain.classify([scratch], OPTIONS) == ([], ["ns/scratch"])
    allowed = drain.Options(
        grace_period_seconds=None,
        delete_empty_dir_data=True,
        backoff_initial_seconds=1,
        backoff_max_seconds=30,
    )
    assert drain.classify([scratch], allowed) == ([scratch], [])


def test_terminating_pods_are_waited_for() -> None:
    going = pod("going", metadata__deletionTimestamp="2026-01-01T00:00:00Z")
    wanted, _ = drain.classify([going], OPTIONS)
    assert wanted == [going]
    assert drain.is_terminating(going)
