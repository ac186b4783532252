"""The Lease is renewed on its own thread: an operator loop busy for longer than the renew deadline
(decoding a large LIST, a burst of events) no longer costs the term."""

import asyncio
import copy
import time
from typing import Any

from gpuhealth_operator.client import kube
from gpuhealth_operator.runtime import leader

IDENTITY = "me"
TIMING = leader.Timing(duration_seconds=1.5, renew_deadline_seconds=1.0, renew_seconds=0.1, retry_seconds=0.1)


class LeaseServer(kube.Kube):
    """Holds one Lease in memory and answers the elector's GET and PUT; counts the renewals."""

    def __init__(self) -> None:
        super().__init__(kube.Credentials("https://127.0.0.1:1", None, True, None, None, None))
        self.lease: dict[str, Any] = {"metadata": {"name": "l"}, "spec": {}}
        self.renewals = 0

    async def request(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        body = options.get("body")
        if method == "PUT":
            assert isinstance(body, dict)
            self.lease = copy.deepcopy(body)
            self.renewals += 1
        return copy.deepcopy(self.lease)


def test_renewals_go_on_while_the_operators_loop_is_busy() -> None:
    async def scenario() -> None:
        server = LeaseServer()
        election = leader.ElectionThread(leader.Elector(server, "ns", "l", IDENTITY, TIMING))
        try:
            term = await election.acquire()
            holding = asyncio.create_task(election.hold(term))
            await asyncio.sleep(0)
            renewals = server.renewals
            # The subject: the operator's loop busy (a blocking call), nothing else runs on it.
            time.sleep(2 * TIMING.renew_deadline_seconds)  # noqa: ASYNC251
            assert term.holds(), "renewed meanwhile from the election thread"
            assert server.renewals - renewals >= 5
            assert server.lease["spec"]["holderIdentity"] == IDENTITY
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
        finally:
            await election.close()
        assert not term.holds(), "a stopped holder ends its term"

    asyncio.run(scenario())


def test_a_lost_lease_reaches_the_operator_as_lease_lost() -> None:
    async def scenario() -> None:
        server = LeaseServer()
        election = leader.ElectionThread(leader.Elector(server, "ns", "l", IDENTITY, TIMING))
        try:
            term = await election.acquire()
            server.lease["spec"]["holderIdentity"] = "another"
            server.lease["spec"]["renewTime"] = "later"
            try:
                await asyncio.wait_for(election.hold(term), 5)
            except leader.LeaseLost:
                pass
            else:
                raise AssertionError("hold returned while another replica holds the Lease")
            assert not term.holds()
        finally:
            await election.close()

    asyncio.run(scenario())
