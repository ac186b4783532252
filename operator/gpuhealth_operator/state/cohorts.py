"""Straggler cohorts kept from one timer tick to the next, so a tick works only on what changed (issue 29).

The timer judges every straggler cohort on every tick (`reconciler.score_stragglers`): per member its
staleness (`signals.agent_is_stale`), its smoothed score (`stragglers.smoothed`), its z against the
cohort's median and scale (`straggler_stats.judge`) and its window (`stragglers.windowed`). Done for every
member on every tick that cost grew with the fleet, not with the reports (about 100 ms a tick at 5,000
nodes). Here each policy's cohorts are kept across ticks, and a tick calls those same functions, with the
same arguments, only for the members whose calls could answer otherwise or change something:

- touched: its GPUNode record, its agent pod's record, its samples or its `Context.judging.stragglers`
  entry is another object than the last tick saw (a report, our own status write, a pod turning Ready, a node
  forgotten by `Context.forget_verdicts`), or a deadline came: its agent may turn stale (a second before
  the stale limit or the pod's grace runs out), its clock window drops a report, or its window's
  judgement expires (`Samples.memo`'s valid-until);
- unsettled: the last call on its inputs left something a call on the same inputs would change again
  (its flag changed, so the next call's `was_flagged` differs; its window emptied);
- rejudged: its cohort's median, scale or peer count moved and its rounded StragglerScore with them.

A cohort's median and scale are worked out again (from all its scores) only when a member's score or the
membership changed. A member left alone is one whose calls would return what they returned and change
nothing, so the scores, the samples and the moved nodes are those of the full computation (the property
test `tests/unit/operator/state/test_cohorts.py` compares the two). Time going backwards, a policy's threshold
or forSeconds changing start the policy's cohorts afresh.
"""

from __future__ import annotations

import collections
import datetime
import heapq
import itertools
import operator
from typing import TYPE_CHECKING, Any, Protocol

from gpuhealth_api import vocabulary
from gpuhealth_operator.decisions import (
    liveness,
    model,
    policies,
    signals,
    straggler_scores,
    straggler_stats,
    stragglers,
)
from gpuhealth_operator.state import cohort_members

if TYPE_CHECKING:
    from gpuhealth_operator.state import agent_pods, cache

_Samples = stragglers.Samples
"""The module's name, which `Fleet.stragglers` hides inside the class."""


class Fleet(Protocol):
    """What the cohorts read and write of the operator's context (`shared.context.Context` is one).

    A protocol, so that the state below the context does not import it.
    """

    @property
    def cache(self) -> cache.ClusterCache: ...
    @property
    def agent_pods(self) -> agent_pods.AgentPods: ...
    @property
    def judging(self) -> Judged: ...


class Judged(Protocol):
    """What the cohorts keep of judging's memory (`judged.JudgingMemory` is one)."""

    @property
    def stragglers(self) -> dict[cohort_members.Key, model.StragglerScore]: ...
    @property
    def straggler_samples(self) -> collections.defaultdict[cohort_members.Key, _Samples]: ...
    @property
    def straggler_cohorts(self) -> Cohorts: ...


_UNSEEN = object()
"""What a new member's last-seen record, pod, samples and entry are: none of them is it."""


