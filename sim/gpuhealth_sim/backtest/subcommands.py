"""The `record`, `trace generate` and `backtest` subcommands of gpu-health-sim: arguments, run, report.

gpu-health-sim record --kubeconfig K --out TRACE [--max-seconds S] [--max-bytes B]
gpu-health-sim trace generate --node-days N --seed S --out TRACE [--nodes K] [--sample-seconds P]
    [--heartbeat-seconds H]
gpu-health-sim trace import --prometheus URL --since 14d [--step 60s] --out TRACE
gpu-health-sim backtest --policy P.yaml [--policy Q.yaml] --trace TRACE [--score] [-o json]

Each command imports the modules it runs (the Kubernetes client, the agent, the operator) when it runs:
building gpu-health-sim's parser, for `--version` or another command, costs none of them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import pathlib
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from gpuhealth_api import heartbeats, keys, timestamps
from gpuhealth_sim.backtest import defaults, http_auth, progress, traces

if TYPE_CHECKING:
    from kubernetes import client

    from gpuhealth_sim.backtest import replayer, tracerecord

USAGE_ERROR = 2
INVALID_INPUT = 3
PROGRESS_SECONDS = 5.0
"""At most this often a progress line of `record` and `trace import` on stderr (`--quiet`: none)."""


def add_commands(commands: Any) -> None:
    """Add `record`, `trace` and `backtest` to gpu-health-sim's subcommands."""
    record = commands.add_parser(
        "record",
        help="follow a cluster's Nodes and GPUNodes into a trace, until Ctrl-C or a bound",
        description="Follow the cluster's Nodes, GPUNodes and agent pods (and, where served, the "
        "ResourceSlices and DeviceTaintRules IsolateGPU reads) and append every version to TRACE "
        "(trace format 4, gzip if TRACE ends in .gz), flushed as it goes, until interrupted "
        "(Ctrl-C, SIGTERM) or a bound is reached; the file is complete either way.",
    )
    record.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    record.add_argument("--context", help="kubeconfig context (default: the current one)")
    record.add_argument(
        "--out",
        type=pathlib.Path,
        required=True,
        help="trace file to write; {start} in it is replaced by the UTC start time (20260105T000000Z)",
    )
    record.add_argument("--max-seconds", type=float, help="stop after this many seconds")
    record.add_argument("--max-bytes", type=int, help="stop once the file is this large (checked per record)")
    record.add_argument(
        "--agent-pod-selector",
        default=keys.AGENT_POD_SELECTOR,
        help="label selector of the agents' pods, the operator's --agent-pod-selector (default: the chart's, "
        "%(default)s); an empty one records no pods",
    )
    record.add_argument(
        "--agent-pod-namespace",
        default=defaults.DEFAULT_AGENT_POD_NAMESPACE,
        help="namespace of the agent DaemonSet, the operator's --agent-pod-namespace: a pod the selector "
        "matches elsewhere (a tenant's DaemonSet with the agent's labels) is not recorded "
        "(default: %(default)s, the README's helm install -n; the chart's recorder passes its own)",
    )
    record.add_argument("--quiet", action="store_true", help="no progress on stderr")
    trace = commands.add_parser(
        "trace", help="write synthetic labelled traces, or import one from Prometheus (docs/backtest.md)"
    )
    actions = trace.add_subparsers(dest="trace_command", required=True)
    generate = actions.add_parser(
        "generate",
        help="write a synthetic fleet history with its ground truth",
        description="Write a synthetic labelled fleet trace (JSON Lines, gzip if TRACE ends in .gz).",
    )
    generate.add_argument("--node-days", type=float, required=True, help="node-days of fleet history")
    generate.add_argument("--seed", type=int, default=1, help="random seed (same seed, same trace)")
    generate.add_argument("--out", type=pathlib.Path, required=True, help="trace file to write")
    generate.add_argument("--nodes", type=int, help="fleet size (default: from --node-days, 12 to 100)")
    generate.add_argument(
        "--sample-seconds",
        type=float,
        default=60.0,
        help="how often each node's facts are sampled (default 60)",
    )
    generate.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=float(heartbeats.DEFAULT_HEARTBEAT_SECONDS),
        help="the agent writes a sample on a significant change or after this long without a write "
        f"(default {heartbeats.DEFAULT_HEARTBEAT_SECONDS}, the agent's); 0: every sample",
    )
    generate.add_argument(
        "--node-faults",
        action="store_true",
        help="also NVLink, fabric, NIC and PCIe AER facts and faults, and memory failures preceded by "
        "growing corrected errors (issue 27; off: the trace the seed always wrote)",
    )
    generate.add_argument(
        "--creeping-counters",
        action="store_true",
        help="PCIe AER correctable errors and NVLink CRC counts creeping up slowly on most nodes, below "
        "any rule's rate, as real fleets' do (issue 52: the replay's hard case; off: the seed's old trace)",
    )
    add_import(actions)

    replay = commands.add_parser(
        "backtest",
        help="replay a trace through the operator's own code under a policy",
        description="Replay a trace under each policy with a simulated clock and cluster; print what "
        "the operator would have done, and with --score how that compares with the trace's truth.",
    )
    replay.add_argument("--policy", type=pathlib.Path, action="append", required=True, help="policy YAML")
    replay.add_argument("--trace", type=pathlib.Path, required=True, help="trace file")
    replay.add_argument("--score", action="store_true", help="score against the trace's truth records")
    replay.add_argument("-o", "--output", choices=["text", "json"], default="text")
    replay.add_argument(
        "--tick-seconds", type=float, default=30.0, help="simulated seconds between timer passes (default 30)"
    )


