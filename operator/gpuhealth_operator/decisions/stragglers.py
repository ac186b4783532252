"""Stragglers: nodes that run markedly slower than identical peers under load.

Cohorts. Nodes are only compared with nodes of the same GPU model and driver
version (`status.summary.model`, `status.agent.driverVersion`): different
boards or drivers boost differently, and a mixed cohort would flag the slower
model, not the sick node.

Score. For each busy GPU (utilization above signals.BUSY_UTILIZATION_PERCENT;
a GPU in MIG mode, for which NVML has no utilization, when its clock event
reasons do not say GpuIdle) with both clocks reported, the SM clock relative
to its max clock, capped at 1. On one report the node's score is

    score = min over busy GPUs (smClockMHz / maxSmClockMHz)
            * (1 - share of busy GPUs with a thermal or power slowdown reason)

Smoothed. The timer judges each node on its reports of the last
CLOCK_WINDOW_SAMPLES heartbeats (30 minutes at the agent's 300 s, `smoothed`):
each GPU's median clock ratio over them, the node's score the minimum of those
times (1 - the median throttle share); its z-scores are evidence once it rests
on SETTLED_SAMPLES reports (`settled`). GPU Boost moves every busy GPU's clock
by several percent from report to report, so on one report a healthy node's
slowest of eight GPUs sits about 1.4 jitters (5 %) below their typical clock,
and a GPU that is really 13 % slow stood only ~8 % below its peers' scores: a
15 % one-GPU straggler was never flagged (issue 27). The median over reports
takes the jitter out (a healthy node's slowest median is ~2.5 % below) and
keeps a real straggler's slow GPU where it is. A GPU's clock on a report that
gives it a thermal or power slowdown reason is the slowdown's, which the
throttle share judges: it stays out of that GPU's median (unless the GPU was
throttled on every report of the window). Once a report shows no slowdown
after reports that did, the episode is over and its reports leave the window
(`_episode_ended`), so its share cannot hold the score down afterwards. A median alone does not keep a
burst out: three throttled reports of eight move it by rank, and on seed 27
(1,000 node-days) a node whose two GPUs were throttled for 15 minutes (its
ThermalThrottled label) stood 9.5 % below max on median and was labelled
Straggler 11 minutes after the burst, for 35 minutes at full clock.

The worst GPU, not the mean, because a synchronous job (data-parallel
training, collectives) runs at the pace of its slowest GPU. The throttle share
is there because clocks are a point sample while HW slowdowns come in bursts:
a GPU that is being throttled costs throughput even when the sample catches it
at full clock. Software power capping (SwPowerCap) is the normal state of a
fully loaded GPU and does not count. A node with no busy GPU has no score: an
idle node is not slow, it is idle.

Robust z-score. Within a cohort, z = 0.6745 * (score - median) / MAD, the
robust analogue of a z-score that one or two sick nodes cannot drag. MAD has
a floor of MAD_FLOOR_FRACTION of the median: a healthy cohort of identical
nodes is nearly uniform, its MAD near 0, and without a floor a 0.1 % wobble
would be dozens of "standard deviations". With the 1.5 % floor and the
default threshold 3.5, a node must be about 7.8 % below the median to be
flagged (1 - 3.5 * 0.015 / 0.6745), under the 9.1 % lower clock of a 10 %
straggler (a 2 % floor asked for 10.4 %: a 10 % straggler could never be
flagged, even without jitter).

Flagged when z < -threshold and the cohort has at least straggler_stats.MIN_PEERS other
scored nodes. A small cohort (SMALL_COHORT_PEERS to straggler_stats.MIN_PEERS - 1 other busy
nodes: a small pool, or peers idle) falls back to the slowest of its peers:
z is taken against that peer's score instead of the median (the cohort's
scale as ever), so a node is flagged only when it is below every one of its
peers by the flag margin; two slow nodes among four are then told from
neither (issue 47: in a 5-node cohort with one or two peers idle, two real
stragglers 22 % and 25 % slow were never judged). With one peer nobody can
tell which of two is slow: never flagged. Stale agents and nodes with a
lost GPU are left out of the statistics (their numbers are old or
meaningless) and get no score. The condition still needs `forSeconds`
(hysteresis) before a rule fires.

Window. GPU Boost moves a busy GPU's clock by several percent from sample to
sample, so a real straggler's z wanders around its median and a healthy
node's dips now and then. Judged per sample, one sample above the threshold
would restart the forSeconds clock of a real straggler, and a healthy node
could be flagged for a sample. So the sustained condition is judged on the
window (`windowed`): a node is flagged when its z-scores of the last
forSeconds span forSeconds (less SPAN_SLACK of a heartbeat) and at least
WINDOW_QUANTILE of them are below -threshold, held since the window's oldest
sample, so the rule fires then, on that evidence. Without the span, a node
back from idle whose one settled z was below the threshold was flagged on it
alone, and at the agent's 300 s heartbeat the rule's forSeconds (300) ran out
as its next report came in, before the timer judged that report: it was
labelled on one sample (seed 27, 1,000 node-days, a healthy gpu-h100-001).
A flagged node stays flagged while the mean of its z-scores over the hold
(the window, and at least its last HOLD_SAMPLES samples, none from before
the evidence that flagged it) is below
-HOLD_FRACTION * threshold (-1.75 at the default 3.5): a hysteresis band, so
a straggler whose z sits on the set threshold (a one-GPU straggler of ~17 %,
its node's score the minimum over jittery GPUs, z -3.3 on median with one
sample in three above -2.5) keeps its label instead of flapping with the
jitter, and only a node that came back towards its peers is cleared. A mean
over several samples, because at the agent's 300 s heartbeat a forSeconds
window holds only two or three.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
from collections.abc import Mapping, MutableSequence
from typing import Final

from gpuhealth_operator.decisions import model, straggler_scores, straggler_stats

WINDOW_QUANTILE: Final = 0.7
"""Share of the window's z-scores that must be below -threshold."""
HOLD_FRACTION: Final = 0.5
"""A flagged node stays flagged while the mean z of its hold is below -HOLD_FRACTION * threshold."""
HOLD_SAMPLES: Final = 6
"""The hold covers at least this many heartbeats (the window, if longer)."""
CLOCK_WINDOW_SAMPLES: Final = 6
"""The score is each GPU's median clock over the reports of this many heartbeats (`smoothed`)."""
SETTLED_SAMPLES: Final = 3
"""A node's score counts as evidence (a z-score in its window) once it rests on this many reports."""
SPAN_SLACK: Final = 0.1
"""A new flag's samples span forSeconds less this share of a heartbeat: the agent draws each quiet period
up to 10 % short of its heartbeat (the agent's HEARTBEAT_JITTER)."""


