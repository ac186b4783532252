"""Label, annotation, taint and condition keys that gpu-health puts on Nodes."""

from typing import Final

PREFIX: Final = "gpuhealth.io"

HEALTH_LABEL: Final = f"{PREFIX}/health"
"""healthy / degraded / unhealthy on every node a policy selects."""

STRAGGLER_LABEL: Final = f"{PREFIX}/straggler"
""""true" while the node is a straggler."""

THERMAL_LABEL: Final = f"{PREFIX}/thermal-throttled"
""""true" while the node is thermally throttled."""

UNHEALTHY_TAINT: Final = f"{PREFIX}/unhealthy"
"""NoSchedule taint for action Taint; its value is the condition."""

CORDONED_BY_ANNOTATION: Final = f"{PREFIX}/cordoned-by"
"""The policy that cordoned the node; only such nodes are ever uncordoned."""

OVERRIDDEN_EVIDENCE_ANNOTATION: Final = f"{PREFIX}/overridden-evidence"
"""JSON: the evidence that stood when someone else uncordoned a node we cordoned; only newer evidence acts."""

DRILL_ANNOTATION: Final = f"{PREFIX}/drill"
"""On a GPUNode: a condition name; the operator runs a fire drill (the whole path as a dry run) for it."""

DRILL_TTL_ANNOTATION: Final = f"{PREFIX}/drill-ttl"
"""On a GPUNode: how long the drill lasts ("600", "600s", "10m", "1h"); 10 minutes when absent."""

DRILL_STARTED_ANNOTATION: Final = f"{PREFIX}/drill-started"
"""On a GPUNode, written by the operator when it first sees a drill: its start (RFC 3339)."""
BREAKER_RESET_ANNOTATION: Final = f"{PREFIX}/breaker-reset"
"""On a GPUHealthPolicy: close its fleet circuit breaker now, once per new value (recorded in its status)."""

EXCLUDE_LABEL: Final = f"{PREFIX}/exclude"
""""true" opts a node out of every policy (maintenance, debugging)."""

DOMAIN_DEGRADED_LABEL: Final = f"{PREFIX}/domain-degraded"
""""true" while the node's topology domain (`spec.topology.domains`) is degraded."""

DOMAIN_DEGRADED_TAINT: Final = DOMAIN_DEGRADED_LABEL
"""NoSchedule taint on a degraded domain's nodes for a domain action Taint (value "true")."""

NODE_CONDITION_TYPE: Final = "GPUHealthy"
"""Node condition with the operator's verdict, for NHC, autoscalers and humans."""

# Labels a real GPU node carries (NVIDIA GPU feature discovery / device plugin).
GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
"""GFD's GPU count: physical GPUs, except on MIG nodes (there: MIG devices with the single strategy)."""
GPU_REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
"""GFD: how many schedulable `nvidia.com/gpu` each physical GPU is shared as (time-slicing, MPS)."""
MIG_STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"
"""GFD: `single` or `mixed` on a node whose GPUs are split into MIG devices (`none` otherwise)."""
GPU_RESOURCE: Final = "nvidia.com/gpu"

# Labels the GPU Operator sets while it works on a node's GPUs (see docs/operations.md, "GPU Operator").
GPU_DRIVER_UPGRADE_STATE_LABEL: Final = "nvidia.com/gpu-driver-upgrade-state"
"""The GPU Operator's driver upgrade controller (k8s-operator-libs): where the node is in the upgrade."""
MIG_CONFIG_STATE_LABEL: Final = "nvidia.com/mig.config.state"
"""mig-manager: `pending`/`rebooting` while it applies `nvidia.com/mig.config`, then `success`/`failed`."""

# On the DeviceTaintRules of IsolateGPU (resource.k8s.io): one rule per isolated GPU.
DEVICE_TAINT: Final = UNHEALTHY_TAINT
"""The device taint's key on an isolated GPU (the same key as the node taint); its value is the condition."""
POLICY_LABEL: Final = f"{PREFIX}/policy"
"""The policy that made the object: `kubectl get devicetaintrules -l gpuhealth.io/policy=P` lists them."""
NODE_LABEL: Final = f"{PREFIX}/node"
"""The node whose GPU a DeviceTaintRule isolates."""
GPU_INDEX_LABEL: Final = f"{PREFIX}/gpu-index"
"""The isolated GPU's index on its node, as NVML numbers it."""
GPU_UUID_LABEL: Final = f"{PREFIX}/gpu-uuid"
"""The isolated GPU's UUID (`GPU-…`, 40 characters, a valid label value)."""

