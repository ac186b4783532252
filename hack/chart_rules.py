"""Render the chart's PrometheusRule as a plain Prometheus rules file, and check it with promtool.

The chart ships its alerts and recording rules inside a Prometheus Operator
`PrometheusRule`; Prometheus itself (and `promtool`) read the same groups
from a rules file. This renders the chart with the real helm and writes the
PrometheusRule's `spec` as that file, so `promtool check rules`, the
`promtool test rules` unit tests (tests/promtool/) and the end-to-end test
with a real Prometheus all read the rules exactly as the chart renders them.

    python hack/chart_rules.py --helm HELM [--set key=value ...] [-o rules.yaml] [--check]

Without `--set`, the chart is rendered with ci/monitoring-values.yaml (the
ServiceMonitors give the agent's scrape job its name). `--check` runs
`promtool check rules` on the result and exits with its status.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gpu-health"
VALUES = CHART / "ci" / "monitoring-values.yaml"
RELEASE = "gpu-health"
NAMESPACE = "gpu-health"
KUBE_VERSION = "1.36.0"


def template(
    helm: pathlib.Path, set_values: Sequence[str] = (), release: str = RELEASE
) -> list[dict[str, Any]]:
    """Every object `helm template` renders from the chart with ci/monitoring-values.yaml and `set_values`."""
    args = [str(helm), "template", release, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", KUBE_VERSION, "-f", str(VALUES)]
    for value in set_values:
        args += ["--set", value]
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{out.stderr}")
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def render(helm: pathlib.Path, set_values: Sequence[str] = (), release: str = RELEASE) -> dict[str, Any]:
    """The rules file (`{"groups": [...]}`) of the chart's PrometheusRule, rendered by `helm template`."""
    rules = [doc for doc in template(helm, set_values, release) if doc.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        raise RuntimeError(f"expected one PrometheusRule in the rendered chart, found {len(rules)}")
    return {"groups": rules[0]["spec"]["groups"]}


def check(path: pathlib.Path, promtool: str = "promtool") -> subprocess.CompletedProcess[str]:
    """`promtool check rules PATH` (raises FileNotFoundError when promtool is not installed)."""
    args = [promtool, "check", "rules", str(path)]
    return subprocess.run(args, capture_output=True, text=True, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--helm", required=True, type=pathlib.Path, help="the helm binary")
    parser.add_argument("--set", dest="set_values", action="append", default=[], help="a chart value")
    parser.add_argument("-o", "--output", type=pathlib.Path, help="rules file to write (default: stdout)")
    parser.add_argument("--check", action="store_true", help="run `promtool check rules` on the result")
    args = parser.parse_args(argv)
    text = yaml.safe_dump(render(args.helm, args.set_values), sort_keys=False)
    if args.check:
        if shutil.which("promtool") is None:
            print("promtool not found: apt-get install prometheus (Debian) puts it on PATH", file=sys.stderr)
            return 1
        with tempfile.TemporaryDirectory() as tmp:
            path = args.output or pathlib.Path(tmp) / "gpu-health.rules.yaml"
            path.write_text(text)
            result = check(path)
        print(result.stdout + result.stderr, end="")
        return result.returncode
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