def settled(samples: Samples) -> bool:
    """Whether the node's smoothed score rests on SETTLED_SAMPLES reports or more. A node back from an
    idle stretch (or new) has a score of one or two reports, the minimum over GPUs of fewer samples than
    its peers', so lower by GPU-Boost jitter alone: it counts among its peers, but its z-scores are not
    evidence until it settles (the timer then gives `windowed` no sample time)."""
    return len(samples.clocks) >= SETTLED_SAMPLES


def smoothed(  # noqa: PLR0917 - one report's inputs
    samples: Samples,
    performance: straggler_scores.Performance,
    clocks: straggler_scores.Clocks | None,
    sampled_at: datetime.datetime | None,
    now: datetime.datetime,
    period_seconds: float,
) -> straggler_scores.Performance:
    """The node's `performance` with the score of its reports of the last CLOCK_WINDOW_SAMPLES heartbeats
    (module docstring, "Smoothed"), kept in `samples.clocks`: a report's clocks are added once, by its
    receipt time `sampled_at`, and the score is worked out again only when the window moves. `clocks`:
    the report's `clocks_of`."""
    cohort, score = performance
    if cohort is None or score is None:
        return performance
    window = samples.clocks
    if clocks is not None and sampled_at is not None and (not window or window[-1][0] != sampled_at):
        window.append((sampled_at, clocks))
        samples.smoothed_score = None
        if not clocks[1] and any(share for _, (_, share, _) in window):
            _episode_ended(samples)
    kept = now - datetime.timedelta(seconds=CLOCK_WINDOW_SAMPLES * period_seconds)
    while window and window[0][0] < kept:
        del window[0]
        samples.smoothed_score = None
    if not window:
        return performance
    if samples.smoothed_score is None:
        samples.smoothed_score = straggler_scores.window_score([clocks for _, clocks in window])
    return cohort, samples.smoothed_score if samples.smoothed_score is not None else score


