"""The fleet's schedule: earliest due node first, steady intervals, no burst after falling behind."""

from gpuhealth_sim.fleet import agentpool


def test_nodes_come_out_earliest_due_first() -> None:
    schedule = agentpool.Schedule()
    for index, due in [(0, 3.0), (1, 1.0), (2, 2.0)]:
        schedule.push(index, due)
    assert schedule.next_due() == 1.0
    assert [schedule.pop() for _ in range(3)] == [(1.0, 1), (2.0, 2), (3.0, 0)]
    assert schedule.next_due() is None and len(schedule) == 0


def test_a_node_on_time_keeps_its_rhythm() -> None:
    # Due at 10, finished at 10.3: next turn at 15, not 15.3 (no drift).
    assert agentpool.next_due(10.0, 10.3, 5.0) == 15.0


def test_a_node_an_interval_behind_restarts_from_now_instead_of_bursting() -> None:
    assert agentpool.next_due(10.0, 17.0, 5.0) == 22.0


def test_large_fleets_get_more_threads_so_slow_writes_do_not_starve_collection() -> None:
    assert agentpool.default_workers(12) == 8
    assert agentpool.default_workers(1000) == 62
    assert agentpool.default_workers(100_000) == 64
