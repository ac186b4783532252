"""gpu-health node agent: reads GPU health facts (NVML, DCGM, or a simulation) and reports them.

Agents report, the operator decides: the agent writes its node's GPUNode
status and Prometheus metrics, and never touches the Node itself.
"""

from gpuhealth_api import __version__

__all__ = ["__version__"]