def add_import(actions: Any) -> None:
    """`trace import`: a trace from the agent's (or dcgm-exporter's) series in Prometheus."""
    imported = actions.add_parser(
        "import",
        help="build a trace from the series Prometheus holds (backtest without having recorded)",
        description="Read the agent's per-GPU series (or dcgm-exporter's) from Prometheus' HTTP API at every "
        "--step over the window and write a trace of each node's GPUNode facts (no agent pods, no ground "
        'truth; docs/backtest.md, "From Prometheus").',
    )
    imported.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus' base URL")
    imported.add_argument("--out", type=pathlib.Path, required=True, help="trace file to write")
    imported.add_argument("--since", default="7d", help="window length before --until (default 7d; e.g. 14d)")
    imported.add_argument("--until", help="window end: epoch seconds or RFC 3339 (default: now)")
    imported.add_argument(
        "--step", default="60s", help="sampling resolution: one value per series per step (default 60s)"
    )
    imported.add_argument(
        "--source",
        choices=[defaults.AGENT, defaults.DCGM],
        default=defaults.AGENT,
        help="whose series: the gpu-health agent's (default) or dcgm-exporter's (DCGM_FI_DEV_*)",
    )
    imported.add_argument("--selector", default="", help='extra label matchers for every query, e.g. job="x"')
    imported.add_argument(
        "--node-label",
        help=f"label naming a series' node (default: first of {', '.join(defaults.NODE_LABELS)})",
    )
    imported.add_argument(
        "--node-labels",
        default="",
        help="labels every imported Node gets, K=V,... (so a policy's nodeSelector selects them)",
    )
    imported.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=float(heartbeats.DEFAULT_HEARTBEAT_SECONDS),
        help="write a status on a significant change or after this long, as the agent does "
        f"(default {heartbeats.DEFAULT_HEARTBEAT_SECONDS}); 0: every step",
    )
    imported.add_argument("--quiet", action="store_true", help="no progress on stderr")
    auth = imported.add_argument_group(
        "authentication", "for managed Prometheus services and authenticating proxies; secrets from files"
    )
    auth.add_argument(
        "--bearer-token-file", metavar="FILE", help="send Authorization: Bearer <its first line>"
    )
    auth.add_argument("--basic-auth-user", metavar="USER", help="send basic auth as USER")
    auth.add_argument(
        "--basic-auth-password-file", metavar="FILE", help="basic auth's password: its first line"
    )
    auth.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an extra header on every request, e.g. 'X-Scope-OrgID: team-a' (repeatable)",
    )
    auth.add_argument("--ca-file", metavar="FILE", help="PEM CA bundle that signed Prometheus' certificate")
    auth.add_argument("--cert-file", metavar="FILE", help="PEM client certificate for mutual TLS")
    auth.add_argument("--key-file", metavar="FILE", help="PEM key of --cert-file (if not in it)")


