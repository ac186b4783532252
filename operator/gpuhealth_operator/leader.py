"""Leader election on a coordination.k8s.io/v1 Lease: only the holder acts.

Follows client-go's leaderelection: a standby replica takes the Lease over
only after it has watched the holder's record stay unchanged for the lease
duration (judged by its own monotonic clock, so clock skew between machines
does not matter). The holder renews well within the duration; if it cannot
renew for a whole duration, or finds another holder, it has lost the Lease
and must stop acting at once (the caller exits non-zero; the Deployment
restarts it as a standby).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time

from gpuhealth_operator import kube

logger = logging.getLogger(__name__)


class LeaseLost(Exception):
    """This replica no longer holds the Lease."""


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass
class Elector:
    client: kube.Kube
    namespace: str
    name: str
    identity: str
    duration_seconds: float
    renew_seconds: float
    retry_seconds: float
    _observed: tuple[str, str] | None = None
    """(holder, renewTime) last seen, and when (monotonic) it was first seen."""
    _observed_at: float = 0.0
    _renewed_at: float = 0.0

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def _spec(self, transitions: int, acquire_time: str | None = None) -> kube.JsonObject:
        now = _micro_time()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.duration_seconds)),
            "acquireTime": acquire_time or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def try_acquire(self) -> bool:
        """One attempt to take or renew the Lease; True if we hold it afterwards."""
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
            try:
                collection = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
                await self.client.request("POST", collection, body=body, exempt=True)
            except kube.ApiError as create_error:
                if create_error.conflict:
                    return False
                raise
            self._renewed_at = time.monotonic()
            return True

        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        now = time.monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.duration_seconds)
        expired = now - self._observed_at > duration
        if holder and holder != self.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
        acquire_time = spec.get("acquireTime") if holder == self.identity else None
        lease["spec"] = self._spec(transitions, acquire_time)
        try:
            # PUT with the resourceVersion we read: two replicas racing for an expired Lease get one 409.
            await self.client.request("PUT", self.path, body=lease, exempt=True)
        except kube.ApiError as error:
            if error.conflict:
                return False
            raise
        self._renewed_at = time.monotonic()
        return True

    async def acquire(self) -> None:
        """Wait until this replica holds the Lease."""
        logger.info("waiting for leader Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while True:
            try:
                if await self.try_acquire():
                    logger.info("acquired leader Lease %s/%s", self.namespace, self.name)
                    return
            except (kube.ApiError, OSError, TimeoutError) as error:
                logger.warning("leader election attempt failed: %s", error)
            await asyncio.sleep(self.retry_seconds)

    async def hold(self) -> None:
        """Renew the Lease forever; raise LeaseLost when it is gone."""
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if not await self.try_acquire():
                    raise LeaseLost(f"another replica holds Lease {self.namespace}/{self.name}")
            except (kube.ApiError, OSError, TimeoutError) as error:
                logger.warning("could not renew leader Lease: %s", error)
            if time.monotonic() - self._renewed_at > self.duration_seconds:
                raise LeaseLost(
                    f"could not renew Lease {self.namespace}/{self.name} for {self.duration_seconds}s"
                )

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
        except (kube.ApiError, OSError, TimeoutError) as error:
            logger.warning("could not release leader Lease: %s", error)