class _PolicyCohorts:
    """One policy's members (its selection) and cohorts, as the last tick left them."""

    def __init__(self, params: tuple[float, float]) -> None:
        self.params = params
        self.threshold, self.for_seconds = params
        self.selected: frozenset[str] = frozenset()
        self.names: list[str] = []
        self.keys: list[cohort_members.Key] = []
        self.index: dict[str, int] = {}
        self.members: list[cohort_members.Member] = []
        self.records: list[Any] = []  # what the last tick saw (`_UNSEEN`: nothing yet)
        self.pods: list[Any] = []  # what the last tick saw (`_UNSEEN`: nothing yet)
        self.samples: list[Any] = []  # what the last tick saw (`_UNSEEN`: nothing yet)
        self.outs: list[Any] = []  # what the last tick saw (`_UNSEEN`: nothing yet)
        self.count = 0
        """How many of `outs` are scores (entries of this policy in `Context.judging.stragglers`)."""
        self.groups: dict[straggler_scores.Cohort, cohort_members.Group] = {}
        self.dirty: set[straggler_scores.Cohort] = set()
        self.pending: set[int] = set()
        self.heap: list[tuple[datetime.datetime, int, int]] = []
        self.seq = itertools.count()

    def recount(self) -> None:
        self.count = sum(map(operator.is_not, self.outs, itertools.repeat(None)))  # no StragglerScore.__eq__

    def forget(self, ctx: Fleet, moved: set[str]) -> None:
        """The policy has no straggler cohorts any more: its scores go."""
        for key in self.keys:
            if ctx.judging.stragglers.pop(key, None) is not None:
                moved.add(key[1])

    def reselect(self, ctx: Fleet, policy: str, selected: frozenset[str], moved: set[str]) -> None:
        """The selection changed: members leave (their scores go) and join (to be looked at)."""
        last = zip(self.members, self.records, self.pods, self.samples, self.outs, strict=True)
        old = dict(zip(self.names, last, strict=True))
        for name in self.selected - selected:
            member = old[name][0]
            if member.group is not None:
                self._leave_group(name, member)
            if ctx.judging.stragglers.pop((policy, name), None) is not None:
                moved.add(name)
        pending = {self.names[i] for i in self.pending}
        self.selected = selected
        self.names = sorted(selected)
        self.keys = [(policy, name) for name in self.names]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.members, self.records, self.pods, self.samples, self.outs = [], [], [], [], []
        self.heap = []
        self.pending = set()
        for i, name in enumerate(self.names):
            kept = old.get(name)
            if kept is None:
                key = self.keys[i]
                kept = (
                    cohort_members.Member(),
                    _UNSEEN,
                    _UNSEEN,
                    ctx.judging.straggler_samples.get(key),
                    ctx.judging.stragglers.get(key),
                )
                self.pending.add(i)
            elif name in pending:
                self.pending.add(i)
            member = kept[0]
            self.members.append(member)
            self.records.append(kept[1])
            self.pods.append(kept[2])
            self.samples.append(kept[3])
            self.outs.append(kept[4])
            if member.due is not None:
                self.heap.append((member.due, member.seq, i))
        heapq.heapify(self.heap)
        self.recount()

    def _leave_group(self, name: str, member: cohort_members.Member) -> None:
        assert member.group is not None
        group = self.groups[member.group]
        group.ordered.remove(group.scores.pop(name))
        group.judged.pop(name, None)
        group.changed.discard(name)
        self.dirty.add(member.group)
        member.group = None

    def tick(
        self,
        ctx: Fleet,
        policy: model.Policy,
        now: datetime.datetime,
        moved: set[str],
        *,
        scan: bool,
    ) -> None:
        """One timer tick of the policy's cohorts. `scan`: look for scores and samples that someone else
        dropped (`Context.forget_verdicts`); without, this policy's entries are as the last tick left them."""
        selected = ctx.cache.selection(policy).selected
        if selected != self.selected:
            self.reselect(ctx, policy.name, frozenset(selected), moved)
        names, keys = self.names, self.keys
        touched, self.pending = self.pending, set()
        records = list(map(ctx.cache.gpunodes.get, names))
        pods = list(map(ctx.agent_pods.nodes.get, names))
        seen: list[tuple[list[Any], list[Any]]] = [(self.records, records), (self.pods, pods)]
        samples, outs = self.samples, self.outs
        if scan:
            samples = list(map(ctx.judging.straggler_samples.get, keys))
            outs = list(map(ctx.judging.stragglers.get, keys))
            seen += [(self.samples, samples), (self.outs, outs)]
        everyone = range(len(names))
        for last, current in seen:
            if not all(map(operator.is_, last, current)):  # the same objects (not just equal ones)
                touched.update(itertools.compress(everyone, map(operator.is_not, last, current)))
        heap = self.heap
        while heap and heap[0][0] <= now:
            _, seq, i = heapq.heappop(heap)
            member = self.members[i]
            if member.seq == seq:
                member.due = None  # its entry is gone: `_schedule` makes the next one
                touched.add(i)
        self.records, self.pods, self.samples, self.outs = records, pods, samples, outs
        if scan:
            self.recount()
        rewindow: set[int] = set()
        for i in touched:
            if self._look(ctx, i, now, moved):
                rewindow.add(i)
        for cohort in self.dirty:
            group = self.groups[cohort]
            if not group.scores:
                del self.groups[cohort]
                continue
            if group.ordered.exact:
                median, mad = group.ordered.median_and_mad()
                scale = straggler_stats.floored(median, mad)
            else:
                median, scale = straggler_stats.cohort_scale(list(group.scores.values()))
            peers = len(group.scores) - 1
            judging = group.scores  # the statistics moved: every member's z may have
            if group.stats is not None:
                was_median, was_scale, was_peers = group.stats
                same = straggler_stats.same(median, was_median) and straggler_stats.same(scale, was_scale)
                if (
                    same and peers == was_peers and peers >= straggler_stats.MIN_PEERS
                ):  # small: each is each's
                    judging = {name: group.scores[name] for name in group.changed}
            group.stats = (median, scale, peers)
            group.changed.clear()
            rejudged = straggler_stats.rejudged(judging, median, scale, peers, self.threshold, group.judged)
            group.judged.update(rejudged)
            rewindow.update(self.index[name] for name in rejudged)
        self.dirty.clear()
        for i in rewindow:
            self._window(ctx, i, now, moved)
        for i in touched | rewindow:
            self._schedule(i)
        if len(self.heap) > 4 * len(names) + 64:  # entries of deadlines since moved
            self.heap = [(m.due, m.seq, i) for i, m in enumerate(self.members) if m.due is not None]
            heapq.heapify(self.heap)

    def _look(self, ctx: Fleet, i: int, now: datetime.datetime, moved: set[str]) -> bool:
        """The member's staleness and smoothed score now; whether it has a score (to window)."""
        name, key, member = self.names[i], self.keys[i], self.members[i]
        record = self.records[i]
        pod = self.pods[i]
        gpunode: cache.GPUNodeRecord | None = record
        agent_pod: liveness.AgentPod | None = pod
        member.look_due = None
        performance: straggler_scores.Performance = (None, None)
        if gpunode is not None and not signals.agent_is_stale(
            gpunode.stale_limit, gpunode.report_age(now), now, agent_pod
        ):
            member.look_due = cohort_members.stale_due(gpunode, agent_pod)
            performance = gpunode.performance
            if performance[1] is not None:
                samples = ctx.judging.straggler_samples[key]
                self.samples[i] = samples
                period = cohort_members.heartbeat_seconds(gpunode)
                sampled_at = gpunode.report_seen_at
                clocks = gpunode.clocks
                performance = stragglers.smoothed(samples, performance, clocks, sampled_at, now, period)
                member.period = period
                window = samples.clocks
                if performance[0] is not None and window:
                    ends = window[0][0] + datetime.timedelta(seconds=stragglers.CLOCK_WINDOW_SAMPLES * period)
                    member.look_due = ends if member.look_due is None else min(member.look_due, ends)
                if (
                    performance[0] is not None
                    and sampled_at is not None
                    and (not window or window[-1][0] != sampled_at)
                ):
                    self.pending.add(i)  # its next call would add the report again
        cohort, score = performance
        if cohort is None or score is None:
            if member.group is not None:
                self._leave_group(name, member)
            member.memo_due = None
            if self.outs[i] is not None:
                del ctx.judging.stragglers[key]
                self.outs[i] = None
                self.count -= 1
                moved.add(name)
            return False
        member.record = gpunode
        if member.group != cohort:
            if member.group is not None:
                self._leave_group(name, member)
            group = self.groups.get(cohort)
            if group is None:
                group = self.groups[cohort] = cohort_members.Group()
            group.scores[name] = score
            group.ordered.add(score)
            group.changed.add(name)
            self.dirty.add(cohort)
            member.group = cohort
        elif not straggler_stats.same(member.score, score):
            group = self.groups[cohort]
            group.ordered.remove(group.scores[name])
            group.ordered.add(score)
            group.scores[name] = score
            group.changed.add(name)
            self.dirty.add(cohort)
        member.score = score
        return True

    def _window(self, ctx: Fleet, i: int, now: datetime.datetime, moved: set[str]) -> None:
        name, key, member = self.names[i], self.keys[i], self.members[i]
        assert member.group is not None and member.record is not None
        judged = self.groups[member.group].judged[name]
        samples = ctx.judging.straggler_samples[key]
        self.samples[i] = samples
        sampled_at = member.record.report_seen_at if stragglers.settled(samples) else None
        was: model.StragglerScore | None = self.outs[i]
        takes = sampled_at is not None and (not samples or samples[-1][0] != sampled_at)
        out = (
            stragglers.windowed(
                samples,
                judged,
                sampled_at,
                now,
                self.for_seconds,
                member.period,
                self.threshold,
                was_flagged=was is not None and was.flagged,
                flagged_since=was.since if was is not None else None,
            )
            if ctx.judging.straggler_cohorts.window
            else judged  # `Cohorts.window` off: each sample's own judgement, the rule before the window
        )
        observer = ctx.judging.straggler_cohorts.observer
        if takes and observer is not None:
            assert sampled_at is not None
            observer(key, sampled_at, out)
        if out is not was:
            ctx.judging.stragglers[key] = out
            self.outs[i] = out
            self.count += was is None
            if cohort_members.judged_part(was) != cohort_members.judged_part(out):
                moved.add(name)
        # Would the next call on the same inputs be a remembered judgement that changes nothing?
        last = samples[-1] if samples else None
        inputs = (
            last,
            straggler_stats.judged_peers(out.peers),
            self.for_seconds,
            member.period,
            self.threshold,
            out.flagged,
            out.since,
        )
        memo = samples.memo
        appends = sampled_at is not None and (last is None or last[0] != sampled_at)
        if appends or memo is None or memo[0] != inputs:
            self.pending.add(i)
            member.memo_due = None
        else:
            member.memo_due = memo[1]

    def _schedule(self, i: int) -> None:
        member = self.members[i]
        if member.group is None:
            due = member.look_due
        else:
            dues = [d for d in (member.look_due, member.memo_due) if d is not None]
            due = min(dues) if dues else None
        if due == member.due:
            return
        member.due = due
        member.seq = next(self.seq)
        if due is not None:
            heapq.heappush(self.heap, (due, member.seq, i))


