"""Issue 48, Deliver 2: the GPU Operator's operands step aside for a reset, and come back.

On the in-memory cluster (`repair_memory`: the test plays the agent and the operand DaemonSets, whose
pods follow their `nvidia.com/gpu.deploy.<operand>` labels). What a user sees on the Node: only the
operand labels that were "true" turn "false", recorded in `gpuhealth.io/operands-paused` in the same
write; no ResetGPU Job while an operand pod is on the node; after the Job, exactly those labels back to
"true" and the record gone — a label a human changed meanwhile left as the human set it, a label off
before we came left off; the same after a restart mid-step; a node without operand labels untouched.
"""

from __future__ import annotations

import asyncio

import repair_memory
from gpuhealth_api import keys

DP = "nvidia.com/gpu.deploy.device-plugin"
DCGM = "nvidia.com/gpu.deploy.dcgm"
EXPORTER = "nvidia.com/gpu.deploy.dcgm-exporter"
GFD = "nvidia.com/gpu.deploy.gpu-feature-discovery"
PAUSED = keys.OPERANDS_PAUSED_ANNOTATION
MANAGED = {DP: "true", DCGM: "true", EXPORTER: "true", GFD: "false"}  # GFD: off by its owner's choice


async def up_to_the_reset(fleet: repair_memory.Fleet) -> None:
    await fleet.start()
    await fleet.tick(times=8)


def test_only_the_operands_that_were_on_are_paused_and_restored_around_the_reset() -> None:
    async def story() -> None:
        fleet = repair_memory.Fleet(labels=MANAGED)
        fleet.operands_follow_labels = False  # the DaemonSet controller is slow: pods still there
        await up_to_the_reset(fleet)
        labels = fleet.node_labels()
        assert {k: labels.get(k) for k in MANAGED} == {
            DP: "false",
            DCGM: "false",
            EXPORTER: "false",
            GFD: "false",
        }
        assert fleet.node_annotations().get(PAUSED) == ",".join([DP, DCGM, EXPORTER])
        assert fleet.operand_pods(), "the test's operand pods went too early"
        assert fleet.jobs("ResetGPU") == [], "a reset while operand pods hold the GPU"
        assert fleet.asked() is None, "the agent asked to let go before the operands left"

        fleet.operands_follow_labels = True  # their pods leave
        await fleet.tick(times=3)
        assert fleet.operand_pods() == []
        (reset,) = fleet.jobs("ResetGPU")
        fleet.cluster.end_job(reset["metadata"]["name"], True, fleet.epoch())
        fleet.faulty = False
        await fleet.tick(times=3)
        labels = fleet.node_labels()
        assert {k: labels.get(k) for k in MANAGED} == MANAGED, "not restored exactly"
        assert PAUSED not in fleet.node_annotations()
        assert fleet.jobs("Validation"), "no validation after the reset"

    asyncio.run(story())


def test_a_human_who_edits_an_operand_label_mid_step_wins() -> None:
    async def story() -> None:
        fleet = repair_memory.Fleet(labels=MANAGED)
        await up_to_the_reset(fleet)
        (reset,) = fleet.jobs("ResetGPU")  # the reset runs
        assert fleet.node_labels()[DP] == "false"
        await fleet.human_label(DP, "true")  # the human wants the device plugin back now
        await fleet.human_label(EXPORTER, None)  # and dcgm-exporter off the node for good
        fleet.cluster.end_job(reset["metadata"]["name"], True, fleet.epoch())
        fleet.faulty = False
        await fleet.tick(times=3)
        labels = fleet.node_labels()
        assert labels[DP] == "true" and EXPORTER not in labels, labels  # the human's
        assert labels[DCGM] == "true" and labels[GFD] == "false", labels  # ours restored, theirs kept
        assert PAUSED not in fleet.node_annotations()

    asyncio.run(story())


def test_an_operand_brought_back_before_the_reset_holds_it() -> None:
    """A human turning an operand on again before the Job: its pod holds the GPU, no reset starts."""

    async def story() -> None:
        fleet = repair_memory.Fleet(labels=MANAGED, confirms=False)
        await up_to_the_reset(fleet)
        await fleet.human_label(DP, "true")
        fleet.confirms = True
        await fleet.tick(times=5)
        assert fleet.operand_pods(), "the device plugin's pod is back"
        assert fleet.jobs("ResetGPU") == [], "a reset beside a running device plugin"

    asyncio.run(story())


def test_a_restart_mid_step_restores_what_the_earlier_process_paused() -> None:
    async def story() -> None:
        fleet = repair_memory.Fleet(labels=MANAGED)
        await up_to_the_reset(fleet)
        (reset,) = fleet.jobs("ResetGPU")
        assert fleet.node_labels()[DP] == "false"
        await fleet.restart()  # kill -9 mid-step: the new process knows only the cluster
        fleet.cluster.end_job(reset["metadata"]["name"], True, fleet.epoch())
        fleet.faulty = False
        await fleet.tick(times=4)
        labels = fleet.node_labels()
        assert {k: labels.get(k) for k in MANAGED} == MANAGED, labels
        assert PAUSED not in fleet.node_annotations()
        assert len(fleet.jobs("ResetGPU")) == 1, "a second reset Job after the restart"

    asyncio.run(story())


def test_a_node_the_gpu_operator_does_not_manage_is_left_alone() -> None:
    async def story() -> None:
        fleet = repair_memory.Fleet()
        await up_to_the_reset(fleet)
        assert fleet.jobs("ResetGPU"), "the reset waited for operands a node does not have"
        assert not any(k.startswith("nvidia.com/gpu.deploy.") for k in fleet.node_labels())
        assert PAUSED not in fleet.node_annotations()

    asyncio.run(story())


def test_a_reset_on_an_nvswitch_board_names_every_gpu_of_the_board() -> None:
    """Issue 48, item 4: on an HGX board (the agent reports fabric info for its GPUs) one GPU cannot be
    reset alone: the ResetGPU Job gets every GPU of the board, the Event says so."""

    async def story() -> None:
        fleet = repair_memory.Fleet()
        fleet.gpu_facts = {
            i: {"fabric": {"state": "Completed", "status": "Success", "cliqueId": 7}} for i in range(8)
        }
        await up_to_the_reset(fleet)
        await fleet.tick(times=2)
        (reset,) = fleet.jobs("ResetGPU")
        (container,) = reset["spec"]["template"]["spec"]["containers"]
        uuids = next(e["value"] for e in container["env"] if e["name"] == keys.REPAIR_GPUS_ENV).split(",")
        status = fleet.cluster.gpunodes[repair_memory.NODE]["status"]
        assert uuids == [g["uuid"] for g in status["gpus"]], uuids

    asyncio.run(story())


def test_a_reset_of_a_pcie_gpu_names_it_alone() -> None:
    async def story() -> None:
        fleet = repair_memory.Fleet()
        await up_to_the_reset(fleet)
        await fleet.tick(times=2)
        (reset,) = fleet.jobs("ResetGPU")
        (container,) = reset["spec"]["template"]["spec"]["containers"]
        uuids = next(e["value"] for e in container["env"] if e["name"] == keys.REPAIR_GPUS_ENV).split(",")
        status = fleet.cluster.gpunodes[repair_memory.NODE]["status"]
        assert uuids == [status["gpus"][0]["uuid"]], uuids

    asyncio.run(story())