def _episode_ended(samples: Samples) -> None:
    """A report without a thermal or power slowdown after reports with one: the episode is over, and its
    reports leave the clock window, their z-scores the node's evidence (issue 47). Kept, the throttled
    reports' share held the median for up to half the window after the episode (16-20 minutes at the
    agent's 300 s heartbeat), and a node at full clock was labelled Straggler. ThermalThrottled and
    PowerThrottled judge the episode; the score starts again from the clear reports (`settled` waits for
    enough of them)."""
    window = samples.clocks
    last_hot = max(at for at, (_, share, _) in window if share)
    window[:] = [(at, clocks) for at, clocks in window if not clocks[1]]
    samples[:] = [(at, z) for at, z in samples if at > last_hot]
    samples.memo = None


Window = MutableSequence[tuple[datetime.datetime, float]]
"""A node's recent (sample time, z-score), oldest first (`Samples`, or any list or deque of them)."""


class Samples(list[tuple[datetime.datetime, float]]):
    """One node's recent (sample time, z-score), oldest first, and the last judgement on them.

    Lists, not deques: a window holds a handful of samples, and an empty deque costs 760 bytes (a
    64-slot block) against a list's 56; two per straggler-policy member were 1.5 KiB of every node.

    `windowed` runs for every cohort member on every timer tick, while a member's window moves only
    when it reports (a new sample) or when time drops a sample out of it. `memo` keeps the last
    judgement's inputs, its result and the instant until which time alone cannot change it.
    """

    __slots__ = ("clocks", "memo", "smoothed_score")

    def __init__(self) -> None:
        super().__init__()
        self.memo: tuple[object, datetime.datetime, tuple[bool, datetime.datetime | None]] | None = None
        self.clocks: list[tuple[datetime.datetime, straggler_scores.Clocks]] = []
        """The node's recent reports' clocks (`smoothed`), oldest first."""
        self.smoothed_score: float | None = None
        """`straggler_scores.window_score` of `clocks`; None: to work out again."""


def windowed(  # noqa: PLR0917 - one judgement's inputs
    samples: Window,
    score: model.StragglerScore,
    sampled_at: datetime.datetime | None,
    now: datetime.datetime,
    window_seconds: float,
    period_seconds: float,
    threshold: float,
    *,
    was_flagged: bool = False,
    flagged_since: datetime.datetime | None = None,
) -> model.StragglerScore:
    """`score` judged on the window: record its z once per sample, flag on the window (module docstring).

    The window keeps one heartbeat period more than `window_seconds`, so its
    oldest sample is forSeconds old once it is full and the rule can fire then.
    `samples` keeps the hold (at least HOLD_SAMPLES heartbeats), which judges a
    node that `was_flagged` on its samples since `flagged_since` (its flag's
    `since`): the samples from before its slowdown began do not clear it. Given
    `Samples`, the judgement is remembered until a new sample or a sample's
    ageing can change it.
    """
    if sampled_at is not None and (not samples or samples[-1][0] != sampled_at):
        samples.append((sampled_at, score.z_score))
    memo = getattr(samples, "memo", None)
    last = samples[-1] if samples else None
    inputs = (
        last,
        straggler_stats.judged_peers(score.peers),
        window_seconds,
        period_seconds,
        threshold,
        was_flagged,
        flagged_since,
    )
    if memo is not None and memo[0] == inputs and now <= memo[1]:
        flagged, since = memo[2]  # no new sample, none aged out: the window says what it said
    else:
        flagged, since, valid_until = _judge_window(
            samples, score, now, window_seconds, period_seconds, threshold, was_flagged, flagged_since
        )
        if isinstance(samples, Samples):
            samples.memo = (inputs, valid_until, (flagged, since))
    if flagged == score.flagged and since == score.since:
        return score  # the common case, a node flagged neither now nor on its window: no copy
    return dataclasses.replace(score, flagged=flagged, since=since)


