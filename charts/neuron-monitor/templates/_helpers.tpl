{{/* Names and labels shared by every template. */}}

{{- define "neuron-monitor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name: the release name, plus the chart name unless the release name contains it. */}}
{{- define "neuron-monitor.fullname" -}}
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

{{/* Component names; the suffix is kept whole, the prefix shortened (names are at most 63 characters). */}}
{{- define "neuron-monitor.operator.fullname" -}}
{{- printf "%s-operator" (include "neuron-monitor.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{- define "neuron-monitor.agent.fullname" -}}
{{- printf "%s-node-agent" (include "neuron-monitor.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{/* The Secret the operator mirrors the configs' OTLP headers into, for the agents. */}}
{{- define "neuron-monitor.otlpHeadersSecret" -}}
{{- printf "%s-otlp-headers" (include "neuron-monitor.fullname" . | trunc 50 | trimSuffix "-") }}
{{- end }}

{{- define "neuron-monitor.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "neuron-monitor.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name: set it when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "neuron-monitor.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "neuron-monitor.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name: set it when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "neuron-monitor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "neuron-monitor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: neuron-monitor
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels: never change them, a Deployment's or DaemonSet's selector is immutable. */}}
{{- define "neuron-monitor.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neuron-monitor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "neuron-monitor.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neuron-monitor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "neuron-monitor.operator.labels" -}}
{{ include "neuron-monitor.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "neuron-monitor.agent.labels" -}}
{{ include "neuron-monitor.labels" . }}
app.kubernetes.io/component: node-agent
{{- end }}

{{/*
The Prometheus job names the alerts and the dashboard query (job="neuron-node-agent",
job="neuron-operator"), whatever the release is called: ServiceMonitors and PodMonitors
take the job from this label (jobLabel).
*/}}
{{- define "neuron-monitor.jobLabelKey" -}}neuronmonitor.io/scrape-job{{- end }}

{{/* registry/repository:tag, or @digest when one is given. Arguments: (dict "root" $ "image" .Values.x.image). */}}
{{- define "neuron-monitor.image" -}}
{{- $registry := .root.Values.image.registry }}
{{- $name := .image.repository }}
{{- if $registry }}{{ $name = printf "%s/%s" (trimSuffix "/" $registry) $name }}{{ end }}
{{- if .image.digest }}
{{- printf "%s@%s" $name .image.digest }}
{{- else }}
{{- printf "%s:%s" $name (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* Whether a monitoring.coreos.com/v1 kind is rendered. Arguments: (dict "root" $ "kind" "ServiceMonitor"). */}}
{{- define "neuron-monitor.monitoringApi" -}}
{{- if or .root.Values.monitoring.force (.root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind)) -}}
true
{{- end }}
{{- end }}

{{/*
Relabelings of an agent target (ServiceMonitor and PodMonitor alike). The agent's series
carry the namespace, pod and container of the workload that holds the NeuronCores. The
target labels of the same names (the agent's own pod) would either push those aside
(renamed exported_namespace, …) or, on series without them (node-level series, idle
cores), make the agent look like the user of the node: they are dropped, and the
agent's node and pod kept under other names.
*/}}
{{- define "neuron-monitor.agentRelabelings" -}}
- action: replace
  sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
- action: replace
  sourceLabels: [__meta_kubernetes_pod_name]
  targetLabel: agent_pod
- action: labeldrop
  regex: (namespace|pod|container)
{{- end }}

{{/*
The metrics endpoints (values metricsEndpoint): the Secret of their certificate, the names
it is valid for (the Services' DNS names, which the monitors check), and what both
binaries are given to serve them.
*/}}
{{- define "neuron-monitor.metricsTls.secretName" -}}
{{- if eq .Values.metricsEndpoint.tls.source "secret" }}
{{- required "metricsEndpoint.tls.secretName: name your Secret when metricsEndpoint.tls.source is secret" .Values.metricsEndpoint.tls.secretName }}
{{- else }}
{{- printf "%s-metrics-tls" (include "neuron-monitor.fullname" . | trunc 50 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{- define "neuron-monitor.metricsTls.caConfigMapName" -}}
{{- printf "%s-metrics-ca" (include "neuron-monitor.fullname" . | trunc 51 | trimSuffix "-") }}
{{- end }}

{{- define "neuron-monitor.metricsReader.name" -}}
{{- printf "%s-metrics-reader" (include "neuron-monitor.fullname" . | trunc 47 | trimSuffix "-") }}
{{- end }}

{{- define "neuron-monitor.metricsScraper.name" -}}
{{- printf "%s-metrics-scraper" (include "neuron-monitor.fullname" . | trunc 46 | trimSuffix "-") }}
{{- end }}

{{/* The DNS name a component's certificate is checked against (its Service's). Arguments: (dict "root" $ "component" "agent"|"operator"). */}}
{{- define "neuron-monitor.metricsTls.serverName" -}}
{{- printf "%s.%s.svc" (include (printf "neuron-monitor.%s.fullname" .component) .root) .root.Release.Namespace }}
{{- end }}

{{/* Every name of the certificate, one a line. */}}
{{- define "neuron-monitor.metricsTls.dnsNames" -}}
{{- range $component := list "agent" "operator" }}
{{- $service := include (printf "neuron-monitor.%s.fullname" $component) $ }}
- {{ $service }}
- {{ $service }}.{{ $.Release.Namespace }}
- {{ $service }}.{{ $.Release.Namespace }}.svc
- {{ $service }}.{{ $.Release.Namespace }}.svc.cluster.local
{{- end }}
{{- end }}

{{/* Where the binaries read the certificate. */}}
{{- define "neuron-monitor.metricsTls.dir" -}}/etc/neuron-monitor/metrics-tls{{- end }}

{{/* The flags of a binary's HTTP ports. Arguments: (dict "root" $ "port" <metrics port> "probePort" <probe port>). */}}
{{- define "neuron-monitor.httpArgs" -}}
{{- $endpoint := .root.Values.metricsEndpoint -}}
- --listen=0.0.0.0:{{ .port }}
# /healthz and /readyz for the kubelet, plain HTTP.
- --probe-listen=0.0.0.0:{{ .probePort }}
{{- if $endpoint.tls.enabled }}
- --tls-cert-file={{ include "neuron-monitor.metricsTls.dir" .root }}/tls.crt
- --tls-key-file={{ include "neuron-monitor.metricsTls.dir" .root }}/tls.key
{{- end }}
- --metrics-auth={{ $endpoint.authorization.enabled }}
{{- with $endpoint.authorization.audiences }}
- --metrics-auth-audiences={{ join "," . }}
{{- end }}
{{- end }}

{{/* The container ports and probes of a binary. Arguments: (dict "root" $ "port" … "portName" … "probePort" …). */}}
{{- define "neuron-monitor.httpPorts" -}}
ports:
  - name: {{ .portName }}
    containerPort: {{ .port }}
    protocol: TCP
  - name: probes
    containerPort: {{ .probePort }}
    protocol: TCP
{{- end }}

{{- define "neuron-monitor.metricsTls.volumeMount" -}}
{{- if .Values.metricsEndpoint.tls.enabled -}}
# The metrics port's certificate (re-read when the kubelet updates the Secret).
- name: metrics-tls
  mountPath: {{ include "neuron-monitor.metricsTls.dir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "neuron-monitor.metricsTls.volume" -}}
{{- if .Values.metricsEndpoint.tls.enabled -}}
- name: metrics-tls
  secret:
    secretName: {{ include "neuron-monitor.metricsTls.secretName" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/*
The TLS and token settings of a ServiceMonitor endpoint or PodMonitor metrics endpoint.
Arguments: (dict "root" $ "component" "agent"|"operator" "kind" "ServiceMonitor"|"PodMonitor").
*/}}
{{- define "neuron-monitor.scrapeSecurity" -}}
{{- $endpoint := .root.Values.metricsEndpoint -}}
{{- if $endpoint.tls.enabled -}}
scheme: https
tlsConfig:
  serverName: {{ include "neuron-monitor.metricsTls.serverName" (dict "root" .root "component" .component) }}
  ca:
    {{- if eq $endpoint.tls.source "chart" }}
    configMap:
      name: {{ include "neuron-monitor.metricsTls.caConfigMapName" .root }}
      key: ca.crt
    {{- else }}
    secret:
      name: {{ include "neuron-monitor.metricsTls.secretName" .root }}
      key: ca.crt
    {{- end }}
{{- end }}
{{- if $endpoint.authorization.enabled }}
{{- if eq .kind "ServiceMonitor" }}
# Prometheus's own ServiceAccount token.
bearerTokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
{{- else }}
# The token of the chart's scraper ServiceAccount (a PodMonitor cannot name a file).
authorization:
  type: Bearer
  credentials:
    name: {{ include "neuron-monitor.metricsScraper.name" .root }}
    key: token
{{- end }}
{{- end }}
{{- end }}

{{/* The two reviews of a /metrics request's token (service/src/auth.rs), when enabled. */}}
{{- define "neuron-monitor.reviewRules" -}}
{{- if .Values.metricsEndpoint.authorization.enabled }}
  # /metrics: is the bearer token valid (TokenReview), may its user get /metrics
  # (SubjectAccessReview)? See metricsEndpoint.authorization.
  - apiGroups: ["authentication.k8s.io"]
    resources: ["tokenreviews"]
    verbs: ["create"]
  - apiGroups: ["authorization.k8s.io"]
    resources: ["subjectaccessreviews"]
    verbs: ["create"]
{{- end }}
{{- end }}

{{/*
The CloudWatch Observability add-on's port on the agent (values cloudwatchAddon): /metrics
over HTTPS with the add-on's certificate and no token checks; the NetworkPolicy is what
keeps it to the node's own scraper, so the chart refuses it without one.
*/}}
{{- define "neuron-monitor.cloudwatchAddon.dir" -}}/etc/neuron-monitor/cloudwatch-addon-tls{{- end }}

{{- define "neuron-monitor.cloudwatchAddon.check" -}}
{{- $addon := .Values.cloudwatchAddon -}}
{{- if $addon.enabled -}}
{{- if not $addon.secretName -}}
{{- fail "cloudwatchAddon.secretName: name the kubernetes.io/tls Secret (in the release namespace) with the add-on's certificate for neuron-monitor-service.<cloudwatchAddon.namespace>.svc" -}}
{{- end -}}
{{- if not .Values.metricsEndpoint.networkPolicy.enabled -}}
{{- fail "cloudwatchAddon.enabled needs metricsEndpoint.networkPolicy.enabled: the add-on's port checks no token, only the NetworkPolicy keeps other pods off it" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "neuron-monitor.cloudwatchAddon.args" -}}
{{- include "neuron-monitor.cloudwatchAddon.check" . -}}
{{- if .Values.cloudwatchAddon.enabled -}}
# /metrics without token checks for the CloudWatch Observability add-on (NetworkPolicy: the node only).
- --tokenless-listen=0.0.0.0:{{ .Values.cloudwatchAddon.port }}
- --tokenless-tls-cert-file={{ include "neuron-monitor.cloudwatchAddon.dir" . }}/tls.crt
- --tokenless-tls-key-file={{ include "neuron-monitor.cloudwatchAddon.dir" . }}/tls.key
{{- end -}}
{{- end }}

{{- define "neuron-monitor.cloudwatchAddon.port" -}}
{{- if .Values.cloudwatchAddon.enabled -}}
- name: cloudwatch
  containerPort: {{ .Values.cloudwatchAddon.port }}
  protocol: TCP
{{- end -}}
{{- end }}

{{- define "neuron-monitor.cloudwatchAddon.volumeMount" -}}
{{- if .Values.cloudwatchAddon.enabled -}}
- name: cloudwatch-addon-tls
  mountPath: {{ include "neuron-monitor.cloudwatchAddon.dir" . }}
  readOnly: true
{{- end -}}
{{- end }}

{{- define "neuron-monitor.cloudwatchAddon.volume" -}}
{{- if .Values.cloudwatchAddon.enabled -}}
- name: cloudwatch-addon-tls
  secret:
    secretName: {{ .Values.cloudwatchAddon.secretName }}
    defaultMode: 0440
{{- end -}}
{{- end }}
