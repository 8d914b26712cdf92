{{/*
The GPU reset helper (resetHelper): `ix-device-plugin reset-helper`, a privileged container beside the unprivileged
agent in its pod. The agent asks it over a unix socket in the pod's own emptyDir reset-socket to reset a chip; it
takes only "reset chip <UUID>" for a chip it enumerates itself and runs the fixed `ixsmi -r -i <UUID>`.
*/}}

{{/* Where the helper listens and the agent connects: a folder of the pod's own (the emptyDir reset-socket). */}}
{{- define "ix-device-plugin.resetSocketDir" -}}
/run/ix-reset
{{- end -}}

{{- define "ix-device-plugin.resetSocket" -}}
{{ include "ix-device-plugin.resetSocketDir" . }}/reset.sock
{{- end -}}

{{/*
"true" when the pod runs the reset helper: the agent's container unprivileged (not the privileged fallback, not
privileged=true nor deviceInjection=privileged), resetHelper.enabled, and not strict (strict wins: nothing
privileged). Arguments (a dict): root, fallback (bool: the fallback DaemonSet).
*/}}
{{- define "ix-device-plugin.resetHelper" -}}
{{- $values := .root.Values -}}
{{- if and (not .fallback) (not (include "ix-device-plugin.privileged" .root)) $values.resetHelper.enabled (not $values.strict) }}true{{ end -}}
{{- end -}}

{{/*
How the agent resets a chip (IX_RESET_VIA): helper (through the helper's socket), local (its own container is
privileged: it runs ixsmi itself), none (strict, or resetHelper.enabled=false: resets are reported unavailable).
Arguments (a dict): root, fallback.
*/}}
{{- define "ix-device-plugin.resetVia" -}}
{{- if or .fallback (include "ix-device-plugin.privileged" .root) -}}
local
{{- else if include "ix-device-plugin.resetHelper" . -}}
helper
{{- else -}}
none
{{- end -}}
{{- end -}}

{{/* The agent's variables of the reset path. Arguments (a dict): root, fallback. */}}
{{- define "ix-device-plugin.resetAgentEnv" -}}
{{- $via := include "ix-device-plugin.resetVia" . -}}
{{- if eq $via "helper" -}}
# GPU resets through the reset-helper container beside it (resetHelper), over its socket.
{{ else if eq $via "none" -}}
# No GPU reset ({{ if .root.Values.strict }}strict: nothing privileged{{ else }}resetHelper.enabled=false{{ end }}): the agent reports resets unavailable.
{{ end -}}
- name: IX_RESET_VIA
  value: {{ $via }}
{{- if eq $via "helper" }}
- name: IX_RESET_HELPER_SOCKET
  value: {{ include "ix-device-plugin.resetSocket" . }}
{{- end }}
{{- end -}}

{{/* The agent's mount of the helper's socket folder (read-only suffices for connecting to a unix socket). */}}
{{- define "ix-device-plugin.resetAgentMount" -}}
# The reset helper's socket (IX_RESET_HELPER_SOCKET).
- name: reset-socket
  mountPath: {{ include "ix-device-plugin.resetSocketDir" . }}
  readOnly: true
{{- end -}}

{{- define "ix-device-plugin.resetSocketVolume" -}}
# The reset helper's socket, the pod's own: the helper listens in it, the agent's container connects.
- name: reset-socket
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- with .Values.resetHelper.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The reset helper's container. Arguments (a dict): root, corex (where the pod mounts corexPath: the agent's own
path, so that ixsmi and the simulated devices file are where the agent's variables say), extraEnv (a list: the
agent's extra variables, which the helper takes too; a mode ignores the variables of settings it does not use).
*/}}
{{- define "ix-device-plugin.resetHelperContainer" -}}
{{- $root := .root -}}
{{- $given := list -}}
{{- range .extraEnv }}{{ $given = append $given .name }}{{ end -}}
{{- $own := list
  (dict "name" "IX_RESET_HELPER_SOCKET" "value" (include "ix-device-plugin.resetSocket" .))
  (dict "name" "IX_IXSMI_PATH" "value" (printf "%s/bin/ixsmi" (trimSuffix "/" .corex)))
  (dict "name" "IX_BACKEND" "value" (toString $root.Values.backend))
  (dict "name" "IX_RESET_HELPER_MAX_PER_MINUTE" "value" (toString $root.Values.resetHelper.maxResetsPerMinute)) -}}
- name: reset-helper
  image: "{{ $root.Values.image.repository }}:{{ $root.Values.image.tag | default $root.Chart.AppVersion }}"
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  args: ["reset-helper"]
  env:
    {{- range $own }}
    {{- if not (has .name $given) }}
    - name: {{ .name }}
      value: {{ .value | quote }}
    {{- end }}
    {{- end }}
    {{- range .extraEnv }}
    - {{ toYaml . | nindent 6 | trim }}
    {{- end }}
  # Privileged: `ixsmi -r` resets a chip through the driver (it writes /sys/bus/pci/drivers/iluvatar, as Iluvatar's
  # own plugin runs it), whose needs are not known more narrowly. It gets the host's device nodes and a writable
  # /sys from that; no API token, no host path but CoreX (read-only), no port.
  securityContext:
    {{- include "ix-device-plugin.privilegedSecurityContext" $root | nindent 4 }}
  {{- with $root.Values.resetHelper.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: reset-socket
      mountPath: {{ include "ix-device-plugin.resetSocketDir" . }}
    - name: corex
      mountPath: {{ .corex }}
      readOnly: true
    {{- with $root.Values.resetHelper.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* NOTES.txt: how the unprivileged agent's GPU resets run (not in strict mode, which has its own words). */}}
{{- define "ix-device-plugin.resetNotes" -}}
{{- if .Values.resetHelper.enabled -}}
GPU resets (self-healing, flags.reset_gpu, DRA reset: true) run `ixsmi -r`, whose needs are not known more
narrowly than privileged, in the container reset-helper beside the agent: privileged, it resets only the node's
chips the agent names, at most {{ .Values.resetHelper.maxResetsPerMinute }} a minute, and holds no API token.
{{- else -}}
resetHelper.enabled is false: GPU resets (self-healing, flags.reset_gpu, DRA reset: true) are unavailable, as the
agent says in one Event; a chip a reset would clear stays out of service until it is reset by hand.
{{- end -}}
{{- end -}}