def run(args: argparse.Namespace) -> int:
    if args.command == "record":
        return _record(args)
    if args.command == "trace" and args.trace_command == "import":
        return _import(args)
    if args.command == "trace":
        return _generate(args)
    return _backtest(args)


def _record(args: argparse.Namespace) -> int:
    if (args.max_seconds is not None and args.max_seconds <= 0) or (
        args.max_bytes is not None and args.max_bytes <= 0
    ):
        print("gpu-health-sim: --max-seconds and --max-bytes must be positive", file=sys.stderr)
        return USAGE_ERROR
    from gpuhealth_sim.controlplane import kubeconfigs  # noqa: PLC0415 - only `record` reads a kubeconfig

    if args.kubeconfig and (problem := kubeconfigs.unusable(args.kubeconfig, args.context)) is not None:
        print(f"gpu-health-sim: cannot load the {problem}", file=sys.stderr)  # one line, no traceback
        return USAGE_ERROR
    import yaml  # noqa: PLC0415
    from kubernetes import client, config  # noqa: PLC0415 - only `record` needs the Kubernetes client

    from gpuhealth_sim.backtest import tracerecord  # noqa: PLC0415

    configuration = client.Configuration()
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=args.kubeconfig, context=args.context, client_configuration=configuration
        )
    except (OSError, yaml.YAMLError, config.ConfigException) as error:
        if not _in_cluster(args, configuration):
            problem = kubeconfigs.unusable(args.kubeconfig, args.context)
            said = f"the {problem}" if problem else f"the kubeconfig: {' '.join(str(error).split())}"
            print(f"gpu-health-sim: cannot load {said}", file=sys.stderr)
            return USAGE_ERROR
    # `{start}` in --out: the recording's start (the chart's recorder names each file so).
    args.out = pathlib.Path(str(args.out).replace("{start}", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())))
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    api = client.ApiClient(configuration)
    try:
        recorder = tracerecord.Recorder(
            api,
            args.out,
            max_seconds=args.max_seconds,
            max_bytes=args.max_bytes,
            agent_pod_selector=args.agent_pod_selector,
            agent_pod_namespace=args.agent_pod_namespace,
        ).start()
        print(f"recording to {args.out} (Ctrl-C stops)", file=sys.stderr, flush=True)
        for warning in recorder.warnings:
            print(f"gpu-health-sim: warning: {warning}", file=sys.stderr, flush=True)
        if not args.quiet:
            _report_progress(recorder, args.max_seconds)
        recorder.wait(stop)
    except OSError as error:
        print(f"gpu-health-sim: {args.out}: {error.strerror or error}", file=sys.stderr)
        return INVALID_INPUT
    except tracerecord.RecordError as error:
        print(f"gpu-health-sim: {error}", file=sys.stderr)
        return INVALID_INPUT
    finally:
        api.close()  # type: ignore[no-untyped-call]
        for number, handler in previous.items():
            signal.signal(number, handler)
    print(f"{args.out}: {recorder.records} records ({recorder.reason})")
    return 0


def _in_cluster(args: argparse.Namespace, configuration: client.Configuration) -> bool:
    """In a pod and given no kubeconfig: its service account's credentials (the chart's recorder)."""
    if args.kubeconfig or os.environ.get("KUBECONFIG") or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return False
    from kubernetes import config  # noqa: PLC0415 - imported by `_record` already

    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        return False
    return True


def _report_progress(recorder: tracerecord.Recorder, max_seconds: float | None) -> None:
    """Records written and time covered on stderr, every few seconds until the recording ends."""
    shown = progress.Progress(every_seconds=PROGRESS_SECONDS)

    def report() -> None:
        while not recorder.done.wait(1.0):
            shown.update(recorder.records, time.time() - recorder.started_at, max_seconds)

    threading.Thread(target=report, name="record-progress", daemon=True).start()


