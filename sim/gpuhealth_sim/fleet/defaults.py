"""Defaults `gpu-health-sim run` shows in its --help, kept out of the module that uses them (`repairs`
imports the Kubernetes client and the agent, which building the parser should not pay for)."""

from typing import Final

DEFAULT_REPAIR_NAMESPACE: Final = "gpu-health"
"""`repairs.DEFAULT_NAMESPACE`: the operator's --repair-namespace default."""
