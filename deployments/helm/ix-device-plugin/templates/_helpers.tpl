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

{{/*
A ValidatingAdmissionPolicy and its binding that bind one agent's writes to the node its pod runs on, as the API
server knows it from the pod-bound token (the node name in the user's extra info, which only a pod's own token
carries): a token without one is refused. Arguments (a dict): name, labels (YAML), user (the ServiceAccount's user
name), rules (resourceRules, YAML), variables (more variables, YAML; optional), validations (YAML).
*/}}
{{- define "ix-device-plugin.nodeBoundPolicy" -}}
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}
  labels:
    {{- .labels | nindent 4 }}
spec:
  failurePolicy: Fail
  matchConstraints:
    matchPolicy: Equivalent
    resourceRules:
      {{- .rules | nindent 6 }}
  matchConditions:
    - name: the-agents-service-account
      expression: request.userInfo.username == "{{ .user }}"
  variables:
    - name: nodeNames
      expression: request.userInfo.extra[?"authentication.kubernetes.io/node-name"].orValue([])
    - name: node
      expression: 'variables.nodeNames.size() == 1 ? variables.nodeNames[0] : ""'
    # The object written and the object replaced (null on create and delete respectively).
    - name: objects
      expression: "[object, oldObject].filter(o, o != null)"
    {{- with .variables }}
    {{- . | nindent 4 }}
    {{- end }}
  validations:
    - expression: variables.node != ""
      reason: Forbidden
      message: a token bound to no node (not the agent pod's own token) writes nothing
    {{- .validations | nindent 4 }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  labels:
    {{- .labels | nindent 4 }}
spec:
  policyName: {{ .name }}
  validationActions: [Deny]
{{- end -}}

{{/*
Events (core/v1 and events.k8s.io/v1, the same objects): only about the caller's own Node. Arguments (a dict): name,
labels, user, who (the agent, in the message).
*/}}
{{- define "ix-device-plugin.nodeEventsPolicy" -}}
{{ include "ix-device-plugin.nodeBoundPolicy" (dict "name" .name "labels" .labels "user" .user
  "rules" `- apiGroups: [""]
  apiVersions: ["*"]
  operations: ["CREATE", "UPDATE", "DELETE"]
  resources: ["events"]
- apiGroups: ["events.k8s.io"]
  apiVersions: ["*"]
  operations: ["CREATE", "UPDATE", "DELETE"]
  resources: ["events"]`
  "variables" `# What each Event is about: core/v1's involvedObject, events.k8s.io/v1's regarding.
- name: about
  expression: >-
    variables.objects.map(e, request.resource.group == "events.k8s.io" ?
    e.?regarding.orValue({}) : e.?involvedObject.orValue({}))`
  "validations" (printf `- expression: >-
    variables.about.all(o, o.?kind.orValue("") == "Node" && o.?name.orValue("") == variables.node)
  reason: Forbidden
  messageExpression: >-
    "Event " + request.namespace + "/" + request.name + ": %s on node " + variables.node +
    " writes only Events about Node " + variables.node` .who)) }}
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
