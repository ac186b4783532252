{{- /*
How the agent reaches the node's GPUs (agent.gpuAccess.mode), each mode with
the least it needs; docs/operations.md says which mode fits which platform.
  envvar       NVIDIA_VISIBLE_DEVICES, honoured by the NVIDIA runtime in an
               unprivileged pod (accept-nvidia-visible-devices-envvar-when-unprivileged).
  volumeMounts the device plugin's volume-mounts strategy: /dev/null mounted
               at /var/run/nvidia-container-devices/all (Bottlerocket, hardened toolkits).
  cdi          a CDI device named in pod annotations (the toolkit's NRI plugin, or a
               CDI-mode runtime reading cdi.k8s.io/ annotations); see agent.runtimeClassName.
  hostDriver   no NVIDIA runtime at all (GKE's Google-managed drivers): the host's
               driver directory read-only, NVML from it; privileged for /dev/nvidia*.
  privileged   the last resort: the runtime injects for a privileged container
               whatever its settings.
*/ -}}

{{- define "gpu-health.agent.gpuAccess.annotations" -}}
{{- if eq .Values.agent.gpuAccess.mode "cdi" }}
nvidia.cdi.k8s.io/container.agent: {{ .Values.agent.gpuAccess.cdiDevice | quote }}
cdi.k8s.io/gpu-health-agent: {{ .Values.agent.gpuAccess.cdiDevice | quote }}
{{- end }}
{{- end }}

{{- define "gpu-health.agent.gpuAccess.env" -}}
{{- $mode := .Values.agent.gpuAccess.mode }}
{{- if has $mode (list "envvar" "privileged") }}
# Read by the NVIDIA container runtime (not by the agent): inject the GPUs'
# device nodes and NVML, nothing else. The agent requests no nvidia.com/gpu,
# so it watches GPUs without taking one.
- name: NVIDIA_VISIBLE_DEVICES
  value: {{ .Values.agent.nvidia.visibleDevices | quote }}
{{- end }}
{{- if has $mode (list "envvar" "privileged" "volumeMounts" "cdi") }}
- name: NVIDIA_DRIVER_CAPABILITIES
  value: {{ .Values.agent.nvidia.driverCapabilities | quote }}
{{- end }}
{{- if eq $mode "hostDriver" }}
# pynvml dlopens libnvidia-ml.so.1 from here.
- name: LD_LIBRARY_PATH
  value: /usr/local/nvidia/lib64
{{- end }}
{{- end }}

{{- define "gpu-health.agent.gpuAccess.securityContext" -}}
{{- if has .Values.agent.gpuAccess.mode (list "hostDriver" "privileged") }}
{{- /* The API server refuses privileged with allowPrivilegeEscalation=false. */}}
{{- $sc := omit .Values.agent.securityContext "allowPrivilegeEscalation" "privileged" }}
{{- toYaml (merge (dict "privileged" true) $sc) }}
{{- else }}
{{- toYaml .Values.agent.securityContext }}
{{- end }}
{{- end }}

{{- define "gpu-health.agent.gpuAccess.volumeMounts" -}}
{{- $mode := .Values.agent.gpuAccess.mode }}
{{- if eq $mode "volumeMounts" }}
- name: nvidia-visible-devices
  mountPath: /var/run/nvidia-container-devices/all
  readOnly: true
{{- else if eq $mode "hostDriver" }}
- name: nvidia-driver
  mountPath: /usr/local/nvidia
  readOnly: true
{{- end }}
{{- end }}

{{- define "gpu-health.agent.gpuAccess.volumes" -}}
{{- $mode := .Values.agent.gpuAccess.mode }}
{{- if eq $mode "volumeMounts" }}
- name: nvidia-visible-devices
  hostPath:
    path: /dev/null
    type: CharDevice
{{- else if eq $mode "hostDriver" }}
- name: nvidia-driver
  hostPath:
    path: {{ .Values.agent.gpuAccess.hostDriverPath }}
    type: Directory
{{- end }}
{{- end }}
