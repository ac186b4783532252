"""API group, version and kinds served by the gpu-health CRDs."""

from typing import Final

GROUP: Final = "gpuhealth.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

GPUNODE_KIND: Final = "GPUNode"
GPUNODE_PLURAL: Final = "gpunodes"
GPUNODE_SHORT: Final = "gn"

POLICY_KIND: Final = "GPUHealthPolicy"
POLICY_PLURAL: Final = "gpuhealthpolicies"
POLICY_SHORT: Final = "ghp"

# Server-side apply field managers: each side owns its own status fields.
AGENT_FIELD_MANAGER: Final = "gpu-health-agent"
OPERATOR_FIELD_MANAGER: Final = "gpu-health-operator"
