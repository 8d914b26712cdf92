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
Events (core/v1 and events.k8s.io/v1, the same objects). Arguments (a dict): name, labels, user, who (the agent, in
the message); nodeEvents (bool): Events about the caller's own Node; podRefusals (bool): created Warning Events
VolcanoAnnotationRefused about a Pod, reported by the caller's node (deviceplugin/features/volcanorefusals.py). A
policy cannot read the pod, so that it is bound to the node is not checked.
*/}}
{{- define "ix-device-plugin.nodeEventsPolicy" -}}
{{- $variables := `# What each Event is about: core/v1's involvedObject, events.k8s.io/v1's regarding.
- name: about
  expression: >-
    variables.objects.map(e, request.resource.group == "events.k8s.io" ?
    e.?regarding.orValue({}) : e.?involvedObject.orValue({}))` }}
{{- $allowed := list }}
{{- $written := list }}
{{- if .nodeEvents }}
{{- $allowed = append $allowed `variables.about.all(o, o.?kind.orValue("") == "Node" && o.?name.orValue("") == variables.node)` }}
{{- $written = append $written `Events about Node " + variables.node` }}
{{- end }}
{{- if .podRefusals }}
{{- $variables = printf "%s\n%s" $variables `# Who reports the Event: the host, then the reporting instance (core/v1); the reporting instance, then the
# deprecated source's host (events.k8s.io/v1). The first is the node's name, the second that or unset.
- name: reporters
  expression: >-
    request.resource.group == "events.k8s.io" ?
    [object.?reportingInstance.orValue(""), object.?deprecatedSource.?host.orValue("")] :
    [object.?source.?host.orValue(""), object.?reportingInstance.orValue("")]
# Volcano mode: a Warning Event that a pod's Volcano annotations are refused, created (never changed), in the pod's
# namespace, reported by this node.
- name: podRefusal
  expression: >-
    request.operation == "CREATE" && object.?type.orValue("") == "Warning" &&
    object.?reason.orValue("") == "VolcanoAnnotationRefused" &&
    variables.about.all(o, o.?kind.orValue("") == "Pod" && o.?namespace.orValue("") == request.namespace) &&
    variables.reporters[0] == variables.node && variables.reporters[1] in ["", variables.node]` }}
{{- $allowed = append $allowed "variables.podRefusal" }}
{{- $written = append $written `new Warning Events VolcanoAnnotationRefused about a pod, reported by node " + variables.node` }}
{{- end }}
{{ include "ix-device-plugin.nodeBoundPolicy" (dict "name" .name "labels" .labels "user" .user
  "rules" `- apiGroups: [""]
  apiVersions: ["*"]
  operations: ["CREATE", "UPDATE", "DELETE"]
  resources: ["events"]
- apiGroups: ["events.k8s.io"]
  apiVersions: ["*"]
  operations: ["CREATE", "UPDATE", "DELETE"]
  resources: ["events"]`
  "variables" $variables
  "validations" (printf `- expression: >-
    %s
  reason: Forbidden
  messageExpression: >-
    "Event " + request.namespace + "/" + request.name + ": %s on node " + variables.node +
    " writes only %s` (join " ||\n    " $allowed) .who (join ` + " and ` $written))) }}
{{- end -}}
