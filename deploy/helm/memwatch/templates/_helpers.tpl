{{- define "memwatch.name" -}}
{{- .Chart.Name -}}
{{- end -}}

{{- define "memwatch.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "memwatch.labels" -}}
app.kubernetes.io/name: {{ include "memwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "memwatch.selector" -}}
app.kubernetes.io/name: {{ include "memwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* One TOML table's keys: `key = value`, values as JSON (valid TOML for strings, numbers, booleans). */}}
{{- define "memwatch.tomlKeys" -}}
{{- range $key, $value := . }}
{{ $key }} = {{ $value | toJson }}
{{- end }}
{{- end -}}

{{/* The Secret holding the API token: the one given, else the chart's own. */}}
{{- define "memwatch.tokenSecret" -}}
{{- .Values.apiToken.existingSecret | default (printf "%s-api-token" (include "memwatch.fullname" .)) -}}
{{- end -}}