# Repair (`spec.repair`): state that a restarted or new leader resumes from, and the Jobs it runs.
NEEDS_REPAIR_LABEL: Final = f"{PREFIX}/needs-repair"
"""`manual`: repair retired the node; it stays cordoned until a human returns it."""
NEEDS_REPAIR_MANUAL: Final = "manual"
REPAIR_ANNOTATION: Final = f"{PREFIX}/repair"
"""On a Node: JSON of the repair cycle in progress (policy, cycle, step, phase, since, GPUs, bootId);
absent when no repair runs. Written before a step's Job is created, so a new leader derives its name."""
CRDS_VERSION_ANNOTATION: Final = f"{PREFIX}/crds-version"
"""On each of gpu-health's CRDs: the chart version whose manifest `gpu-health-operator apply-crds` last
applied (it applies only over an older one)."""
REPAIR_CYCLES_ANNOTATION: Final = f"{PREFIX}/repair-cycles"
"""On a Node: the repair cycles it started recently, `<cycle>@<RFC 3339 start>` comma-separated, oldest
first, the last 10 (the most `maxAttempts` allows). Written with the cycle's first state, before its first
Job: what maxAttempts counts, across restarts and leaders, apart from the 20-entry `status.repairs[]`."""
REPAIR_WAITING_ANNOTATION: Final = f"{PREFIX}/repair-waiting"
"""On a Node a policy drained: that policy, while its repair waits for a maxConcurrent place and the wait
was said (Event DisruptionBudgetExceeded). A restarted or new leader finds it and does not say it again;
removed when the wait ends (the cycle starts, the fault goes, the node is returned)."""
RELEASE_GPUS_ANNOTATION: Final = f"{PREFIX}/release-gpus"
"""On a GPUNode: set by the operator before a ResetGPU step's Job (value: the repair cycle's start stamp,
`REPAIR_CYCLE_STARTED_ANNOTATION`'s); the agent shuts NVML down and answers with `status.agent.released`
(the same value), and initialises NVML again when it goes (after the Job ended, or at the step's deadline)."""
OPERANDS_PAUSED_ANNOTATION: Final = f"{PREFIX}/operands-paused"
"""On a Node: the GPU Operator operand labels (`GPU_OPERATOR_OPERAND_LABELS`) the operator turned from
"true" to "false" for a reset, comma-separated, written in the same patch as the labels; restored (only
those still "false") and removed when the reset is over, also by a restarted or new leader."""
GPU_OPERATOR_OPERAND_LABELS: Final = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
)
"""The GPU Operator's per-node operand labels whose DaemonSet pods hold the GPU open (device plugin health
checks, the DCGM host engine, dcgm-exporter, GFD). The operator's DaemonSets select `<label>=true`; it
sets a missing label to "true" and honours a value already there (NVIDIA/gpu-operator,
controllers/state_manager.go, `gpuStateLabels`, `addGPUStateLabels`)."""
REPAIR_ACTION_LABEL: Final = f"{PREFIX}/repair-action"
"""On a repair Job and its pods: `ResetGPU`, `RebootNode` or `Validation`."""
REPAIR_CYCLE_LABEL: Final = f"{PREFIX}/repair-cycle"
"""On a repair Job and its pods: the node's repair cycle number."""
REPAIR_CYCLE_STARTED_ANNOTATION: Final = f"{PREFIX}/repair-cycle-started"
"""On a repair Job: when its cycle began (the Node annotation's `started`). A Job of the same name is adopted
only with this cycle's stamp: a recreated GPUNode restarts cycle numbers, and an old Job is not its result."""
REPAIR_TOKEN_ANNOTATION: Final = f"{PREFIX}/repair-token"
"""On a repair Job: a random token made for this Job alone; the Node's repair annotation holds only its
SHA-256 (`jobToken`), written before the Job. A Job of the name is adopted only with a token of that hash:
the name and the cycle stamp are readable on the Node, the token is not until our Job holds the name."""
REPAIR_NODE_UID_LABEL: Final = f"{PREFIX}/repair-node-uid"
"""On a Node while a repair cycle runs on it: the Node's own UID. Every step Job's pod selects it
(nodeSelector), so a kubelet admits the pod only on the Node it was made for: a machine registering
later under the name (a new Node, without the label) refuses it, even while no garbage collector runs."""
# Active checks (`spec.activeChecks`, DESIGN.md "Active checks"): the check Jobs and the on-demand request.
CHECK_LABEL: Final = f"{PREFIX}/check"
"""On a check Job and its pods: the check's name (`spec.activeChecks[].name`, GPUNode `status.checks[].name`).
With POLICY_LABEL and NODE_LABEL: `kubectl get jobs -l gpuhealth.io/check` lists every check in flight."""
CHECK_TEMPLATE_LABEL: Final = f"{PREFIX}/check-template"
"""On a check Job and its pods: the template key it was made from (`DcgmDiagQuick`, `DcgmDiag`, a user's);
the simulated fleet ends the pod as the node scenario's `checks:` says for this template."""
CHECK_NOW_ANNOTATION: Final = f"{PREFIX}/check-now"
"""On a GPUNode: a request to run a check now (`kubectl gpuhealth check NODE`): JSON
`{"id": TOKEN, "check": NAME-OR-TEMPLATE}` (`check` optional: the node's first check). The operator starts
it under every guard of a scheduled check except `everySeconds` (a place under maxConcurrent is waited
for), then removes the annotation; the run carries the token (Job annotation CHECK_REQUEST_ANNOTATION,
GPUNode `status.checks[].requestId`). A request it cannot run is removed with a `CheckRefused` Event whose
message names the token and the reason."""
CHECK_REQUEST_ANNOTATION: Final = f"{PREFIX}/check-request"
"""On a check Job started on request: the request's token (CHECK_NOW_ANNOTATION's `id`)."""
CHECK_GPUS_ANNOTATION: Final = f"{PREFIX}/check-gpus"
"""On the pod of a check that holds its node's GPUs through a DRA claim (no `nvidia.com/gpu` request to
count them by): how many GPU devices the claim holds, for the GPU-hours spent on checks."""
REPAIR_NODE_ENV: Final = "GPUHEALTH_NODE"
"""Environment variable in every container of a repair Job: the node's name."""
REPAIR_GPUS_ENV: Final = "GPUHEALTH_GPU_UUIDS"
"""Environment variable in every container of a repair Job: the step's GPU UUIDs, comma-separated
(all the node's GPUs for RebootNode and Validation), each of NVML's form (`gpu_uuids`). A program reads
it from its environment (`"$GPUHEALTH_GPU_UUIDS"` in a shell), or `$(GPUHEALTH_GPU_UUIDS)` as an argument of
its own, never inside an `sh -c` script's text."""
REPAIR_ACTION_ENV: Final = "GPUHEALTH_REPAIR_ACTION"
REPAIR_HOSTENGINE_ENV: Final = "GPUHEALTH_HOSTENGINE"
"""Environment variable in every container of a Validation Job: the node's running DCGM host engine as
`<IP>:<port>` (the GPU Operator's standalone `nvidia-dcgm`), for `dcgmi diag --host`; empty where the node
runs none, and the template starts its own (DCGM expects one host engine per node)."""
UNVALIDATED_TAINT: Final = f"{PREFIX}/unvalidated"
"""NoSchedule taint on a new node of a policy with `spec.repair.validation.newNodes: true` (a Node created
after the policy, never validated) until its first validation Job passes; it stays on a node that failed."""
VALIDATION_TOKEN_ANNOTATION: Final = f"{PREFIX}/validation-token"
"""On a new Node: the SHA-256 of the token (`REPAIR_TOKEN_ANNOTATION`) its validation Job carries, written
before the Job: a Job of the name is adopted only with that token, never by its name and stamp alone."""
VALIDATED_ANNOTATION: Final = f"{PREFIX}/validated"
"""On a Node: RFC 3339 time its new-node validation passed; such a node is never validated as new again."""
VALIDATION_FAILED_ANNOTATION: Final = f"{PREFIX}/validation-failed"
"""On a Node: RFC 3339 time its new-node validation failed (it stays tainted, needs-repair=manual);
such a node is never validated as new again: a human who removes the taint returns it."""