def _window(args: argparse.Namespace) -> tuple[float, float, float, dict[str, str]] | str:
    """(start, end, step, node labels) of `trace import`, or what is wrong with its flags."""
    from gpuhealth_sim.backtest import prometheus_import  # noqa: PLC0415 - imports the agent

    try:
        since = prometheus_import.parse_duration(args.since)
        step = prometheus_import.parse_duration(args.step)
    except ValueError as error:
        return f"--since/--step: {error}"
    end = time.time()
    if args.until is not None:
        try:
            end = float(args.until)
        except ValueError:
            try:
                end = timestamps.parse(args.until)
            except ValueError:
                return f"--until: not epoch seconds or an RFC 3339 time: {args.until!r}"
    if not math.isfinite(end) or end - since < 0:
        return f"--until {args.until} with --since {args.since} starts before 1970"
    if not (math.isfinite(args.heartbeat_seconds) and args.heartbeat_seconds >= 0):
        return "--heartbeat-seconds must be 0 or more"
    labels: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in args.node_labels.split(","))):
        key, equals, value = item.partition("=")
        if not equals or not key:
            return f"--node-labels: {item!r} is not KEY=VALUE"
        labels[key] = value
    return end - since, end, step, labels


def _import(args: argparse.Namespace) -> int:
    from gpuhealth_sim.backtest import prometheus_import  # noqa: PLC0415 - imports the agent

    window = _window(args)
    if isinstance(window, str):
        print(f"gpu-health-sim: {window}", file=sys.stderr)
        return USAGE_ERROR
    start, end, step, labels = window
    try:
        auth = http_auth.from_flags(
            bearer_token_file=args.bearer_token_file,
            basic_auth_user=args.basic_auth_user,
            basic_auth_password_file=args.basic_auth_password_file,
            headers=args.header,
            ca_file=args.ca_file,
            cert_file=args.cert_file,
            key_file=args.key_file,
        )
    except http_auth.AuthError as error:
        print(f"gpu-health-sim: {error}", file=sys.stderr)
        return USAGE_ERROR
    options = prometheus_import.Options(
        url=args.prometheus,
        start=start,
        end=end,
        step=step,
        source=args.source,
        selector=args.selector,
        node_label=args.node_label,
        node_labels=labels,
        heartbeat_seconds=args.heartbeat_seconds,
    )
    shown = None if args.quiet else progress.Progress(every_seconds=PROGRESS_SECONDS)
    try:
        counts = prometheus_import.run(
            options, args.out, prometheus_import.HttpFetch(args.prometheus, auth=auth), shown
        )
    except prometheus_import.PrometheusError as error:
        print(f"gpu-health-sim: {error}", file=sys.stderr)
        return INVALID_INPUT
    except OSError as error:
        print(f"gpu-health-sim: cannot write {args.out}: {error.strerror or error}", file=sys.stderr)
        return INVALID_INPUT
    print(
        f"{args.out}: {counts.nodes} nodes, {counts.records} records, {counts.steps} steps of {step:g}s "
        f"from {timestamps.rfc3339(start)} ({counts.queries} queries)"
    )
    return 0


def _positive(value: float) -> bool:
    """A finite number above 0 (NaN compares false to everything, so `value <= 0` lets it through)."""
    return math.isfinite(value) and value > 0


