"""The heap is trimmed after a burst, not at rest (issue 29 item 3)."""

from __future__ import annotations

from gpuhealth_operator.runtime import heap

MIB = 2**20


class Process:
    """A resident set the test moves, and the trims it saw (a trim gives back what the burst left)."""

    def __init__(self, resident: int | None) -> None:
        self.resident = resident
        self.trims = 0

    def trim(self) -> None:
        self.trims += 1
        if self.resident is not None:
            self.resident -= self.resident // 4


def trimmer(process: Process) -> heap.Trimmer:
    return heap.Trimmer(resident=lambda: process.resident, do=process.trim)


def test_the_first_refresh_trims_what_start_up_left() -> None:
    process = Process(400 * MIB)
    assert trimmer(process).maybe(full=False)
    assert process.trims == 1


def test_a_fleet_at_rest_is_not_trimmed_on_every_pass() -> None:
    process = Process(400 * MIB)
    trims = trimmer(process)
    trims.maybe(full=True)
    for step in range(100):  # 100 refreshes, some of them full passes, while the heap drifts by a few MiB
        process.resident = (process.resident or 0) + MIB // 10
        trims.maybe(full=step % 30 == 0)
    assert process.trims == 1


def test_a_burst_is_trimmed_at_the_next_refresh_and_only_once() -> None:
    process = Process(200 * MIB)
    trims = trimmer(process)
    trims.maybe(full=True)
    process.resident = (process.resident or 0) + 120 * MIB  # a storm of watch events
    assert trims.maybe(full=False)
    assert not trims.maybe(full=False)
    assert process.trims == 2


def test_small_processes_need_the_absolute_growth_too() -> None:
    process = Process(40 * MIB)
    trims = trimmer(process)
    trims.maybe(full=True)
    process.resident = (process.resident or 0) + 8 * MIB  # 27 % more, but 8 MiB: not worth a pass
    assert not trims.maybe(full=True)


def test_without_proc_the_full_pass_trims_as_before() -> None:
    process = Process(None)
    trims = trimmer(process)
    assert not trims.maybe(full=False)
    assert trims.maybe(full=True)
    assert trims.maybe(full=True)
    assert process.trims == 2


def test_the_resident_set_of_this_process_is_read() -> None:
    resident = heap.resident_bytes()
    assert resident is None or resident > MIB
