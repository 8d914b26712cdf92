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
{{- if or .Values.features.perNodeConfig .Values.features.gpuReset .Values.features.volcano .Values.features.selfHealing .Values.features.deviceAccessLabel }}true{{ end -}}
{{- end }}

{{/* Non-empty when the device plugin writes Node Events (in the namespace default): self-healing's, and the
device-access label's GPUDeviceAccessMissing. */}}
{{- define "ix-device-plugin.nodeEvents" -}}
{{- if or .Values.features.selfHealing .Values.features.deviceAccessLabel }}true{{ end -}}
{{- end }}

{{/* The node label the agent writes on its own Node (features.deviceAccessLabel): how it gets the GPU device nodes
there, and the values it may write. */}}
{{- define "ix-device-plugin.deviceAccessLabel" -}}
iluvatar.com/gpu.device-access
{{- end -}}

{{/*
Fails on values that contradict each other or name nothing the chart knows; renders nothing. Included by every
template that renders an agent.
*/}}
{{- define "ix-device-plugin.validate" -}}
{{- $_ := include "ix-device-plugin.privileged" . -}}
{{- $_ := include "ix-device-plugin.kubeletRoot" . -}}
{{- if not (kindIs "slice" (.Values.volcanoSchedulerUsers | default list)) -}}
{{- fail (printf "volcanoSchedulerUsers is %q: a list of user names (system:serviceaccount:<namespace>:<name>)" (toString .Values.volcanoSchedulerUsers)) -}}
{{- end -}}
{{- end -}}

{{/*
The kubelet's root directory (--root-dir): kubeletRoot, else the distribution's. MicroK8s: --root-dir=
${SNAP_COMMON}/var/lib/kubelet (canonical/microk8s microk8s-resources/default-args/kubelet); k0s: <data-dir>/kubelet
with data-dir /var/lib/k0s (docs.k0sproject.io, "k0s directories"); the others the kubelet's default.
*/}}
{{- define "ix-device-plugin.kubeletRoot" -}}
{{- $roots := dict "" "/var/lib/kubelet" "microk8s" "/var/snap/microk8s/common/var/lib/kubelet" "k0s" "/var/lib/k0s/kubelet" "k3s" "/var/lib/kubelet" "rke2" "/var/lib/kubelet" "openshift" "/var/lib/kubelet" -}}
{{- $distribution := .Values.distribution | default "" | toString -}}
{{- if not (hasKey $roots $distribution) -}}
{{- fail (printf "distribution is %q: one of \"\" (generic), microk8s, k0s, k3s, rke2, openshift" $distribution) -}}
{{- end -}}
{{- .Values.kubeletRoot | default (get $roots $distribution) | trimSuffix "/" -}}
{{- end -}}

{{/* The kubelet's device-plugin directory: devicePluginPath, else /var/lib/kubelet/device-plugins on every
distribution, whatever the kubelet's root (the kubelet serves kubelet.sock there: pluginapi.KubeletSocket). */}}
{{- define "ix-device-plugin.devicePluginPath" -}}
{{- .Values.devicePluginPath | default "/var/lib/kubelet/device-plugins" -}}
{{- end -}}

{{/* The kubelet's plugins directory as the device plugin mounts it (its node-health record): kubeletPluginsPath,
else <kubelet root>/plugins. */}}
{{- define "ix-device-plugin.kubeletPluginsPath" -}}
{{- .Values.kubeletPluginsPath | default (printf "%s/plugins" (include "ix-device-plugin.kubeletRoot" .)) -}}
{{- end -}}

{{/* The kubelet's pod-resources directory: telemetry.podResources.dir, else <kubelet root>/pod-resources. */}}
{{- define "ix-device-plugin.podResourcesDir" -}}
{{- .Values.telemetry.podResources.dir | default (printf "%s/pod-resources" (include "ix-device-plugin.kubeletRoot" .)) -}}
{{- end -}}

{{/* The DRA driver's registration directory: dra.kubeletRegistrarDirectoryPath, else <kubelet root>/plugins_registry. */}}
{{- define "ix-device-plugin.draRegistrarDir" -}}
{{- .Values.dra.kubeletRegistrarDirectoryPath | default (printf "%s/plugins_registry" (include "ix-device-plugin.kubeletRoot" .)) -}}
{{- end -}}

