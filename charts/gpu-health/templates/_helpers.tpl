{{/*
Names and labels shared by every template. Standard helper names
(name, fullname, chart, labels, selectorLabels, serviceAccountName) so that
readers of other charts find their way; helm.sh/chart and version labels are
never part of a selector, because selectors are immutable across upgrades.
*/}}

{{- define "gpu-health.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-health.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "gpu-health.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "gpu-health.labels" -}}
helm.sh/chart: {{ include "gpu-health.chart" . }}
app.kubernetes.io/name: {{ include "gpu-health.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpu-health
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Stable labels that select the pods of the release (no version, no chart). */}}
{{- define "gpu-health.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-health.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Per-component names, labels and selectors. */}}
{{- define "gpu-health.operator.fullname" -}}
{{- printf "%s-operator" (include "gpu-health.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-health.agent.fullname" -}}
{{- printf "%s-agent" (include "gpu-health.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-health.operator.labels" -}}
{{ include "gpu-health.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gpu-health.agent.labels" -}}
{{ include "gpu-health.labels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{- define "gpu-health.operator.selectorLabels" -}}
{{ include "gpu-health.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "gpu-health.agent.selectorLabels" -}}
{{ include "gpu-health.selectorLabels" . }}
app.kubernetes.io/component: agent
{{- end }}

{{/* The agent pods' selector labels as a label-selector string (the operator's --agent-pod-selector). */}}
{{- define "gpu-health.agent.podSelector" -}}
{{- $labels := include "gpu-health.agent.selectorLabels" . | fromYaml -}}
{{- $pairs := list -}}
{{- range $key := keys $labels | sortAlpha -}}
{{- $pairs = append $pairs (printf "%s=%s" $key (get $labels $key)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end }}

{{- define "gpu-health.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "gpu-health.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-health.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "gpu-health.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-health.operator.leaseName" -}}
{{- default (include "gpu-health.operator.fullname" .) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{- define "gpu-health.agent.scenarioConfigMap" -}}
{{- default (printf "%s-scenario" (include "gpu-health.agent.fullname" .)) .Values.agent.sim.existingConfigMap }}
{{- end }}

{{/* The one image of every container: repository@digest when image.digest is set (the tag is then ignored), else repository:tag, the tag defaulting to appVersion. */}}
{{- define "gpu-health.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The Prometheus job label of the agent scrape, as the chart's monitors produce it. */}}
{{- define "gpu-health.agent.scrapeJob" -}}
{{- if .Values.metrics.prometheusRule.agentJob }}
{{- .Values.metrics.prometheusRule.agentJob }}
{{- else if .Values.metrics.serviceMonitor.enabled }}
{{- printf "%s-metrics" (include "gpu-health.agent.fullname" .) }}
{{- else if .Values.metrics.podMonitor.enabled }}
{{- printf "%s/%s" .Release.Namespace (include "gpu-health.agent.fullname" .) }}
{{- end }}
{{- end }}

{{/* Repair (policy spec.repair): the templates' ConfigMap and the namespace the Jobs run in. */}}
{{- define "gpu-health.repair.templatesName" -}}
{{- printf "%s-repair-templates" (include "gpu-health.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-health.repair.namespace" -}}
{{- default .Release.Namespace .Values.repair.namespace }}
{{- end }}

{{/*
One repair Job manifest as YAML: (list root template image) -> the template with repair.runtimeClassName on
its pod and, when image is set, that image in every container. Unset knobs leave the template as written.
*/}}
{{- define "gpu-health.repair.job" -}}
{{- $root := index . 0 -}}
{{- $job := deepCopy (index . 1) -}}
{{- $image := index . 2 -}}
{{- $action := index . 3 -}}
{{- $pod := $job.spec.template.spec -}}
{{- if $image }}
{{- range $pod.containers }}{{ $_ := set . "image" $image }}{{ end }}
{{- end }}
{{- /* No NVIDIA toolkit on the node (GKE): the driver's own directory, as GKE mounts it for GPU pods. */ -}}
{{- $driver := $root.Values.repair.hostDriverPath -}}
{{- if and $driver (has $action (list "ResetGPU" "Validation")) }}
{{- $_ := set $pod "volumes" (append ($pod.volumes | default list) (dict "name" "nvidia-host-driver" "hostPath" (dict "path" $driver "type" "Directory"))) }}
{{- range $pod.containers }}
{{- $_ := set . "volumeMounts" (append (.volumeMounts | default list) (dict "name" "nvidia-host-driver" "mountPath" "/usr/local/nvidia" "readOnly" true)) }}
{{- $_ := set . "env" (concat (.env | default list) (list (dict "name" "PATH" "value" "/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") (dict "name" "LD_LIBRARY_PATH" "value" "/usr/local/nvidia/lib64"))) }}
{{- end }}
{{- end }}
{{- /* A platform whose supported reboot is its own API (Bottlerocket: apiclient reboot). */ -}}
{{- if and $root.Values.repair.rebootCommand (eq $action "RebootNode") }}
{{- range $pod.containers }}{{ $_ := set . "command" $root.Values.repair.rebootCommand }}{{ end }}
{{- end }}
{{- with include "gpu-health.runtimeClass" (list $root $root.Values.repair.runtimeClassName) }}{{ $_ := set $pod "runtimeClassName" . }}{{ end }}
{{- toYaml $job }}
{{- end }}

{{/*
The RuntimeClass a GPU pod runs in, from a value: `auto` -> `nvidia` when the cluster has a RuntimeClass of that
name (GPU Operator >= 25.10 uses CDI by default, and a pod that reaches the GPUs through NVIDIA_VISIBLE_DEVICES
needs the `nvidia` class there), else none; "" -> none; any other string -> that class. `lookup` answers nothing
under `helm template` (no cluster), so `auto` renders no class there: give the name to render it offline.
*/}}
{{- define "gpu-health.runtimeClass" -}}
{{- $root := index . 0 -}}
{{- $value := index . 1 -}}
{{- if eq $value "auto" -}}
{{- if lookup "node.k8s.io/v1" "RuntimeClass" "" "nvidia" -}}nvidia{{- end -}}
{{- else -}}
{{- $value -}}
{{- end -}}
{{- end }}

{{/*
The Pod Security level the agent's pods need in the release namespace: a hostPath or a privileged container is
admitted only at `privileged` (Pod Security Standards: baseline forbids both).
*/}}
{{- define "gpu-health.agent.podSecurityLevel" -}}
{{- if or (has .Values.agent.gpuAccess.mode (list "volumeMounts" "hostDriver" "privileged")) (and (ne .Values.agent.backend "sim") (eq .Values.agent.sysfs.source "host")) -}}
privileged
{{- else -}}
restricted
{{- end -}}
{{- end }}

{{/*
The GPU node selection of the agent as node affinity: the platform labels of agent.gpuNodeSelectorTerms, ORed
(a nodeSelector can only AND), merged into agent.affinity unless that brings its own nodeAffinity.
*/}}
{{- define "gpu-health.agent.affinity" -}}
{{- $affinity := deepCopy (default (dict) .Values.agent.affinity) -}}
{{- if and .Values.agent.gpuNodeSelectorTerms (not (hasKey $affinity "nodeAffinity")) -}}
{{- $required := dict "nodeSelectorTerms" .Values.agent.gpuNodeSelectorTerms -}}
{{- $_ := set $affinity "nodeAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" $required) -}}
{{- end -}}
{{- if $affinity }}{{ toYaml $affinity }}{{ end -}}
{{- end }}