def _generate(args: argparse.Namespace) -> int:
    if (
        not _positive(args.node_days)
        or not _positive(args.sample_seconds)
        or (args.nodes is not None and args.nodes < 1)
    ):
        print("gpu-health-sim: --node-days, --sample-seconds and --nodes must be positive", file=sys.stderr)
        return USAGE_ERROR
    if not (math.isfinite(args.heartbeat_seconds) and args.heartbeat_seconds >= 0):
        print("gpu-health-sim: --heartbeat-seconds must be 0 or more", file=sys.stderr)
        return USAGE_ERROR
    from gpuhealth_sim.backtest import tracegen  # noqa: PLC0415 - imports the agent

    options = tracegen.Options(
        args.node_days,
        args.seed,
        args.nodes,
        args.sample_seconds,
        args.heartbeat_seconds,
        args.node_faults,
        creeping_counters=args.creeping_counters,
    )
    try:
        counts = tracegen.generate(options, args.out)
    except OSError as error:  # a missing directory, a directory, no permission, a full disk
        print(f"gpu-health-sim: cannot write {args.out}: {error.strerror or error}", file=sys.stderr)
        return INVALID_INPUT
    print(
        f"{args.out}: {counts['nodes']} nodes, {counts['records']} records, {counts['truth']} truth records"
    )
    return 0


def replay(
    trace: pathlib.Path, policy: dict[str, Any], tick_seconds: float, score: bool, baseline: bool
) -> tuple[replayer.Result, dict[str, Any] | None]:
    """One policy's backtest of `trace`, and its score if asked (with the baseline rule's beside it)."""
    from gpuhealth_sim.backtest import replayer, scoring  # noqa: PLC0415 - import the operator

    result = replayer.run(trace, policy, tick_seconds)
    return result, scoring.score(trace, result, baseline=baseline) if score else None


def replay_all(
    trace: pathlib.Path, policies: list[dict[str, Any]], tick_seconds: float, score: bool
) -> list[tuple[replayer.Result, dict[str, Any] | None]]:
    """Every policy's backtest, in order. Replays share nothing, so with more than one policy each
    runs in its own process, as many at once as there are CPUs: comparing a policy with the one it
    would replace takes the time of one replay on two cores."""
    jobs = [(trace, p, tick_seconds, score, i == 0) for i, p in enumerate(policies)]
    workers = min(len(jobs), len(os.sched_getaffinity(0)))  # the CPUs this process may use
    if len(jobs) < 2:
        return [replay(*job) for job in jobs]
    # Spawned, not forked: a fork of a process with threads may copy a held lock.
    spawn = multiprocessing.get_context("spawn")
    # One task per process (max_tasks_per_child=1): each candidate is its own world even where there are
    # fewer CPUs than candidates, so no module-level cache of one replay can reach another.
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn, max_tasks_per_child=1) as pool:
        return list(pool.map(replay, *zip(*jobs, strict=True)))


def _backtest(args: argparse.Namespace) -> int:
    if not _positive(args.tick_seconds):  # 0 would never advance the simulated clock: a hang
        print(
            f"gpu-health-sim: --tick-seconds must be a positive number of seconds, not {args.tick_seconds:g}",
            file=sys.stderr,
        )
        return USAGE_ERROR
    from gpuhealth_sim.backtest import compare, replayer  # noqa: PLC0415 - imports the operator

    try:
        policies = [replayer.load_policy(p) for p in args.policy]
        if args.score and not traces.has_truth(args.trace):
            print(
                f"gpu-health-sim: {args.trace} holds no ground truth (`truth` records), so --score has "
                "nothing to score against: a recorded trace has none (the report without --score says what "
                "each policy would have done); `trace generate` and the demo write it",
                file=sys.stderr,
            )
            return USAGE_ERROR
        replayed = replay_all(args.trace, policies, args.tick_seconds, args.score)
    except (traces.TraceError, replayer.PolicyError) as error:
        print(f"gpu-health-sim: {error}", file=sys.stderr)
        return INVALID_INPUT
    if args.output == "json":
        out: list[dict[str, Any]] = []
        for result, score in replayed:
            item = result.to_json()
            if score is not None:
                item["score"] = score
            out.append(item)
        report: dict[str, Any] = {"trace": str(args.trace), "policies": out}
        if len(replayed) > 1:
            report["comparison"] = compare.compare(replayed)
        print(json.dumps(report, indent=1))
        return 0
    for result, score in replayed:
        print_text(result, score)
    if len(replayed) > 1:
        print("\n".join(compare.text(compare.compare(replayed), _clock)))
    return 0


