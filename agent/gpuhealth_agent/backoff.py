"""Capped exponential backoff with jitter, on an injected clock and random source.

After a failed write the agent waits base·2ⁿ seconds (capped), scaled by a
random factor in [0.5, 1], before trying again: many agents that lost the API
server together must not hammer it together when it returns.
"""

from __future__ import annotations

import dataclasses
import random


@dataclasses.dataclass
class Backoff:
    base_seconds: float = 1.0
    cap_seconds: float = 30.0
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    failures: int = 0
    next_attempt_at: float = float("-inf")

    def ready(self, now: float) -> bool:
        return now >= self.next_attempt_at

    def failed(self, now: float) -> float:
        """Record a failure at `now`; return the delay until the next attempt."""
        self.failures += 1
        delay = min(self.cap_seconds, self.base_seconds * 2.0 ** (self.failures - 1))
        delay *= float(self.rng.uniform(0.5, 1.0))
        self.next_attempt_at = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.next_attempt_at = float("-inf")
