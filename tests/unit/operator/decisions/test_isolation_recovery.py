"""IsolateGPU and the driver's recovery actions: isolating one GPU only where the cure touches one GPU.

A reboot of the node (NodeReboot, SystemReboot), a recovery of the IMEX domain, or a drain of
peer-to-peer traffic (DrainP2P, DrainAndReset: every process talking to the GPU over P2P must
stop, on whichever GPU it runs) cannot be done to one GPU: the node goes to the node ladder.
"""

from typing import Any

import pytest

from gpuhealth_api import keys, vocabulary
from gpuhealth_operator.decisions import isolation, model

Condition = vocabulary.Condition
RECOVERY = (Condition.RECOVERY_REQUIRED,)
NODE = model.NodeView("gpu-node-1", labels={keys.GPU_COUNT_LABEL: "8"})
NODE_WIDE = {"NodeReboot", "SystemReboot", "RecoverImexDomain", "DrainP2P", "DrainAndReset"}


def facts(action: str) -> Any:
    gpus: list[dict[str, Any]] = [
        {"index": i, "uuid": f"GPU-{i}", "recoveryAction": "None"} for i in range(8)
    ]
    gpus[2]["recoveryAction"] = action
    return {"agent": {"expectedGpuCount": 8}, "gpus": gpus}


@pytest.mark.parametrize("action", [a.value for a in vocabulary.RecoveryAction if a.value != "None"])
def test_only_a_gpu_level_recovery_isolates_one_gpu(action: str) -> None:
    found = isolation.attribute(facts(action), NODE, RECOVERY, critical_xids=frozenset())
    assert [gpu.index for gpu in found.gpus] == [2]
    node_wide = found.gpus[0].node_wide
    if action in NODE_WIDE:
        assert node_wide is not None and action in node_wide
        decided = isolation.decide(
            found, devices={}, api_version="resource.k8s.io/v1alpha3", max_gpus_per_node=8, budget_left=8
        )
        assert decided.node_ladder is not None and action in decided.node_ladder
    else:
        assert node_wide is None