def print_text(result: replayer.Result, score: dict[str, Any] | None) -> None:
    from gpuhealth_sim.backtest import compare, replayer  # noqa: PLC0415 - imported by whoever made `result`

    summary = result.summary()
    mode = "dry run" if result.dry_run else "acting"
    print(
        f"== policy {result.policy} ({mode}) selects {summary['selectedNodes']} of {summary['nodes']} nodes, "
        f"{summary['selectedNodeDays']} of {summary['nodeDays']} node-days"
    )
    per_node: dict[str, list[replayer.Action]] = {}
    for action in result.actions:
        if not action.action.startswith("Label health="):
            per_node.setdefault(action.node, []).append(action)
    for t, node in result.deleted_nodes:  # not the policy's doing, but why its actions stop there
        if node in result.selected:
            per_node.setdefault(node, []).append(replayer.Action(t, node, "(Node deleted)", ""))
    for node in sorted(per_node):
        print(f"  {node}")
        for action in sorted(per_node[node], key=lambda a: a.t):
            reason = f" ({action.reason})" if action.reason else ""
            print(f"    {_clock(action.t)}  {action.action}{reason}")
    print(
        f"  fleet: most nodes unschedulable at once {summary['maxUnschedulable']} "
        f"(by this policy {summary['maxCordonedByPolicy']}, maxUnavailable {summary['maxUnavailable']}); "
        f"left Pending {_named(summary['pendingNodes'])}; GPU-hours out of service "
        f"{summary['gpuHoursOutOfService']}; label flaps {summary['labelFlaps']}; "
        f"replayed in {summary['replaySeconds']}s"
    )
    opened = compare.breaker_openings(result)
    if opened:  # a fault storm paused new disruptions: why later faults were left alone
        print(f"  breaker opened at {', '.join(_clock(t) for t in opened)} (RemediationPaused)")
    if score is not None:
        print("  " + score_line(score))


def _named(nodes: list[str], most: int = 20) -> str:
    """`3 (n1, n2, n3)`: how many, and which (the first `most` of a long list)."""
    if not nodes:
        return "0"
    more = f", … {len(nodes) - most} more" if len(nodes) > most else ""
    return f"{len(nodes)} ({', '.join(nodes[:most])}{more})"


def score_line(score: dict[str, Any]) -> str:
    fatal, ours = score["fatal"], score["stragglers"]
    line = (
        f"score: fatal recall {_pct(fatal['recall'])} ({fatal['acted']}/{fatal['faults']}), "
        f"fault→action p50 {_secs(fatal['secondsToActionP50'])} p99 {_secs(fatal['secondsToActionP99'])}, "
        f"false disruptive {fatal['falseDisruptive']}, stragglers precision {_pct(ours['precision'])} "
        f"recall {_pct(ours['recall'])}, flaps/node-day {score['labelFlapsPerNodeDay']}, "
        f"maxUnavailable {'kept' if score['maxUnavailableRespected'] else 'EXCEEDED'}"
    )
    early = score.get("earlyWarnings") or {}
    degraded = early.get("degradedEpisodes") or {}
    if early.get("withWarningPhase") or any(d["episodes"] for d in degraded.values()):
        # A trace with issue 27's faults (`trace generate --node-faults`): how early memory failed.
        line += (
            f", fatal memory faults warned by MemoryDegrading {early['warned']}/{early['memoryFaults']} "
            f"(of those with a warning phase {early['withWarningPhaseWarned']}/{early['withWarningPhase']}, "
            f"median lead {_secs(early['leadSecondsP50'])})"
        )
        line += "".join(f", {k} episodes found {d['found']}/{d['episodes']}" for k, d in degraded.items())
    base = score.get("baselineStragglers")
    if base is not None:
        line += (
            f"; baseline rule (CV>0.1): precision {_pct(base['precision'])} recall {_pct(base['recall'])} "
            f"({base['flags']} flags, {base.get('explainedFlags', 0)} of them wrong while thermal or power "
            "slowed the node)"
        )
    return line


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}s"


def _clock(t: float) -> str:
    days, rest = divmod(int(t), 86_400)
    hours, rest = divmod(rest, 3600)
    return f"d{days} {hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
