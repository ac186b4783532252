"""`kubectl-gpuhealth`: the command line. Exit codes: 0 done (`check`: passed), 1 not found, refused or not
passed, 2 usage, 3 no cluster.

kubectl runs any `kubectl-<name>` on PATH as `kubectl <name>`, so this is
`kubectl gpuhealth status` once the distribution is installed (or through krew).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuhealth_api import __version__, keys, timestamps, vocabulary
from gpuhealth_kubectl import checkcmd, checkviews, cluster, completion, views, watch
from gpuhealth_operator.decisions import drill as drills

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class Failed(Exception):
    """The command cannot do what was asked (a missing object, a refused request): one line, exit 1."""


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a flag given before the command is not reset by the command's own default.
    common.add_argument(
        "--kubeconfig",
        default=argparse.SUPPRESS,
        help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)",
    )
    common.add_argument(
        "--context",
        default=argparse.SUPPRESS,
        help="the kubeconfig context to use (default: its current one)",
    )
    common.add_argument(
        "--as",
        dest="as_user",
        metavar="USER",
        default=argparse.SUPPRESS,
        help="act as this user (impersonation, as kubectl --as): try what an on-call role allows",
    )
    common.add_argument(
        "--as-group",
        metavar="GROUP",
        default=argparse.SUPPRESS,
        help="act as a member of this group (with --as; one group)",
    )
    common.add_argument(
        "-o", "--output", choices=completion.OUTPUTS, default=argparse.SUPPRESS, help="text (default) or json"
    )
    top = argparse.ArgumentParser(
        prog="kubectl gpuhealth",
        parents=[common],
        description="gpu-health day 2: the fleet at a glance, why a node was acted on, drills, pausing.",
    )
    top.add_argument("--version", action="version", version=f"kubectl-gpuhealth {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = commands.add_parser(
        "status",
        parents=[common],
        help="the fleet at a glance: health per policy, budgets, breakers, nodes acted on",
    )
    status.add_argument(
        "-w", "--watch", action="store_true", help="poll and redraw on each change until Ctrl-C"
    )
    status.add_argument(
        "--interval",
        type=watch.interval,
        default=watch.DEFAULT_INTERVAL,
        help=f"seconds between polls with --watch (default {watch.DEFAULT_INTERVAL:g})",
    )
    # Hidden: stop after this many draws (tests and scripts; a person presses Ctrl-C).
    status.add_argument("--watch-count", type=int, default=None, help=argparse.SUPPRESS)
    why = commands.add_parser(
        "why",
        parents=[common],
        help="why a node is where it is: facts, conditions, the rule that fired, the action, its Events",
    )
    why.add_argument("node", metavar="NODE")
    drill = commands.add_parser(
        "drill",
        parents=[common],
        help="start (or --stop) a fire drill on a node: the whole decision path, said and not done",
    )
    drill.add_argument("node", metavar="NODE")
    drill.add_argument(
        "condition", metavar="CONDITION", nargs="?", help="one of: " + ", ".join(drills.valid_conditions())
    )
    drill.add_argument("--ttl", help='how long it lasts ("600", "10m", "1h"; default 10m, at most 24h)')
    drill.add_argument("--stop", action="store_true", help="end the node's drill now")
    pause = commands.add_parser(
        "pause",
        parents=[common],
        help="emergency stop of a policy: spec.dryRun=true (running drains stop, cordons stay)",
    )
    pause.add_argument("policy", metavar="POLICY")
    resume = commands.add_parser(
        "resume",
        parents=[common],
        help="let a policy act again: spec.dryRun=false, or reset its open circuit breaker",
    )
    resume.add_argument("policy", metavar="POLICY")
    checkcmd.add_parser(commands, common)
    shell = commands.add_parser(
        "completion", help="print a shell completion script: source <(kubectl-gpuhealth completion bash)"
    )
    shell.add_argument("shell", choices=completion.SHELLS)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["__complete"]:
        return _complete(words[1:])
    args = parser().parse_args(words)
    if args.command == "completion":
        print(completion.SCRIPTS[args.shell], end="")
        return 0
    if args.command == "drill" and not args.stop and not args.condition:
        print("kubectl gpuhealth drill: error: CONDITION is required (or --stop)", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "as_group", None) and not getattr(args, "as_user", None):
        print("kubectl gpuhealth: error: --as-group needs --as", file=sys.stderr)
        return EXIT_USAGE
    output = getattr(args, "output", "text")
    try:
        kube = cluster.Cluster(
            getattr(args, "kubeconfig", None),
            getattr(args, "context", None),
            as_user=getattr(args, "as_user", None),
            as_group=getattr(args, "as_group", None),
        )
    except cluster.Unreachable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    code = 0
    try:
        if args.command == "check":
            (report, text), code = checkcmd.run_check(kube, args)
        else:
            report, text = COMMANDS[args.command](kube, args)
        if args.command == "status" and args.watch:
            _watch(kube, args, output, (report, text))
            return 0
    except cluster.Unreachable as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except (Failed, checkcmd.Refused, checkcmd.NoResult, cluster.NotFound, cluster.ApiError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        kube.close()
    print(
        json.dumps(report, indent=2, sort_keys=True, default=str) if output == "json" else text,
        end="" if output != "json" else "\n",
    )
    return code


Result = tuple[dict[str, Any], str]


def _watch(kube: cluster.Cluster, args: argparse.Namespace, output: str, first: Result) -> None:
    """`status --watch`: the first poll's error ended the command already (exit code as usual); a
    later one (an API server restarting) is drawn as the screen and polled again."""
    pending: list[Result] = [first]

    def poll() -> tuple[str, str]:
        try:
            report, text = pending.pop() if pending else run_status(kube, args)
        except (cluster.Unreachable, cluster.ApiError, cluster.NotFound) as error:
            return f"error: {error}", f"error: {error}\n"
        data = json.dumps(report, sort_keys=True, default=str)
        return data, (data + "\n" if output == "json" else text)

    watch.watch(
        poll,
        interval=args.interval,
        count=args.watch_count,
        sleep=time.sleep,
        out=sys.stdout,
        tty=output != "json" and sys.stdout.isatty(),
        header=output != "json",
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def run_status(kube: cluster.Cluster, _: argparse.Namespace) -> Result:
    policy_bodies, gpunodes, nodes, now = kube.policies(), kube.gpunodes(), kube.nodes(), _now()
    report = views.status_report(policy_bodies, gpunodes, nodes, now)
    text = views.render_status(report, now)
    if checkviews.has_checks(policy_bodies):  # a fleet without active checks sees no word of them
        overdue = checkviews.overdue(policy_bodies, gpunodes, nodes, now)
        report["checks"] = {"overdue": overdue, "overdueNodes": len({o["node"] for o in overdue})}
        lines = [f"Checks overdue (no pass within everySeconds): {report['checks']['overdueNodes']} nodes"]
        text += "\n" + "\n".join([*lines, *checkviews.render_overdue(overdue, now)]) + "\n"
    return report, text


def run_why(kube: cluster.Cluster, args: argparse.Namespace) -> Result:
    node, gpunode = kube.node(args.node), kube.gpunode(args.node)
    if node is None and gpunode is None:
        raise Failed(f"no Node and no GPUNode named {args.node!r}")
    now = _now()
    policy_bodies = kube.policies()
    report = views.why_report(
        args.node, node, gpunode, policy_bodies=policy_bodies, events=kube.events(args.node), now=now
    )
    text = views.render_why(report, now)
    history = checkviews.history(gpunode or {})
    if history or checkviews.has_checks(policy_bodies):
        overdue = checkviews.overdue(policy_bodies, [gpunode] if gpunode else [], [node] if node else [], now)
        report["checks"] = {"history": history, "overdue": overdue}
        lines = ["", f"Active checks (last {checkviews.PER_CHECK} runs of each, newest first):"]
        lines += checkviews.render_history(history, now)
        lines += [
            f"  overdue: {o['check']} (policy {o['policy']}) for {views.age(o['since'], now)}"
            for o in overdue
        ]
        text += "\n".join(lines) + "\n"
    return report, text


def run_drill(kube: cluster.Cluster, args: argparse.Namespace) -> Result:
    node = args.node
    if kube.gpunode(node) is None:
        raise Failed(f"no GPUNode named {node!r}: a drill needs a node an agent reports on")
    if args.stop:
        kube.annotate_gpunode(node, {keys.DRILL_ANNOTATION: None, keys.DRILL_TTL_ANNOTATION: None})
        return {
            "node": node,
            "drill": None,
        }, f"Drill on {node} ended (annotation {keys.DRILL_ANNOTATION} removed).\n"
    condition = _condition(args.condition)
    annotations: dict[str, str | None] = {keys.DRILL_ANNOTATION: condition}
    if args.ttl is not None:
        try:
            drills.parse_ttl(args.ttl)
        except drills.DrillError as error:
            raise Failed(str(error)) from error
        annotations[keys.DRILL_TTL_ANNOTATION] = args.ttl
    kube.annotate_gpunode(node, annotations)
    ttl = args.ttl or "10m"
    text = (
        f"Drill {condition} requested on {node} for {ttl} (annotation {keys.DRILL_ANNOTATION}).\n"
        "The operator says what each policy would do in Drill Events; nothing on the Node changes.\n"
        f"  watch: kubectl gpuhealth why {node}\n"
        f"  stop:  kubectl gpuhealth drill {node} --stop\n"
    )
    return {"node": node, "drill": {"condition": condition, "ttl": ttl}}, text


def _condition(text: str) -> str:
    """The condition as the operator spells it (case-insensitive), else a Failed naming the valid ones."""
    for condition in vocabulary.Condition:
        if condition.value.lower() == text.lower():
            return condition.value
    raise Failed(f"unknown condition {text!r}: one of {', '.join(drills.valid_conditions())}")


def run_pause(kube: cluster.Cluster, args: argparse.Namespace) -> Result:
    """The documented emergency stop of a whole policy (docs/operations.md): `spec.dryRun: true`."""
    name = args.policy
    policy = kube.policy(name)
    if (policy.get("spec") or {}).get("dryRun"):
        return {
            "policy": name,
            "changed": [],
            "dryRun": True,
        }, f"Policy {name} is already paused (spec.dryRun: true).\n"
    kube.patch_policy(name, {"spec": {"dryRun": True}})
    text = (
        f"Policy {name} paused: spec.dryRun=true.\n"
        "It still judges its nodes and says what it would do (DryRun Events), but changes no Node:\n"
        "running drains stop within 2 s, cordons stay (and keep their budget place).\n"
        f"  resume: kubectl gpuhealth resume {name}\n"
    )
    return {"policy": name, "changed": ["spec.dryRun=true"], "dryRun": True}, text


def run_resume(kube: cluster.Cluster, args: argparse.Namespace) -> Result:
    """Undo `pause` (`spec.dryRun: false`) or close an open breaker (the `breaker-reset` annotation)."""
    name = args.policy
    policy = kube.policy(name)
    changed: list[str] = []
    lines: list[str] = []
    if (policy.get("spec") or {}).get("dryRun"):
        kube.patch_policy(name, {"spec": {"dryRun": False}})
        changed.append("spec.dryRun=false")
        lines.append(
            f"Policy {name} resumed: spec.dryRun=false; it acts again on the faults that still stand."
        )
    else:
        state = views.breaker(policy)
        if state["state"] in {"Open", "HalfOpen"}:
            value = timestamps.rfc3339(time.time())
            kube.patch_policy(name, {"metadata": {"annotations": {keys.BREAKER_RESET_ANNOTATION: value}}})
            changed.append(f"{keys.BREAKER_RESET_ANNOTATION}={value}")
            lines.append(
                f"Policy {name}: its fleet circuit breaker was {state['state']} ({state['message']}).\n"
                f"Reset requested ({keys.BREAKER_RESET_ANNOTATION}={value}): the waiting nodes are admitted "
                "under maxUnavailable as usual; a new storm trips it again."
            )
        else:
            lines.append(f"Policy {name} is acting and its breaker is {state['state']}: nothing to resume.")
    return {"policy": name, "changed": changed}, "\n".join(lines) + "\n"


COMMANDS: dict[str, Callable[[cluster.Cluster, argparse.Namespace], Result]] = {
    "status": run_status,
    "why": run_why,
    "drill": run_drill,
    "pause": run_pause,
    "resume": run_resume,
}


def _complete(words: Sequence[str]) -> int:
    """`__complete WORD...`: one candidate a line for the last word; never an error (it runs on TAB)."""
    kubeconfig = _flag(words, "--kubeconfig")
    context = _flag(words, "--context")

    def names(kind: str) -> list[str]:
        try:
            kube = cluster.Cluster(kubeconfig, context)
        except cluster.Unreachable:
            return []
        try:
            items = kube.gpunodes() if kind == "nodes" else kube.policies()
        except (cluster.Unreachable, cluster.ApiError, cluster.NotFound):
            return []
        finally:
            kube.close()
        return sorted(str((i.get("metadata") or {}).get("name", "")) for i in items)

    for candidate in completion.candidates(words, names):
        print(candidate)
    return 0


def _flag(words: Sequence[str], flag: str) -> str | None:
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(f"{flag}="):
            return word.split("=", 1)[1]
    return None


def kubectl_complete() -> int:
    """`kubectl_complete-gpuhealth WORD...`: kubectl's plugin completion (Cobra's format: candidates, then
    `:4`, "no file completion")."""
    words = sys.argv[1:]
    _complete(words)
    # 0: let the shell complete files (a --kubeconfig value); 4: nothing else to offer.
    print(":0" if len(words) > 1 and words[-2] in {"--kubeconfig"} else ":4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
