"""How often an agent reports when nothing changed, and when the operator gives up on it.

One definition for the agent's `--heartbeat` default, the simulator's fleet
default and the staleness rule of DESIGN.md (an agent that missed
`STALE_HEARTBEATS` heartbeats is stale).
"""

from typing import Final

DEFAULT_HEARTBEAT_SECONDS: Final = 60
"""The agent's default status-write period when nothing significant changed."""

STALE_HEARTBEATS: Final = 3
"""An agent that missed this many heartbeats in a row is stale."""

MAX_HEARTBEAT_SECONDS: Final = 600
"""The longest heartbeat period an agent may report (the GPUNode schema's maximum of
`status.agent.heartbeatSeconds`): a bad or hostile agent cannot postpone its own staleness for long."""
