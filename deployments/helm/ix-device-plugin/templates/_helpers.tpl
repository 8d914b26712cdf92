{{/* The name of the DaemonSet and its container, and the app.kubernetes.io/name label. */}}
{{- define "ix-device-plugin.name" -}}
{{- default "iluvatar-device-plugin" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ix-device-plugin.fullname" -}}
{{- default (include "ix-device-plugin.name" .) .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ix-device-plugin.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Labels of every object, and the DaemonSet's selector. */}}
{{- define "ix-device-plugin.labels" -}}
app.kubernetes.io/name: {{ include "ix-device-plugin.name" . }}
{{- end -}}

{{/* Non-empty when an enabled feature needs the API server. */}}
{{- define "ix-device-plugin.needsApi" -}}
{{- if or .Values.features.perNodeConfig .Values.features.gpuReset .Values.features.volcano .Values.features.selfHealing }}true{{ end -}}
{{- end }}

{{/* The DRA driver's DaemonSet, ServiceAccount and RBAC name, and its selector label (apart from the plugin's). */}}
{{- define "ix-device-plugin.draName" -}}
iluvatar-dra-driver
{{- end -}}

{{/* The agent's container securityContext: .Values.securityContext, or privileged when .Values.privileged (a
privileged container gets every capability and no seccomp filter, so the lines saying otherwise are left out). */}}
{{- define "ix-device-plugin.securityContext" -}}
{{- if .Values.privileged -}}
{{- toYaml (merge (dict "privileged" true) (omit .Values.securityContext "allowPrivilegeEscalation" "capabilities" "seccompProfile")) }}
{{- else -}}
{{- toYaml .Values.securityContext }}
{{- end -}}
{{- end -}}