{{/* The DRA driver's plugins directory: dra.kubeletPluginsDirectoryPath, else <kubelet root>/plugins. */}}
{{- define "ix-device-plugin.draPluginsDir" -}}
{{- .Values.dra.kubeletPluginsDirectoryPath | default (printf "%s/plugins" (include "ix-device-plugin.kubeletRoot" .)) -}}
{{- end -}}

{{/*
"true" when the admission policies render: the cluster serves admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy (Kubernetes 1.30+). helm install reads it from the API server's discovery; helm template
offline needs --api-versions admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy.
*/}}
{{- define "ix-device-plugin.admissionPolicies" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy" }}true{{ end -}}
{{- end -}}

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

{{/*
The device-access label on the caller's own Node: an update of its own Node that changes nothing but the label
iluvatar.com/gpu.device-access (every other label, the annotations, owners, finalizers and the spec, taints included,
stay equal), to one of the values the agent writes (privileged not in strict mode); no create, no delete. Arguments
(a dict): name, labels, user, who (the agent, in the messages), strict (bool).
*/}}
{{- define "ix-device-plugin.nodeLabelPolicy" -}}
{{- $values := list "nri" "runtime" "privileged" "none" }}
{{- if .strict }}{{ $values = without $values "privileged" }}{{ end }}
{{- $quoted := list }}
{{- range $values }}{{ $quoted = append $quoted (printf "%q" .) }}{{ end }}
{{- $key := include "ix-device-plugin.deviceAccessLabel" . }}
{{- include "ix-device-plugin.nodeBoundPolicy" (dict "name" .name "labels" .labels "user" .user
  "rules" `- apiGroups: [""]
  apiVersions: ["*"]
  operations: ["CREATE", "UPDATE", "DELETE"]
  resources: ["nodes"]`
  "variables" (printf `- name: labelKey
  expression: '"%s"'
- name: labelValues
  expression: '[%s]'
- name: newLabels
  expression: "object.metadata.?labels.orValue({})"
- name: oldLabels
  expression: "oldObject.metadata.?labels.orValue({})"` $key (join ", " $quoted))
  "validations" (printf `- expression: request.operation == "UPDATE"
  reason: Forbidden
  message: %s creates and deletes no Node
- expression: request.operation == "UPDATE" && object.metadata.name == variables.node
  reason: Forbidden
  messageExpression: >-
    "Node " + request.name + ": %s on node " + variables.node + " changes only its own Node"
- expression: >-
    request.operation == "UPDATE" &&
    object.?spec.orValue({}) == oldObject.?spec.orValue({}) &&
    object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({}) &&
    object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]) &&
    object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([]) &&
    variables.newLabels.all(k, k == variables.labelKey ||
      (k in variables.oldLabels && variables.oldLabels[k] == variables.newLabels[k])) &&
    variables.oldLabels.all(k, k == variables.labelKey || k in variables.newLabels)
  reason: Forbidden
  messageExpression: >-
    "Node " + request.name + ": %s changes only the label " + variables.labelKey + " of its Node"
- expression: >-
    request.operation == "UPDATE" && (!(variables.labelKey in variables.newLabels) ||
    variables.newLabels[variables.labelKey] in variables.labelValues)
  reason: Forbidden
  messageExpression: >-
    "Node " + request.name + ": %s sets the label " + variables.labelKey + " only to one of " +
    variables.labelValues.join(", ")` .who .who .who .who)) }}
{{- end -}}

{{/* "true" when the agent's container runs privileged: privileged=true or deviceInjection=privileged (refused in
strict mode). */}}
{{- define "ix-device-plugin.privileged" -}}
{{- if not (has .Values.deviceInjection (list "nri" "runtime" "privileged")) -}}
{{- fail (printf "deviceInjection is %q: one of nri, runtime, privileged" .Values.deviceInjection) -}}
{{- end -}}
{{- if and .Values.strict .Values.privileged -}}
{{- fail "strict is true and privileged is true: strict runs nothing privileged; drop one of the two" -}}
{{- end -}}
{{- if and .Values.strict (eq .Values.deviceInjection "privileged") -}}
{{- fail "strict is true and deviceInjection is privileged: strict runs nothing privileged; use nri or runtime, or drop strict" -}}
{{- end -}}
{{- if or .Values.privileged (eq .Values.deviceInjection "privileged") }}true{{ end -}}
{{- end -}}

{{/* How the agent's DaemonSet gives it the GPU device nodes (IX_DEVICE_ACCESS): nri, runtime or privileged. */}}
{{- define "ix-device-plugin.deviceAccess" -}}
{{- if include "ix-device-plugin.privileged" . }}privileged{{ else }}{{ .Values.deviceInjection }}{{ end -}}
{{- end -}}

{{/*
"true" when the privileged fallback DaemonSets render (iluvatar-device-plugin-privileged, iluvatar-dra-driver-
privileged), for the nodes the agent labels iluvatar.com/gpu.device-access=privileged: the main DaemonSet runs
unprivileged, strict is off, and the agent labels its Node (features.deviceAccessLabel).
*/}}
{{- define "ix-device-plugin.fallback" -}}
{{- if and (not (include "ix-device-plugin.privileged" .)) (not .Values.strict) .Values.features.deviceAccessLabel }}true{{ end -}}
{{- end -}}

{{/*
An affinity with one more matchExpression in every required nodeSelectorTerm: the node label
iluvatar.com/gpu.device-access <operator> [privileged]; an affinity without required node terms gets one holding
only that. Arguments (a dict): affinity (the user's, may be empty), operator (In or NotIn). As YAML.
*/}}
{{- define "ix-device-plugin.affinityWithDeviceAccess" -}}
{{- $affinity := deepCopy (.affinity | default dict) -}}
{{- $expression := dict "key" (include "ix-device-plugin.deviceAccessLabel" .) "operator" .operator "values" (list "privileged") -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := list -}}
{{- range get $required "nodeSelectorTerms" | default list -}}
{{- $term := deepCopy . -}}
{{- $_ := set $term "matchExpressions" (append (get $term "matchExpressions" | default list) $expression) -}}
{{- $terms = append $terms $term -}}
{{- end -}}
{{- if not $terms -}}
{{- $terms = list (dict "matchExpressions" (list $expression)) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- toYaml $affinity -}}
{{- end -}}

{{/*
A DaemonSet's affinity: the user's, and with a fallback DaemonSet the device-access label's split (the main one
NotIn [privileged], the fallback In [privileged]): a node runs one of the two. Arguments (a dict): root, affinity,
fallback (bool: the fallback DaemonSet). Empty when there is none.
*/}}
{{- define "ix-device-plugin.affinity" -}}
{{- if include "ix-device-plugin.fallback" .root -}}
{{- include "ix-device-plugin.affinityWithDeviceAccess" (dict "affinity" .affinity "operator" (ternary "In" "NotIn" .fallback)) -}}
{{- else if .affinity -}}
{{- toYaml .affinity -}}
{{- end -}}
{{- end -}}

{{/* "true" when the NRI injector sidecar gives the agent its device nodes (deviceInjection=nri, not privileged). */}}
{{- define "ix-device-plugin.nriInjection" -}}
{{- if and (eq .Values.deviceInjection "nri") (not (include "ix-device-plugin.privileged" .)) }}true{{ end -}}
{{- end -}}

{{/* The agent's container securityContext: .Values.securityContext, or privileged (a privileged container gets
every capability and no seccomp filter, so the lines saying otherwise are left out). */}}
{{- define "ix-device-plugin.securityContext" -}}
{{- if include "ix-device-plugin.privileged" . -}}
{{- include "ix-device-plugin.privilegedSecurityContext" . }}
{{- else -}}
{{- toYaml .Values.securityContext }}
{{- end -}}
{{- end -}}

{{/* The privileged container's securityContext: privileged, and .Values.securityContext less what privileged
overrides. */}}
{{- define "ix-device-plugin.privilegedSecurityContext" -}}
{{- toYaml (merge (dict "privileged" true) (omit .Values.securityContext "allowPrivilegeEscalation" "capabilities" "seccompProfile")) }}
{{- end -}}

{{/*
The agent's API token: the pod sets automountServiceAccountToken: false, so that no container gets the token by
default (not the NRI injector sidecar, which talks to no API server), and the agent's container alone mounts this
volume, the same as the kubelet's automount (the ServiceAccount admission plugin's kube-api-access-<suffix>): a
token bound to the pod, and so naming its node, which the admission policies read; expirationSeconds 3607 as there,
so that the API server and the kubelet treat it alike (the kubelet refreshes it before it expires); the cluster's
CA from the ConfigMap kube-root-ca.crt; the pod's namespace. Only where the pod runs as a ServiceAccount.
*/}}
{{- define "ix-device-plugin.apiTokenVolume" -}}
- name: kube-api-access
  projected:
    defaultMode: 420
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 3607
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
      - downwardAPI:
          items:
            - path: namespace
              fieldRef:
                apiVersion: v1
                fieldPath: metadata.namespace
{{- end -}}

{{/* Where the agent's container mounts its API token (apiTokenVolume): where the kubelet's automount puts it and
in-cluster clients read it (apiserver/settings.py SERVICE_ACCOUNT_DIR). */}}
{{- define "ix-device-plugin.apiTokenMount" -}}
- name: kube-api-access
  mountPath: /var/run/secrets/kubernetes.io/serviceaccount
  readOnly: true
{{- end -}}

{{/* The injector's status file, in its state directory (the emptyDir nri-injector-state, /run/ix-nri-injector). */}}
{{- define "ix-device-plugin.nriStatusFile" -}}
/run/ix-nri-injector/status
{{- end -}}

{{/*
The NRI injector: a native sidecar (restartPolicy Always), ready once it knows whether the runtime serves NRI
(registered, or not there: it never holds the agent back), so the kubelet creates the agent's container only after
it. It gives the host's GPU device nodes to the container named .container of its own pod, and nothing to any
other, and writes what it found to its status file for the agent. Arguments (a dict): root (the chart's context),
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
    {{- with $values.deviceMajors }}
    - name: DEVICE_MAJORS
      value: {{ join "," . | quote }}
    {{- end }}
    - name: READY_FILE
      value: /run/ix-nri-injector/ready
    # "registered", or "unavailable: <why>" where the runtime offers no NRI; the agent reads it (IX_NRI_STATUS).
    - name: STATUS_FILE
      value: {{ include "ix-device-plugin.nriStatusFile" . }}
  # Root: the NRI socket is root's. Nothing else: it stats device nodes, reads /proc/devices and talks over one unix
  # socket.
  securityContext:
    runAsUser: 0
    allowPrivilegeEscalation: false
    capabilities:
      drop: [ALL]
    seccompProfile:
      type: RuntimeDefault
    readOnlyRootFilesystem: true
  # The image has no shell: the binary's own `ready` checks the file it writes once registered, or once it knows
  # the runtime has no NRI (then the agent reads why in the status file and falls back).
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
    # The host's terminals and shared memory hidden under its /dev (the mount is recursive): it stats device nodes.
    - name: dev-pts-mask
      mountPath: /host/dev/pts
      readOnly: true
    - name: dev-pts-mask
      mountPath: /host/dev/shm
      readOnly: true
    - name: nri-injector-state
      mountPath: /run/ix-nri-injector
{{- end -}}

{{/* The injector's volumes: the NRI socket's directory (DirectoryOrCreate: where NRI is off the sidecar starts and
says so in its log, instead of the pod waiting in ContainerCreating) and its state (the ready and status files;
the agent's container mounts it read-only). */}}
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


{{/*
The agent's device-access variables: IX_DEVICE_ACCESS, how its DaemonSet gives it the GPU device nodes (nri,
runtime, privileged); IX_DEVICE_ACCESS_FALLBACK, privileged where the chart renders the privileged fallback
DaemonSets, else none (strict, or nothing to fall back from); IX_NRI_STATUS, the injector's status file, with the
injector; IX_DEVICE_ACCESS_LABEL=false without the node label's grant. Arguments (a dict): root, fallback (bool: the
fallback DaemonSet), injector (the pod has the NRI injector).
*/}}
{{- define "ix-device-plugin.deviceAccessEnv" -}}
- name: IX_DEVICE_ACCESS
  value: {{ if .fallback }}privileged{{ else }}{{ include "ix-device-plugin.deviceAccess" .root }}{{ end }}
- name: IX_DEVICE_ACCESS_FALLBACK
  value: {{ if include "ix-device-plugin.fallback" .root }}privileged{{ else }}none{{ end }}
{{- if .injector }}
- name: IX_NRI_STATUS
  value: {{ include "ix-device-plugin.nriStatusFile" . }}
{{- end }}
{{- if not .root.Values.features.deviceAccessLabel }}
# The chart grants the node label no rights (features.deviceAccessLabel): the agent writes none.
- name: IX_DEVICE_ACCESS_LABEL
  value: "false"
{{- end }}
{{- end -}}
