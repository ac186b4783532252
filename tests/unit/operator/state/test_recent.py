"""Reads kept for a few seconds (`recent.Recent`): reused while fresh, read again after."""

import asyncio
import datetime

import pytest

from gpuhealth_operator.state import recent

T0 = datetime.datetime(2026, 11, 25, 12, 0, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def test_a_read_is_reused_for_its_seconds_then_read_again() -> None:
    reads: recent.Recent[str, int] = recent.Recent(10)
    assert reads.get("node-a", at(0)) is None
    reads.put("node-a", 1, at(0))
    assert reads.get("node-a", at(0)) == 1
    assert reads.get("node-a", at(9.9)) == 1
    assert reads.get("node-a", at(10)) is None


def test_a_clock_that_went_back_reads_again() -> None:
    reads: recent.Recent[str, int] = recent.Recent(10)
    reads.put("node-a", 1, at(5))
    assert reads.get("node-a", at(4)) is None


def test_an_empty_read_is_a_read() -> None:
    """A node without ResourceSlices (a device-plugin node) is not listed again every pass either."""
    reads: recent.Recent[str, dict[str, str]] = recent.Recent(10)
    reads.put("plugin-node", {}, at(0))
    assert reads.get("plugin-node", at(1)) == {}


def test_dropping_an_entry_forces_the_next_read() -> None:
    reads: recent.Recent[tuple[str, str], list[str]] = recent.Recent(10)
    reads.put(("policy-a", "v1beta2"), ["rule"], at(0))
    reads.put(("policy-b", "v1beta2"), ["rule"], at(0))
    reads.drop(("policy-a", "v1beta2"))
    assert reads.get(("policy-a", "v1beta2"), at(1)) is None
    reads.drop_where(lambda key: key[0] == "policy-b")
    assert reads.get(("policy-b", "v1beta2"), at(1)) is None


def test_expired_entries_are_let_go_when_another_is_kept() -> None:
    """Nodes whose GPUs recovered leave no entry behind for long."""
    reads: recent.Recent[str, int] = recent.Recent(10)
    for index in range(100):
        reads.put(f"node-{index}", index, at(0))
    reads.put("node-late", 1, at(30))
    assert len(reads) == 1


def test_read_loads_once_while_fresh_and_keeps_nothing_when_the_load_fails() -> None:
    reads: recent.Recent[str, int] = recent.Recent(10)
    loads: list[str] = []

    async def load() -> int:
        loads.append("listed")
        return len(loads)

    async def failing() -> int:
        raise OSError("connection refused")

    async def scenario() -> None:
        assert await reads.read("node-a", at(0), load) == 1
        assert await reads.read("node-a", at(5), load) == 1
        assert await reads.read("node-a", at(10), load) == 2
        with pytest.raises(OSError, match="refused"):
            await reads.read("node-b", at(0), failing)
        assert reads.get("node-b", at(0)) is None

    asyncio.run(scenario())
    assert loads == ["listed", "listed"]
