{{/* The release's base name. */}}
{{- define "ksched.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ksched.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ksched.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ksched.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ksched.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ksched.tokensSecret" -}}
{{- default (printf "%s-api-tokens" (include "ksched.fullname" .)) .Values.apiTokens.existingSecret -}}
{{- end -}}

{{/* ksched.yaml: the user's config merged with what the chart decides. */}}
{{- define "ksched.settings" -}}
{{- $svc := include "ksched.fullname" . -}}
{{- $hosts := concat .Values.http.allowedHosts (list $svc (printf "%s.%s.svc" $svc .Release.Namespace) (printf "%s.%s.svc.cluster.local" $svc .Release.Namespace)) -}}
{{- $fixed := dict
  "kafka" (dict "bootstrap_servers" .Values.kafka.bootstrapServers)
  "http" (dict "listen" (printf "0.0.0.0:%d" (int .Values.http.port)) "tokens_file" "/etc/ksched/tokens/tokens.yaml" "allowed_hosts" $hosts)
  "storage" (dict "data_dir" "/var/lib/ksched/data")
  "log" (dict "format" "json")
  "pools_file" "pools.yaml"
  "policy_dir" "policy" -}}
{{- toYaml (mergeOverwrite (deepCopy .Values.config) $fixed) -}}
{{- end -}}
