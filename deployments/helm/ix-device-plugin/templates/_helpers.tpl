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

{{/* "true" when the agent's container runs privileged: privileged=true or deviceInjection=privileged. */}}
{{- define "ix-device-plugin.privileged" -}}
{{- if not (has .Values.deviceInjection (list "nri" "runtime" "privileged")) -}}
{{- fail (printf "deviceInjection is %q: one of nri, runtime, privileged" .Values.deviceInjection) -}}
{{- end -}}
{{- if or .Values.privileged (eq .Values.deviceInjection "privileged") }}true{{ end -}}
{{- end -}}

{{/* "true" when the NRI injector sidecar gives the agent its device nodes (deviceInjection=nri, not privileged). */}}
{{- define "ix-device-plugin.nriInjection" -}}
{{- if and (eq .Values.deviceInjection "nri") (not (include "ix-device-plugin.privileged" .)) }}true{{ end -}}
{{- end -}}

{{/* The agent's container securityContext: .Values.securityContext, or privileged (a privileged container gets
every capability and no seccomp filter, so the lines saying otherwise are left out). */}}
{{- define "ix-device-plugin.securityContext" -}}
{{- if include "ix-device-plugin.privileged" . -}}
{{- toYaml (merge (dict "privileged" true) (omit .Values.securityContext "allowPrivilegeEscalation" "capabilities" "seccompProfile")) }}
{{- else -}}
{{- toYaml .Values.securityContext }}
{{- end -}}
{{- end -}}

{{/*
The NRI injector: a native sidecar (restartPolicy Always), ready once registered with the runtime's NRI socket, so
the kubelet creates the agent's container only after it. It gives the host's GPU device nodes to the container
named .container of its own pod, and nothing to any other. Arguments (a dict): root (the chart's context),
container (the agent container's name).
*/}}
{{- define "ix-device-plugin.nriInjectorContainer" -}}
{{- $values := .root.Values.nriInjector -}}
- name: nri-injector
  image: "{{ $values.image.repository }}:{{ $values.image.tag | default .root.Chart.AppVersion }}"
  imagePullPolicy: {{ $values.image.pullPolicy }}
  restartPolicy: Always
  env:
    - name: POD_UID
      valueFrom:
        fieldRef:
          fieldPath: metadata.uid
    - name: AGENT_CONTAINER
      value: {{ .container | quote }}
    - name: NRI_SOCKET
      value: {{ $values.socketDir }}/nri.sock
    - name: NRI_PLUGIN_INDEX
      value: {{ $values.pluginIndex | quote }}
    - name: HOST_DEV
      value: /host/dev
    - name: READY_FILE
      value: /run/ix-nri-injector/ready
  # Root: the NRI socket is root's. Nothing else: it stats device nodes and talks over one unix socket.
  securityContext:
    runAsUser: 0
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
    seccompProfile:
      type: RuntimeDefault
    readOnlyRootFilesystem: true
  # The image has no shell: the binary's own `ready` checks the file it writes once registered.
  startupProbe:
    exec:
      command: ["/ix-nri-injector", "ready"]
    periodSeconds: 1
    failureThreshold: 120
  {{- with $values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: nri
      mountPath: {{ $values.socketDir }}
      readOnly: true
    - name: dev
      mountPath: /host/dev
      readOnly: true
    - name: nri-injector-state
      mountPath: /run/ix-nri-injector
{{- end -}}

{{/* The injector's volumes: the NRI socket's directory (DirectoryOrCreate: where NRI is off the sidecar starts and
says so in its log, instead of the pod waiting in ContainerCreating) and its ready file. */}}
{{- define "ix-device-plugin.nriInjectorVolumes" -}}
- name: nri
  hostPath:
    path: {{ .Values.nriInjector.socketDir }}
    type: DirectoryOrCreate
- name: nri-injector-state
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}