# The operator's bookkeeping on a Node it cordoned (with CORDONED_BY_ANNOTATION).
DRAIN_STARTED_ANNOTATION: Final = f"{PREFIX}/drain-started"
"""RFC 3339 time our drain of the node began; the drain timeout survives operator restarts."""
CORDONED_AT_ANNOTATION: Final = f"{PREFIX}/cordoned-at"
"""RFC 3339 time of our cordon, written with it: the cordon's identity, which its Events announce once
(and which a human's re-cordon leaves in place)."""

NODE_FLAG_LABELS: Final = (STRAGGLER_LABEL, THERMAL_LABEL)
"""The labels that say "true" while their condition holds (a fired Label-or-stronger rule)."""
OPERATOR_LABELS: Final = (HEALTH_LABEL, *NODE_FLAG_LABELS, DOMAIN_DEGRADED_LABEL)
"""The Node labels the operator owns and sets or removes by itself, in the order reports list them
(not `NEEDS_REPAIR_LABEL`, which a human removes, nor `EXCLUDE_LABEL`, which a human sets)."""

AGENT_POD_SELECTOR: Final = "app.kubernetes.io/name=gpu-health,app.kubernetes.io/component=agent"
"""The agent DaemonSet's pods as the Helm chart labels them (under its default name): the operator's
and `gpu-health-sim record`'s default --agent-pod-selector."""
