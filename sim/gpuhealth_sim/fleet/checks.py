"""The simulated node's side of active checks: how a check pod ends, as the scenario's `checks:` says.

On the local control plane no kubelet runs a check's container. `decide` gives the end of one check pod
(attempts counted per node and template, as repairs count theirs) as a `repairs.Outcome`, which
`repairs.terminal_status` writes as a kubelet would: `pass` exits 0, `fail` exits 1, figures exit 0 with
the JSON object of the figures as the termination message, which the operator reads
(`decisions.checks.figures_of`). Preemption is not scripted: kube-scheduler preempts a check pod for a
workload that wants its GPUs. Pure; the executor that polls for check pods and ends them is still to come.
"""

from __future__ import annotations

import json

from gpuhealth_agent import scenario
from gpuhealth_sim.fleet import repairs


def decide(checks: scenario.Checks, template: str, attempt: int) -> repairs.Outcome:
    """The end of attempt `attempt` (0: the node's first) of a check pod from template `template`."""
    said = checks.outcome(template, attempt)
    if not said.passed:
        return repairs.Outcome(False, 1, f"simulated check {template} failed")
    if said.figures:
        return repairs.Outcome(True, 0, json.dumps(dict(said.figures), sort_keys=True))
    return repairs.Outcome(True, 0, "")