class Cohorts:
    """Every straggler policy's cohorts, as the last tick left them (`score`)."""

    def __init__(self) -> None:
        self.policies: dict[str, _PolicyCohorts] = {}
        self.now: datetime.datetime | None = None
        self.sizes = (-1, -1)
        """`Context.judging.stragglers`' and `straggler_samples`' sizes as the last tick left them:
        others only delete from them (`Context.forget_verdicts`, `forget_policy`), so the same sizes
        say untouched."""
        self.observer: cohort_members.Observer | None = None
        """Told each sample a window takes (a benchmark's view of the z-scores); None in service."""
        self.window = True
        """Judge on the window (`stragglers.windowed`); False: on each sample alone, the rule before the
        window, which a benchmark replays to compare with (never False in service)."""


def score(ctx: Fleet, now: datetime.datetime) -> set[str]:
    """`reconciler.score_stragglers`: the straggler scores per policy cohort in
    `ctx.judging.stragglers`, worked out again where something changed (module docstring); the
    nodes whose `judged_part` changed."""
    store: Cohorts = ctx.judging.straggler_cohorts
    moved: set[str] = set()
    if store.now is not None and now < store.now:
        store.policies.clear()  # time went back: a deadline passed may be ahead again
    store.now = now
    scan = store.sizes != (len(ctx.judging.stragglers), len(ctx.judging.straggler_samples))
    live: set[str] = set()
    for policy in ctx.cache.policies.values():
        rules = [r for r in policy.rules if r.condition is vocabulary.Condition.STRAGGLER]
        if not rules:
            continue
        threshold = rules[0].threshold or policies.DEFAULT_STRAGGLER_THRESHOLD
        params = (threshold, rules[0].for_seconds)
        live.add(policy.name)
        state = store.policies.get(policy.name)
        if state is None or state.params != params:
            state = store.policies[policy.name] = _PolicyCohorts(params)
        state.tick(ctx, policy, now, moved, scan=scan)
    for name in [n for n in store.policies if n not in live]:
        store.policies.pop(name).forget(ctx, moved)
    if len(ctx.judging.stragglers) != sum(state.count for state in store.policies.values()):
        for key, value in list(
            ctx.judging.stragglers.items()
        ):  # written by someone else: the full pass clears it
            state = store.policies.get(key[0])
            i = state.index.get(key[1]) if state is not None else None
            if state is None or i is None or state.outs[i] is not value:
                del ctx.judging.stragglers[key]
                if cohort_members.judged_part(value) is not None:
                    moved.add(key[1])
    store.sizes = (len(ctx.judging.stragglers), len(ctx.judging.straggler_samples))
    return moved
