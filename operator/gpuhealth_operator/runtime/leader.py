"""Leader election on a coordination.k8s.io/v1 Lease: only the holder acts, and only in time.

Follows client-go's leaderelection. A standby takes the Lease over only after
it has watched the holder's record stay unchanged for the lease duration
(judged by its own monotonic clock, so clock skew between machines does not
matter). The holder renews every `renew_seconds`, retries every
`retry_seconds` after a failure, and must succeed within the renew deadline,
which is shorter than the lease duration.

A `Term` is one period of leadership. It allows writes until the renew
deadline counted from when the last successful renewal was *sent* (the API
server may have stored it any time after that, and a standby counts its lease
duration from when it *saw* the record, later still). So the holder's writes
stop at least `duration - renew_deadline` seconds before any standby may take
over: that margin covers a write that passed the check just before the
deadline and is still on its way. The Kubernetes client asks the term right
before it sends each write (`kube.Kube(fence=term.holds)`). A term that ended
never allows writes again, even if this process leads again later: tasks left
over from an old term cannot write with what they knew then.

The operator runs its elector on a thread of its own (`ElectionThread`), so a
renewal never waits for the operator's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiohttp

from gpuhealth_api import timestamps
from gpuhealth_operator.client import kube

logger = logging.getLogger(__name__)

FAILED_ATTEMPT = (kube.ApiError, aiohttp.ClientError, OSError, TimeoutError)
"""What one election attempt may fail with and be retried: an answer, a dropped connection, a timeout."""
JITTER_FACTOR = 1.2
"""As client-go: the renew deadline must leave room for more than one retry period."""

Clock = Callable[[], float]
T = TypeVar("T")


class LeaseLost(Exception):
    """This replica no longer holds the Lease (another holds it, or it could not renew in time)."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """Durations of leader election (client-go's LeaseDuration, RenewDeadline, RetryPeriod)."""

    duration_seconds: float = 15.0
    """A standby takes over after the holder's record stayed unchanged this long."""
    renew_deadline_seconds: float = 10.0
    """The holder stops writing when it could not renew for this long; shorter than the duration."""
    renew_seconds: float = 2.0
    """The holder renews this often while renewals succeed."""
    retry_seconds: float = 2.0
    """A standby tries to acquire, and a holder retries a failed renewal, this often."""

    def problems(self) -> list[str]:
        """What is wrong with these durations, for a clear error at startup (empty when valid)."""
        found = [
            f"{name} must be positive, not {value:g}"
            for name, value in dataclasses.asdict(self).items()
            if not value > 0
        ]
        if found:
            return found
        if self.renew_deadline_seconds >= self.duration_seconds:
            found.append(
                f"the renew deadline ({self.renew_deadline_seconds:g}s) must be shorter than the lease "
                f"duration ({self.duration_seconds:g}s): the difference is the fencing margin"
            )
        if self.renew_deadline_seconds <= JITTER_FACTOR * self.retry_seconds:
            found.append(
                f"the renew deadline ({self.renew_deadline_seconds:g}s) must exceed {JITTER_FACTOR:g} x "
                f"the retry period ({self.retry_seconds:g}s), or a failed renewal is never retried"
            )
        if self.renew_seconds >= self.renew_deadline_seconds:
            found.append(
                f"the renew period ({self.renew_seconds:g}s) must be shorter than the renew deadline "
                f"({self.renew_deadline_seconds:g}s)"
            )
        return found


def default_renew_deadline(duration_seconds: float) -> float:
    """Two thirds of the lease duration: client-go's 10 s of 15 s."""
    return duration_seconds * 2 / 3


@dataclasses.dataclass
class Term:
    """One period of leadership: writes are allowed before `deadline` (monotonic), until it ends."""

    deadline: float
    clock: Clock = time.monotonic
    ended: bool = False

    def holds(self) -> bool:
        """Whether this replica may write now: the term has not ended and its deadline is ahead."""
        return not self.ended and self.clock() < self.deadline

    def renewed(self, sent_at: float, renew_deadline_seconds: float) -> None:
        """A renewal sent at `sent_at` (monotonic) succeeded: writes are allowed until sent_at + deadline."""
        if not self.ended:
            self.deadline = max(self.deadline, sent_at + renew_deadline_seconds)

    def end(self) -> None:
        """Leadership is over for good: no write of this term goes out any more."""
        self.ended = True

    def remaining(self) -> float:
        """Seconds left before the deadline (0 once it passed or the term ended)."""
        return 0.0 if self.ended else max(0.0, self.deadline - self.clock())


def next_renewal_in(term: Term, timing: Timing, *, failed: bool) -> float:
    """How long the holder waits before its next renewal attempt: never past the deadline."""
    wait = timing.retry_seconds if failed else timing.renew_seconds
    return min(wait, term.remaining())


def _micro_time() -> str:
    """A MicroTime (six fractional digits, as the API server requires): the one wire format."""
    return timestamps.render(datetime.datetime.now(datetime.UTC))


@dataclasses.dataclass
class Elector:
    client: kube.Kube
    namespace: str
    name: str
    identity: str
    timing: Timing
    clock: Clock = time.monotonic
    _observed: tuple[str, str] | None = None
    """(holder, renewTime) last seen, and when (monotonic) it was first seen."""
    _observed_at: float = 0.0

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def _spec(self, transitions: int, acquire_time: str | None = None) -> kube.JsonObject:
        now = _micro_time()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.duration_seconds)),
            "acquireTime": acquire_time or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def try_acquire(self) -> float | None:
        """One attempt to take or renew the Lease: when (monotonic) the successful write was sent, or None."""
        try:
            lease = await self.client.request("GET", self.path, exempt=True)
        except kube.ApiError as error:
            if not error.not_found:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0),
            }
            sent_at = self.clock()
            try:
                collection = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
                await self.client.request("POST", collection, body=body, exempt=True)
            except kube.ApiError as create_error:
                if create_error.conflict:
                    return None
                raise
            return sent_at

        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.timing.duration_seconds)
        expired = now - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return None
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire_time = spec.get("acquireTime") if holder == self.identity else None
        lease["spec"] = self._spec(transitions, acquire_time)
        sent_at = self.clock()
        try:
            # PUT with the resourceVersion we read: two replicas racing for an expired Lease get one 409.
            await self.client.request("PUT", self.path, body=lease, exempt=True)
        except kube.ApiError as error:
            if error.conflict:
                return None
            raise
        return sent_at

    async def acquire(self) -> Term:
        """Wait until this replica holds the Lease; the new term."""
        logger.info("waiting for leader Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while True:
            try:
                sent_at = await asyncio.wait_for(self.try_acquire(), self.timing.renew_deadline_seconds)
            except FAILED_ATTEMPT as error:
                logger.warning("leader election attempt failed: %s", error or type(error).__name__)
            else:
                if sent_at is not None:
                    term = Term(deadline=sent_at + self.timing.renew_deadline_seconds, clock=self.clock)
                    if term.holds():
                        logger.info("acquired leader Lease %s/%s", self.namespace, self.name)
                        return term
            await asyncio.sleep(self.timing.retry_seconds)

    async def hold(self, term: Term) -> None:
        """Renew the Lease until it is lost; then end the term and raise LeaseLost.

        Each attempt may take only the time left before the deadline: a renewal
        that hangs does not keep this replica's writes going past it.
        """
        failed = False
        try:
            while True:
                await asyncio.sleep(next_renewal_in(term, self.timing, failed=failed))
                if not term.holds():
                    raise LeaseLost(
                        f"could not renew Lease {self.namespace}/{self.name} within the renew deadline "
                        f"of {self.timing.renew_deadline_seconds:g}s"
                    )
                try:
                    sent_at = await asyncio.wait_for(self.try_acquire(), term.remaining())
                except FAILED_ATTEMPT as error:
                    logger.warning("could not renew leader Lease: %s", error or type(error).__name__)
                    failed = True
                    continue
                if sent_at is None:
                    raise LeaseLost(f"another replica holds Lease {self.namespace}/{self.name}")
                term.renewed(sent_at, self.timing.renew_deadline_seconds)
                failed = False
        finally:
            term.end()

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown, so a standby takes over without waiting."""
        try:
            lease = await self.client.request("GET", self.path, exempt=True)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec["holderIdentity"] = None
            spec["leaseDurationSeconds"] = 1
            lease["spec"] = spec
            await self.client.request("PUT", self.path, body=lease, exempt=True)
        except FAILED_ATTEMPT as error:
            logger.warning("could not release leader Lease: %s", error)


class ElectionThread:
    """An elector on its own thread and event loop (and, through its client, its own connections).

    On the operator's event loop a renewal waited behind whatever ran there:
    decoding a page of a large LIST, a burst of watch events, a timer pass over
    thousands of nodes. At 5,000 nodes on a loaded machine that cost the Lease
    (renewal not done within the renew deadline). Here a renewal waits at most
    for the interpreter's thread switch or one long C call. The operator's
    thread only reads the term it hands out (`Term.holds`) and ends it.
    """

    def __init__(self, elector: Elector) -> None:
        self.elector = elector
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="leader-election", daemon=True)
        self._thread.start()

    async def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run on the election thread; cancelling the caller cancels it there too."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))

    async def acquire(self) -> Term:
        return await self._run(self.elector.acquire())

    async def hold(self, term: Term) -> None:
        await self._run(self.elector.hold(term))

    async def release(self) -> None:
        await self._run(self.elector.release())

    async def close(self) -> None:
        """Close the elector's connections and stop the thread."""
        await self._run(self.elector.client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        await asyncio.to_thread(self._thread.join, 5.0)
        if not self._thread.is_alive():
            self._loop.close()
