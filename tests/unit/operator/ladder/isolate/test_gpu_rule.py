"""One GPU's DeviceTaintRule as an action (`gpu_rules.GPURule`), on the in-memory cluster: made once
(a second start adopts it and says nothing), seen by `observe`, deleted by `undo`; never made for a GPU
the pass did not decide to isolate or that has no DRA device; every write makes the next pass list the
rules afresh, so the GPU budget counts what is there."""

import asyncio
import datetime

import operator_context
from gpuhealth_api import vocabulary
from gpuhealth_operator.client import protocol
from gpuhealth_operator.decisions import device_taints, isolation, policies
from gpuhealth_operator.ladder.isolate import gpu_rules
from gpuhealth_operator.shared import context
from gpuhealth_sim.backtest import memcluster

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
VERSION = "v1beta2"
DEVICE = device_taints.Device("gpu.nvidia.com", "n", "gpu-3")
ECC = vocabulary.Condition.ECC_UNCORRECTABLE


def cluster() -> tuple[memcluster.MemoryKube, context.Context]:
    kube = memcluster.MemoryKube()
    kube.serve_device_taint_rules(VERSION)
    ctx = operator_context.new_context(kube, clock=lambda: NOW)
    spec = {"rules": [{"name": "ecc", "condition": "EccUncorrectable", "action": "IsolateGPU"}]}
    ctx.cache.put_policy(policies.parse_policy("iso", 1, spec))
    ctx.cache.put_node({"metadata": {"name": "n", "uid": "uid-n", "resourceVersion": "1"}, "spec": {}})
    return kube, ctx


def gpu(
    outcome: isolation.Outcome = isolation.Outcome.ISOLATE, device: device_taints.Device | None = DEVICE
) -> isolation.GPUDecision:
    return isolation.GPUDecision(3, "GPU-3", (ECC,), outcome, "faulty", device)


def test_a_gpus_rule_is_made_once_seen_and_undone() -> None:
    async def scenario() -> None:
        kube, ctx = cluster()
        action: protocol.Action[bool] = gpu_rules.GPURule(ctx, ctx.cache.policies["iso"], "n", VERSION, gpu())
        assert action.name == "isolation of GPU 3 (GPU-3) by policy iso"
        assert await action.decide(NOW) is None
        assert not await action.observe()

        ctx.steps.isolate.rules_read.put(
            (gpu_rules.ALL, VERSION), [], NOW
        )  # a rule list read before the create
        assert await action.start(NOW) is True
        rule = device_taints.rule_name("n", 3)
        assert list(kube.rules) == [rule]
        made = kube.rules[rule]
        assert made["metadata"]["ownerReferences"][0]["uid"] == "uid-n", "deleted with its Node"
        assert made["spec"]["deviceSelector"]["device"] == "gpu-3"
        assert ctx.steps.isolate.rules_read.get((gpu_rules.ALL, VERSION), NOW) is None, (
            "the next pass lists afresh"
        )
        assert await action.observe()

        assert await action.start(NOW) is False, "a rule of its name is adopted (a lost answer)"
        isolated = [e for e in kube.event_log if e["reason"] == vocabulary.EventReason.GPU_ISOLATED]
        assert len(isolated) == 1, isolated

        assert await action.undo() is True
        assert kube.rules == {}
        assert not await action.observe()
        assert await action.undo() is False, "nothing left to delete"

    asyncio.run(scenario())


def test_no_rule_is_made_for_a_gpu_not_decided_for_isolation_or_without_a_device() -> None:
    async def scenario() -> None:
        _, ctx = cluster()
        policy = ctx.cache.policies["iso"]
        waiting = gpu_rules.GPURule(ctx, policy, "n", VERSION, gpu(isolation.Outcome.WAIT))
        assert await waiting.decide(NOW) == "it is not decided to be isolated"
        unpublished = gpu_rules.GPURule(ctx, policy, "n", VERSION, gpu(device=None))
        assert await unpublished.decide(NOW) == "no DRA device of the node is this GPU"
        held = gpu_rules.GPURule(ctx, policy, "n", VERSION, isolation.Isolated(3, "GPU-3", "r"))
        assert await held.decide(NOW) == "it is not decided to be isolated", "a held rule is only undone"

    asyncio.run(scenario())
