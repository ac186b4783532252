"""The operator's own share of a fault's latency: from a watch event received to the first write sent.

End to end (fact written → cordon seen) the API server's scheduling dominates
the tail on a small machine; this measures only what the operator adds. A
Node or GPUNode handler stamps the moment it received the event on the pass
it asks for (`pass_queue.Ask.received`); the pass carries that stamp in a
context variable (`carrying`), and the API client reports the first write the
pass hands to its HTTP session (`write_sent`, from `kube.Client._send`): the
cache update, the queue, the judging, the ladder and our own urgent-first
ordering are in it, the network and the API server are not. A pass that
writes nothing (a heartbeat at rest) is not observed: there is no write to
wait for. Events folded into one pass count from the first of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Callable, Iterator


@dataclasses.dataclass(slots=True)
class Stamp:
    received: float
    """`time.perf_counter()` when the handler received the event."""
    observe: Callable[[float], None]
    sent: bool = False
    """The first write went out (only that one is the event's latency)."""


_CURRENT: contextvars.ContextVar[Stamp | None] = contextvars.ContextVar("gpuhealth_event_stamp", default=None)


def now() -> float:
    """The clock of `Ask.received`: monotonic, sub-millisecond."""
    return time.perf_counter()


@contextlib.contextmanager
def carrying(received: float | None, observe: Callable[[float], None]) -> Iterator[None]:
    """Within this block (a pass), the first write sent observes `now() - received` (no stamp: nothing).
    Tasks the pass starts copy the context and share the one stamp, so still one observation."""
    if received is None:
        yield
        return
    token = _CURRENT.set(Stamp(received, observe))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def write_sent() -> None:
    """A write is being sent: the first one of the current pass observes its event's latency."""
    stamp = _CURRENT.get()
    if stamp is None or stamp.sent:
        return
    stamp.sent = True
    stamp.observe(now() - stamp.received)