def _judge_window(  # noqa: PLR0917 - `windowed`'s inputs
    samples: Window,
    score: model.StragglerScore,
    now: datetime.datetime,
    window_seconds: float,
    period_seconds: float,
    threshold: float,
    was_flagged: bool,
    flagged_since: datetime.datetime | None,
) -> tuple[bool, datetime.datetime | None, datetime.datetime]:
    """`windowed`'s judgement, and the last instant at which it holds with no new sample."""
    window = window_seconds + period_seconds
    keep = datetime.timedelta(seconds=max(window, HOLD_SAMPLES * period_seconds))
    kept = now - keep
    while samples and samples[0][0] < kept:
        del samples[0]
    horizon = now - datetime.timedelta(seconds=window)
    recent = [(at, z) for at, z in samples if at >= horizon]
    if not straggler_stats.judged_peers(score.peers) or not recent:
        flagged = False
    elif was_flagged:
        held = [z for at, z in samples if flagged_since is None or at >= flagged_since]
        flagged = bool(held) and statistics.fmean(held) < -HOLD_FRACTION * threshold
    else:
        spans = (recent[-1][0] - recent[0][0]).total_seconds() >= window_seconds - SPAN_SLACK * period_seconds
        below = sum(1 for _, z in recent if z < -threshold)
        flagged = spans and below >= WINDOW_QUANTILE * len(recent)
    since = None
    if flagged:  # a held flag keeps its start; a new one starts at its window's oldest sample
        since = (flagged_since if was_flagged else None) or recent[0][0]
    # Time alone changes the judgement only when it drops a sample: out of the kept ones, or out of
    # the window (a sample already out of the window never comes back).
    ends = [samples[0][0] + keep] if samples else []
    ends += [min(at for at, _ in recent) + datetime.timedelta(seconds=window)] if recent else []
    return flagged, since, min(ends, default=datetime.datetime.max.replace(tzinfo=datetime.UTC))


def status_of(score: model.StragglerScore | None) -> dict[str, float] | None:
    """The GPUNode's `status.straggler` for `score` (None: no field)."""
    if score is None:
        return None
    return {"score": round(score.score, 3), "zScore": round(score.z_score, 2), "peers": score.peers}


def status_moved(written: object, desired: Mapping[str, float] | None) -> bool:
    """Whether `status.straggler` as `written` is worth writing over with `desired` (`status_of`; None:
    the field goes): a field to add or remove, or a number that moved by its step (`STATUS_STEPS`)."""
    if desired is None:
        return bool(written)
    return _moved(written, desired)


STATUS_STEPS = {"score": 0.1, "zScore": 3.0}
"""How far a written straggler score must move before it alone is worth a status write: GPU Boost moves
a busy GPU's clock by several percent from sample to sample, and a node's score (its slowest GPU) with
it, so smaller steps wrote a status on about half of all agent reports of a healthy fleet (a 1,000
node-day trace). A tenth of the clock is the scale a straggler is judged on. The verdict does not read
these numbers back (it keeps its own window), and any other change writes them as they are."""

STATUS_PEERS_STEP = 0.25
"""The fraction of the written `peers` a cohort must grow or shrink by before it alone is worth a write
(and any move across `MIN_PEERS`): one peer's agent going stale and back is no news."""


def _peers_moved(written: object, desired: float) -> bool:
    if isinstance(written, bool) or not isinstance(written, int):
        return True
    if (written < straggler_stats.MIN_PEERS) != (desired < straggler_stats.MIN_PEERS):
        return True
    return desired != written and abs(desired - written) >= STATUS_PEERS_STEP * written


def _moved(current: object, desired: Mapping[str, float]) -> bool:
    if not isinstance(current, dict) or _peers_moved(current.get("peers"), desired["peers"]):
        return True
    for key, step in STATUS_STEPS.items():
        written = current.get(key)
        if isinstance(written, bool) or not isinstance(written, int | float):
            return True
        if abs(float(desired[key]) - float(written)) >= step:
            return True
    return False
