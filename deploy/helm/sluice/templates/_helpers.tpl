{{/* Name of the aggregator's objects: "flow-aggregator" for a release of
that name (the name exporters and certificates expect), else
"<release>-flow-aggregator"; fullnameOverride wins. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "flow-aggregator" .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The aggregator's ConfigMap. The aggregator makes it the owner of the
certificate objects it creates (FA_CONFIG_MAP_NAME), so that uninstalling
deletes them. */}}
{{- define "sluice.configMapName" -}}
{{- printf "%s-configmap" (include "sluice.fullname" .) }}
{{- end }}

{{- define "sluice.exporterName" -}}
{{- printf "%s-exporter" (include "sluice.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sluice.image" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) }}
{{- end }}

{{- define "sluice.labels" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "sluice.aggregatorSelector" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: aggregator
{{- end }}

{{- define "sluice.exporterSelector" -}}
app.kubernetes.io/name: sluice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end }}

{{/* The DNS name of the aggregator's Service, which its generated server
certificate names and the exporters check. */}}
{{- define "sluice.serviceDNS" -}}
{{- printf "%s.%s.svc" (include "sluice.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
sluice.uiAddress is sluice.ui.address: bindAddress:port when the UI is on
(an IPv6 address in brackets), "" (off) otherwise.
*/}}
{{- define "sluice.uiAddress" -}}
{{- if .Values.sluice.ui.enable -}}
{{- $h := toString .Values.sluice.ui.bindAddress -}}
{{- if contains ":" $h }}[{{ $h }}]{{ else }}{{ $h }}{{ end }}:{{ int .Values.sluice.ui.port }}
{{- end -}}
{{- end }}

{{/*
sluice.uiExposed says (non-empty) whether the UI listens beyond the Pod's
loopback, so that the Service lists its port.
*/}}
{{- define "sluice.uiExposed" -}}
{{- if and .Values.sluice.ui.enable (not (has (toString .Values.sluice.ui.bindAddress) (list "127.0.0.1" "::1" "localhost"))) -}}
true
{{- end -}}
{{- end }}

{{- define "sluice.validate" -}}
{{- if not (has .Values.mode (list "Aggregate" "Proxy")) }}
{{- fail (printf "mode %q: must be \"Aggregate\" or \"Proxy\"." .Values.mode) }}
{{- end }}
{{- if and (eq .Values.mode "Aggregate") (gt (int .Values.replicas) 1) (not .Values.sluice.kafkaInput.enable) }}
{{- fail (printf "replicas=%d: Aggregate mode correlates both halves of a connection in one process, so it runs at most 1 replica; set replicas to 1, use mode \"Proxy\" to scale out, or read from Kafka (sluice.kafkaInput.enable, docs/scale.md) to share the correlation among replicas." (int .Values.replicas)) }}
{{- end }}
{{- if and .Values.sluice.kafkaInput.enable (not .Values.sluice.kafkaInput.brokers) }}
{{- fail "sluice.kafkaInput.enable: sluice.kafkaInput.brokers must list at least one broker (host:port)." }}
{{- end }}
{{- if and .Values.kafka.enable (not .Values.kafka.brokers) }}
{{- fail "kafka.enable: kafka.brokers must list at least one broker (host:port)." }}
{{- end }}
{{- if and .Values.autoscaling.enable (ne .Values.mode "Proxy") }}
{{- fail "autoscaling.enable: a HorizontalPodAutoscaler is allowed only in mode \"Proxy\" (Aggregate mode runs 1 replica)." }}
{{- end }}
{{- if and (eq .Values.mode "Proxy") .Values.flowLogger.enable }}
{{- fail "flowLogger.enable: the flow log is written by Aggregate mode only (Proxy mode forwards records and keeps no flows); set flowLogger.enable=false with mode \"Proxy\"." }}
{{- end }}
{{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) }}
{{- fail "autoscaling.minReplicas must be less than or equal to autoscaling.maxReplicas." }}
{{- end }}
{{- if not (has .Values.exporter.protocol (list "grpc" "tls" "tcp" "udp")) }}
{{- fail (printf "exporter.protocol %q: must be grpc, tls, tcp or udp." .Values.exporter.protocol) }}
{{- end }}
{{- if not (has .Values.aggregatorTransportProtocol (list "tls" "tcp" "udp" "none")) }}
{{- fail (printf "aggregatorTransportProtocol %q: must be tls, tcp, udp or none." .Values.aggregatorTransportProtocol) }}
{{- end }}
{{- if and (eq .Values.aggregatorTransportProtocol "none") (not .Values.sluice.grpcEnable) (not .Values.sluice.kafkaInput.enable) }}
{{- fail "aggregatorTransportProtocol \"none\" and sluice.grpcEnable false: the aggregator would take no records." }}
{{- end }}
{{- if and .Values.exporter.enable (eq .Values.exporter.protocol "grpc") (not .Values.sluice.grpcEnable) }}
{{- fail "exporter.protocol \"grpc\" needs sluice.grpcEnable." }}
{{- end }}
{{- if .Values.sluice.ui.enable }}
{{- $p := int .Values.sluice.ui.port }}
{{- if or (lt $p 1) (gt $p 65535) }}
{{- fail (printf "sluice.ui.port %d: must be from 1 to 65535." $p) }}
{{- end }}
{{- if has $p (list 4739 (int .Values.sluice.grpcPort) (int .Values.sluice.flowStreamPort) (int .Values.apiServer.apiPort)) }}
{{- fail (printf "sluice.ui.port %d is used by another of the aggregator's ports (4739, sluice.grpcPort, sluice.flowStreamPort, apiServer.apiPort)." $p) }}
{{- end }}
{{- end }}
{{- if and .Values.exporter.enable (ne .Values.exporter.protocol "grpc") (ne .Values.exporter.protocol .Values.aggregatorTransportProtocol) }}
{{- fail (printf "exporter.protocol %q needs aggregatorTransportProtocol %q (it is %q)." .Values.exporter.protocol .Values.exporter.protocol .Values.aggregatorTransportProtocol) }}
{{- end }}
{{- end }}
