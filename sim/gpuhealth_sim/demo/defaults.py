"""Defaults `gpu-health-sim demo` shows in its --help, kept out of `walkthrough`, which imports the whole
simulator (building the parser should not pay for it)."""

from pathlib import Path
from typing import Final

import yaml

from gpuhealth_sim.fleet import names

REPO_ROOT: Final = Path(__file__).resolve().parents[3]
DEFAULT_FLEET: Final = REPO_ROOT / "examples" / "fleets" / "demo.yaml"
DEFAULT_POLICY: Final = REPO_ROOT / "examples" / "fleets" / "demo-policy.yaml"
DEFAULT_DURATION_SECONDS: Final = 75.0
"""The last scripted change (cool-down at 25 s), the policy's healthyForSeconds (15 s), and time to look."""


def fleet_node_count(path: Path = DEFAULT_FLEET) -> int | None:
    """How many nodes a fleet file names (its pools' name patterns), for --help; None if unreadable.

    Counted from the patterns alone (`fleet.names`, pure): loading the fleet would import the agent's
    scenarios, and --help should answer at once."""
    try:
        pools = yaml.safe_load(path.read_text())["pools"]
        return len({name for pool in pools for name in names.expand(str(pool["nodes"]))})
    except (OSError, yaml.YAMLError, KeyError, TypeError, names.PatternError):
        return None
