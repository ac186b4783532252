"""Defaults `gpu-health-sim demo` shows in its --help, kept out of `walkthrough`, which imports the whole
simulator (building the parser should not pay for it)."""

from pathlib import Path
from typing import Final

REPO_ROOT: Final = Path(__file__).resolve().parents[3]
DEFAULT_FLEET: Final = REPO_ROOT / "examples" / "fleets" / "demo.yaml"
DEFAULT_POLICY: Final = REPO_ROOT / "examples" / "fleets" / "demo-policy.yaml"
DEFAULT_DURATION_SECONDS: Final = 75.0
"""The last scripted change (cool-down at 25 s), the policy's healthyForSeconds (15 s), and time to look."""
