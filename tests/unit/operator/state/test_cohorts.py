"""The straggler cohorts kept across ticks (`cohorts`) score exactly as the full computation (issue 29).

`full_score_stragglers` is `reconciler.score_stragglers` as it was before the cohorts were kept (commit
4ac2ccd): every member of every cohort judged on every tick. Random fleets, reports, ticks, stale agents,
agent pods not Ready or gone, idle GPUs, lost GPUs, our own status writes, members leaving and joining
the selection, forgotten nodes, policies' thresholds changing and time going back: after every tick both
leave the same `ctx.judging.stragglers` (to the sign of a zero), the same samples (windows, memos) and
the same nodes to judge again.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import random
import statistics
import types
from typing import Any

import pytest

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import (
    liveness,
    model,
    policies,
    signals,
    straggler_stats,
    stragglers,
    times,
)
from gpuhealth_operator.state import cache, cohort_members, cohorts

T0 = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
MAX_CLOCK = 1980


def full_score_stragglers(ctx: Any, now: datetime.datetime) -> set[str]:
    """`reconciler.score_stragglers` at 4ac2ccd, word for word (`_heartbeat_seconds`, `judged_part`)."""
    before = dict(ctx.judging.stragglers)
    ctx.judging.stragglers.clear()
    for policy in ctx.cache.policies.values():
        rules = [r for r in policy.rules if r.condition is vocabulary.Condition.STRAGGLER]
        if not rules:
            continue
        threshold = rules[0].threshold or policies.DEFAULT_STRAGGLER_THRESHOLD
        fresh: dict[str, cache.GPUNodeRecord] = {}
        pods = ctx.agent_pods.nodes
        for name in sorted(ctx.cache.selection(policy).selected):  # a stable cohort order
            gpunode = ctx.cache.gpunode(name)
            if gpunode is not None and not signals.agent_is_stale(
                gpunode.stale_limit, gpunode.report_age(now), now, pods.get(name)
            ):
                fresh[name] = gpunode
        performance = {
            name: stragglers.smoothed(
                ctx.judging.straggler_samples[(policy.name, name)],
                gpunode.performance,
                gpunode.clocks,
                gpunode.report_seen_at,
                now,
                cohort_members.heartbeat_seconds(gpunode),
            )
            if gpunode.performance[1] is not None
            else gpunode.performance
            for name, gpunode in fresh.items()
        }
        for name, score in straggler_stats.judge_nodes(performance, threshold).items():
            samples = ctx.judging.straggler_samples[(policy.name, name)]
            ctx.judging.stragglers[(policy.name, name)] = stragglers.windowed(
                samples,
                score,
                fresh[name].report_seen_at if stragglers.settled(samples) else None,
                now,
                rules[0].for_seconds,
                cohort_members.heartbeat_seconds(fresh[name]),
                threshold,
                was_flagged=(was := before.get((policy.name, name))) is not None and was.flagged,
                flagged_since=was.since if was is not None else None,
            )
    keys = before.keys() | ctx.judging.stragglers.keys()
    return {
        key[1]
        for key in keys
        if cohort_members.judged_part(before.get(key))
        != cohort_members.judged_part(ctx.judging.stragglers.get(key))
    }


class FakeCache:
    """What the scoring reads of the cluster cache: the policies, their selections, the GPUNodes."""

    def __init__(self) -> None:
        self.policies: dict[str, model.Policy] = {}
        self.selected: dict[str, set[str]] = {}
        self.records: dict[str, cache.GPUNodeRecord] = {}
        self.gpunodes = self.records

    def selection(self, policy: model.Policy) -> types.SimpleNamespace:
        return types.SimpleNamespace(selected=self.selected[policy.name])

    def gpunode(self, name: str) -> cache.GPUNodeRecord | None:
        return self.records.get(name)


def fake_context(shared: FakeCache, pods: dict[str, liveness.AgentPod]) -> Any:
    return types.SimpleNamespace(
        cache=shared,
        agent_pods=types.SimpleNamespace(nodes=pods),
        judging=types.SimpleNamespace(
            stragglers={},
            straggler_samples=collections.defaultdict(stragglers.Samples),
            straggler_cohorts=cohorts.Cohorts(),
        ),
    )


def straggler_policy(name: str, rng: random.Random) -> model.Policy:
    threshold = rng.choice([None, 2.0, 3.5])
    rule = model.Rule(
        name="slow",
        condition=vocabulary.Condition.STRAGGLER,
        action=vocabulary.Action.LABEL,
        for_seconds=rng.choice([0.0, 120.0, 300.0, 600.0]),
        threshold=threshold,
    )
    return model.Policy(name=name, rules=(rule,))


@dataclasses.dataclass
class Node:
    name: str
    model: str
    driver: str
    period: int
    gpus: int
    slow: float = 1.0
    idle: bool = False
    lost: bool = False
    hot: bool = False
    silent_until: datetime.datetime | None = None


def facts(node: Node, rng: random.Random, at: datetime.datetime) -> dict[str, Any]:
    gpus = []
    for i in range(node.gpus):
        ratio = min(1.0, max(0.8, 0.975 + rng.gauss(0, 0.03))) * (node.slow if i == 0 else 1.0)
        gpu: dict[str, Any] = {
            "index": i,
            "uuid": f"GPU-{node.name}-{i}",
            "model": node.model,
            "smClockMHz": round(MAX_CLOCK * ratio / 15) * 15,
            "maxSmClockMHz": MAX_CLOCK,
            "utilizationPercent": 0 if node.idle else rng.choice([70, 95, 100]),
            "clockEventReasons": ["SwThermalSlowdown"] if node.hot and i in {1, 2} else [],
        }
        if node.lost and i == node.gpus - 1:
            gpu["lost"] = True
        gpus.append(gpu)
    return {
        "agent": {
            "lastHeartbeatTime": times.render(at),
            "heartbeatSeconds": node.period,
            "driverVersion": node.driver,
            "expectedGpuCount": node.gpus,
        },
        "summary": {"model": node.model, "gpuCount": node.gpus},
        "gpus": gpus,
    }


def record(
    name: str, status: dict[str, Any], seen: datetime.datetime | None, version: int
) -> cache.GPUNodeRecord:
    return cache.GPUNodeRecord(
        name=name, uid=name, resource_version=str(version), status=status, report_seen_at=seen
    )


def exact(scores: dict[tuple[str, str], model.StragglerScore]) -> dict[tuple[str, str], str]:
    return {key: repr(score) for key, score in scores.items()}  # repr: a zero's sign too


def samples_of(ctx: Any) -> dict[tuple[str, str], str]:
    return {
        key: repr((list(s), list(s.clocks), s.memo, s.smoothed_score))
        for key, s in ctx.judging.straggler_samples.items()
    }


def run_scenario(seed: int, ticks: int) -> tuple[int, int]:
    """Both computations side by side over one random story; the ticks and the flags seen."""
    rng = random.Random(seed)
    shared = FakeCache()
    pods: dict[str, liveness.AgentPod] = {}
    full, kept = fake_context(shared, pods), fake_context(shared, pods)
    now = T0
    version = 0
    models = [("NVIDIA H100", "550.1"), ("NVIDIA H100", "560.2"), ("NVIDIA H200", "550.1")]
    nodes = [
        Node(
            name=f"n{i:02d}",
            model=(pick := rng.choice(models[: rng.randint(1, 3)]))[0],
            driver=pick[1],
            period=rng.choice([60, 120, 300]),
            gpus=rng.choice([2, 4, 8]),
            slow=rng.choice([1.0] * 5 + [0.8, 0.88, 0.92]),
        )
        for i in range(rng.randint(3, 24))
    ]
    names = [n.name for n in nodes]
    for name in ("a", "b")[: rng.randint(1, 2)]:
        shared.policies[name] = straggler_policy(name, rng)
        shared.selected[name] = {n for n in names if rng.random() < 0.9}
    shared.policies["plain"] = model.Policy(name="plain")
    shared.selected["plain"] = set(names)
    next_report = {n.name: now + datetime.timedelta(seconds=rng.uniform(0, n.period)) for n in nodes}
    flags = 0
    for _ in range(ticks):
        step = rng.choice([0, 1, 5, 10, 10, 10, 30, 60, 200])
        if rng.random() < 0.01:
            step = -rng.choice([1, 30])  # the clock went back
        now += datetime.timedelta(seconds=step, microseconds=rng.choice([0, 0, rng.randint(0, 999_999)]))
        for node in nodes:
            if node.silent_until is not None and now >= node.silent_until:
                node.silent_until = None
            if next_report[node.name] <= now and node.silent_until is None:
                next_report[node.name] = now + datetime.timedelta(seconds=node.period * rng.uniform(0.9, 1.0))
                version += 1
                seen = now if rng.random() < 0.97 else None
                shared.records[node.name] = record(node.name, facts(node, rng, now), seen, version)
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            node = rng.choice(nodes)
            event = rng.randrange(12)
            current = shared.records.get(node.name)
            if event == 0 and current is not None:  # our own status write: a new record, the same report
                version += 1
                status = dict(current.status) | {"conditions": [{"type": "x", "status": str(version)}]}
                shared.records[node.name] = record(node.name, status, current.report_seen_at, version)
            elif event == 1:
                node.silent_until = now + datetime.timedelta(seconds=rng.choice([200, 600, 2000]))
            elif event == 2:
                node.idle = not node.idle
            elif event == 3:
                node.lost = not node.lost
            elif event == 4:
                node.hot = not node.hot
            elif event == 5:
                since = now - datetime.timedelta(seconds=rng.choice([0, 30, 90]))
                pods[node.name] = liveness.AgentPod(
                    f"gpu-health/agent-{node.name}", rng.random() < 0.4, since, gone=rng.random() < 0.3
                )
            elif event == 6:
                shared.records.pop(node.name, None)
            elif event == 7:
                policy = rng.choice([p for p in shared.selected if p != "plain"])
                shared.selected[policy] ^= {node.name}
            elif event == 8:  # Context.forget_verdicts
                for ctx in (full, kept):
                    for key in [k for k in ctx.judging.stragglers if k[1] == node.name]:
                        del ctx.judging.stragglers[key]
                    for key in [k for k in ctx.judging.straggler_samples if k[1] == node.name]:
                        del ctx.judging.straggler_samples[key]
            elif event == 9 and rng.random() < 0.3:
                name = rng.choice(["a", "b", "c"])
                if name in shared.policies and rng.random() < 0.3:
                    del shared.policies[name]  # and Context.forget_policy
                    for ctx in (full, kept):
                        for key in [k for k in ctx.judging.stragglers if k[0] == name]:
                            del ctx.judging.stragglers[key]
                        for key in [k for k in ctx.judging.straggler_samples if k[0] == name]:
                            del ctx.judging.straggler_samples[key]
                else:
                    shared.policies[name] = straggler_policy(name, rng)
                    shared.selected.setdefault(name, {n for n in names if rng.random() < 0.8})
            elif event == 10:
                node.slow = rng.choice([1.0, 0.8, 0.9])
            elif event == 11:
                pods.pop(node.name, None)
        expected = full_score_stragglers(full, now)
        got = cohorts.score(kept, now)
        assert got == expected, (seed, now)
        assert exact(kept.judging.stragglers) == exact(full.judging.stragglers), (seed, now)
        assert samples_of(kept) == samples_of(full), (seed, now)
        flags += sum(1 for s in full.judging.stragglers.values() if s.flagged)
    return ticks, flags


@pytest.mark.parametrize("seed", range(40))
def test_kept_cohorts_score_as_the_full_computation(seed: int) -> None:
    run_scenario(seed, ticks=300)


def test_the_stories_flag_stragglers() -> None:
    """The random stories exercise flags (a window's judgement, a held flag), not only healthy cohorts."""
    assert sum(run_scenario(seed, ticks=300)[1] for seed in range(100, 110)) > 0


@pytest.mark.parametrize("seed", range(20))
def test_sorted_scores_give_the_median_and_mad_of_statistics(seed: int) -> None:
    """`SortedScores.median_and_mad` against `statistics.median` (the numbers `cohort_scale` sorts for),
    on cohorts of tied scores (clocks in 15 MHz steps), scores moving in and out, odd and even counts."""
    rng = random.Random(seed)
    levels = [
        round(MAX_CLOCK * rng.uniform(0.8, 1.0) / 15) * 15 / MAX_CLOCK for _ in range(rng.randint(1, 12))
    ]
    scores = straggler_stats.SortedScores()
    values: list[float] = []
    for _ in range(400):
        if values and rng.random() < 0.45:
            scores.remove(values.pop(rng.randrange(len(values))))
        else:
            value = rng.choice(levels) * rng.choice([1.0, 1.0, 0.875, 1 - 1 / 3])
            values.append(value)
            scores.add(value)
        if values:
            median = statistics.median(values)
            expected = (median, statistics.median(abs(v - median) for v in values))
            assert repr(scores.median_and_mad()) == repr(expected)
    scores.add(0.0)
    assert not scores.exact  # a zero: the caller sorts, a zero's sign included
    scores.remove(0.0)
    assert scores.exact
