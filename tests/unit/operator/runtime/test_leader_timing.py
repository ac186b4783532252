"""Leader election timing: when a term allows writes, and which durations are refused at startup."""

import asyncio
import time

import aiohttp
import pytest

from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import cli, leader


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_term_allows_writes_until_the_renew_deadline_counted_from_when_the_renewal_was_sent() -> None:
    clock = FakeClock()
    term = leader.Term(deadline=clock.now + 10, clock=clock)
    clock.now = 105.0
    # The renewal left at 105 and its answer came back 3 s later: the deadline counts from 105.
    term.renewed(sent_at=105.0, renew_deadline_seconds=10)
    clock.now = 114.9
    assert term.holds()
    assert term.remaining() == pytest.approx(0.1)
    clock.now = 115.0
    assert not term.holds()
    assert term.remaining() == 0


def test_a_late_answer_to_an_older_renewal_never_moves_the_deadline_back() -> None:
    clock = FakeClock()
    term = leader.Term(deadline=120.0, clock=clock)
    term.renewed(sent_at=101.0, renew_deadline_seconds=10)
    assert term.deadline == 120.0


def test_an_ended_term_never_allows_writes_again_even_if_renewed() -> None:
    clock = FakeClock()
    term = leader.Term(deadline=clock.now + 10, clock=clock)
    term.end()
    term.renewed(sent_at=clock.now, renew_deadline_seconds=10)
    assert not term.holds()
    assert term.remaining() == 0


def test_the_holder_of_a_paused_process_does_not_write_when_it_wakes() -> None:
    """SIGSTOP, then SIGCONT: the monotonic clock ran meanwhile, so the term is over on waking."""
    clock = FakeClock()
    term = leader.Term(deadline=clock.now + 10, clock=clock)
    clock.now += 30
    assert not term.holds()


def test_the_next_renewal_is_never_scheduled_past_the_deadline() -> None:
    timing = leader.Timing(duration_seconds=15, renew_deadline_seconds=10, renew_seconds=2, retry_seconds=2)
    clock = FakeClock()
    term = leader.Term(deadline=clock.now + 10, clock=clock)
    assert leader.next_renewal_in(term, timing, failed=False) == 2
    clock.now += 9.5
    assert leader.next_renewal_in(term, timing, failed=True) == pytest.approx(0.5)


def test_client_go_defaults_are_valid_and_the_renew_deadline_defaults_to_two_thirds() -> None:
    assert leader.Timing().problems() == []
    assert leader.default_renew_deadline(15) == 10
    config = cli.parse_args([])
    assert (config.lease_duration_seconds, config.lease_renew_deadline_seconds) == (15, 10)
    assert (config.lease_renew_seconds, config.lease_retry_seconds) == (2, 2)


@pytest.mark.parametrize(
    ("timing", "says"),
    [
        (leader.Timing(duration_seconds=10, renew_deadline_seconds=10), "shorter than the lease duration"),
        (leader.Timing(renew_deadline_seconds=2, retry_seconds=2, renew_seconds=1), "retry period"),
        (leader.Timing(renew_seconds=10), "renew period"),
        (leader.Timing(retry_seconds=0), "must be positive"),
    ],
)
def test_durations_that_break_fencing_are_refused(timing: leader.Timing, says: str) -> None:
    assert any(says in problem for problem in timing.problems())


def test_the_command_line_refuses_a_renew_deadline_not_shorter_than_the_lease(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--lease-duration-seconds=10", "--lease-renew-deadline-seconds=12"])
    assert "must be shorter than the lease duration" in capsys.readouterr().err


class HangingLeases(kube.Kube):
    """A client whose Lease reads answer (this replica holds it) and whose renewals hang forever."""

    def __init__(self) -> None:
        super().__init__(kube.Credentials("http://127.0.0.1:1", None, True, None, None, None))

    async def request(self, method: str, path: str, **_: object) -> kube.JsonObject:
        if method == "GET":
            return {"metadata": {}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 1}}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_a_renewal_that_hangs_ends_the_term_at_its_deadline_not_at_the_request_timeout() -> None:
    timing = leader.Timing(
        duration_seconds=1.0, renew_deadline_seconds=0.3, renew_seconds=0.05, retry_seconds=0.05
    )
    elector = leader.Elector(
        client=HangingLeases(), namespace="ns", name="lease", identity="me", timing=timing
    )

    async def scenario() -> float:
        term = leader.Term(deadline=time.monotonic() + timing.renew_deadline_seconds)
        started = time.monotonic()
        with pytest.raises(leader.LeaseLost, match="renew deadline"):
            await asyncio.wait_for(elector.hold(term), timeout=5)
        assert term.ended and not term.holds()
        return time.monotonic() - started

    elapsed = asyncio.run(scenario())
    # At the deadline (a loaded machine may add a little), far from the 30 s request timeout.
    assert timing.renew_deadline_seconds - 0.05 <= elapsed < 3


class DroppedThenRenewed(HangingLeases):
    """The first renewal's connection drops (the API server went away mid-request); the next succeeds."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0
        self.third = asyncio.Event()

    async def request(self, method: str, path: str, **_: object) -> kube.JsonObject:
        if method == "GET":
            return {"metadata": {}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 1}}
        self.renewals += 1
        if self.renewals == 3:
            self.third.set()
        if self.renewals == 1:
            raise aiohttp.ServerDisconnectedError()
        return {}


def test_a_dropped_connection_during_a_renewal_is_retried_not_a_crash() -> None:
    timing = leader.Timing(
        duration_seconds=3.0, renew_deadline_seconds=2.0, renew_seconds=0.05, retry_seconds=0.05
    )
    leases = DroppedThenRenewed()
    elector = leader.Elector(client=leases, namespace="ns", name="lease", identity="me", timing=timing)

    async def scenario() -> leader.Term:
        term = leader.Term(deadline=time.monotonic() + timing.renew_deadline_seconds)
        holding = asyncio.create_task(elector.hold(term))
        await asyncio.wait(
            {holding, asyncio.create_task(leases.third.wait())}, timeout=5, return_when="FIRST_COMPLETED"
        )
        assert not holding.done(), "the dropped connection did not end the term"
        holding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holding
        return term

    term = asyncio.run(scenario())
    assert leases.renewals >= 3
    assert term.ended  # cancelled: a term never outlives its holder
