"""How often an agent reports when nothing changed, and when the operator gives up on it.

One definition for the agent's `--heartbeat` default, the simulator's fleet
default and the staleness rule of DESIGN.md (an agent that missed
`STALE_HEARTBEATS` heartbeats is stale).
"""

from typing import Final

DEFAULT_HEARTBEAT_SECONDS: Final = 300
"""The agent's default status-write period when nothing significant changed: 5 minutes, so a quiet
fleet costs the API server one write per node per 5 minutes. A dead agent is still found within a
minute and a half where agents run as the chart's DaemonSet: the operator reads its pod's readiness
(see the operator's `decisions.liveness`); elsewhere the heartbeat alone times it (3 heartbeats)."""

UNSTATED_HEARTBEAT_SECONDS: Final = 60
"""The period assumed for an agent that does not state a valid `heartbeatSeconds` (agents before that
field wrote every 60 s): the shorter guess, so a missing value never postpones staleness."""

STALE_HEARTBEATS: Final = 3
"""An agent that missed this many heartbeats in a row is stale."""

MAX_HEARTBEAT_SECONDS: Final = 600
"""The longest heartbeat period an agent may report (the GPUNode schema's maximum of
`status.agent.heartbeatSeconds`): a bad or hostile agent cannot postpone its own staleness for long."""

FIRST_REPORT_SECONDS: Final = 180
"""How long a new GPUNode may wait for its agent's first report before the node counts as stale: the
agent writes it right after creating the GPUNode, so this need not grow with the heartbeat."""
