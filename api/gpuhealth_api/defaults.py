"""Defaults the agent and the operator must agree on (DESIGN.md): the heartbeat and when it is stale."""

from typing import Final

HEARTBEAT_SECONDS: Final = 60
"""How often the agent reports when `status.agent.heartbeatSeconds` does not say."""

STALE_HEARTBEATS: Final = 3
"""An agent that missed this many heartbeats is stale."""
