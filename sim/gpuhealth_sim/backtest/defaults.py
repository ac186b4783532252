"""Defaults and choices the backtest's commands show in their --help, kept out of the modules that use
them (`tracerecord`, `prometheus_import`): those import the Kubernetes client, the agent or the operator,
which building gpu-health-sim's parser (`--version`, `--help`) should not pay for."""

from typing import Final

DEFAULT_AGENT_POD_NAMESPACE: Final = "gpu-health"
"""The README's `helm install ... -n gpu-health`; in the cluster the chart passes its release namespace."""
AGENT: Final = "agent"
DCGM: Final = "dcgm"
"""`trace import --source`: whose series, the gpu-health agent's or dcgm-exporter's."""
NODE_LABELS: Final = ("node", "kubernetes_node", "Hostname")
"""Where a series names its node, in order: the chart's relabelling, a common one, dcgm-exporter's own."""
