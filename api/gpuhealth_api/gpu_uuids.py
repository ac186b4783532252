"""The form of a GPU UUID as NVML reports it, the one form that may reach a repair Job.

`nvmlDeviceGetUUID` returns `GPU-` and a UUID in 8-4-4-4-12 hex digits for a physical GPU (a MIG
device's is `MIG-` and a UUID; the agent reports physical GPUs only, and the simulated backend makes
`GPU-` + uuid5). The agent writes the value into GPUNode `status.gpus[].uuid`; the operator passes it to
a privileged Job's environment (`GPUHEALTH_GPU_UUIDS`). A value of any other form (`GPU-1;nsenter …`)
is an agent that is broken or not ours: the CRD refuses it (the same pattern, `crds/`) and the operator
never passes it on (issue 45, item 9). Nothing in the form can reach a shell: hex digits and dashes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

PATTERN: Final = r"^(GPU|MIG)-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
"""The CRD's `pattern` on `status.gpus[].uuid` (tests/unit/api hold the two equal)."""
EXAMPLE: Final = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"

_FORM: Final = re.compile(PATTERN)


def is_valid(value: object) -> bool:
    """Whether `value` is a GPU (or MIG device) UUID of NVML's form."""
    return isinstance(value, str) and _FORM.fullmatch(value) is not None


def invalid(values: Iterable[object]) -> list[str]:
    """The values that are not of NVML's form, in order (a non-string as its repr)."""
    return [v if isinstance(v, str) else repr(v) for v in values if not is_valid(v)]
