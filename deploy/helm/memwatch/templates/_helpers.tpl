{{- define "memwatch.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "memwatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := .Values.nameOverride | default .Chart.Name -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
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

{{- define "memwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "memwatch.fullname" .) -}}
{{- else -}}
{{- /* Never the namespace's "default" account: binding the ClusterRole to it
would hand memwatch's node writes to every pod that runs as it. */ -}}
{{- $name := required "serviceAccount.create=false needs serviceAccount.name: an existing ServiceAccount made for memwatch (never the namespace's default one)" .Values.serviceAccount.name -}}
{{- if eq $name "default" -}}
{{- fail "serviceAccount.name must not be \"default\": the ClusterRole would be bound to the account every pod of the namespace runs as" -}}
{{- end -}}
{{- $name -}}
{{- end -}}
{{- end -}}

{{/*
Names of the cluster-scoped objects (ClusterRole, ClusterRoleBinding, the
admission policy): the release namespace and the fullname, so that releases
of the same name in two namespaces do not share them.
*/}}
{{- define "memwatch.clusterName" -}}
{{- list .Release.Namespace (include "memwatch.fullname" .) | compact | join "-" -}}
{{- end -}}

{{/* The ServiceAccount's user name, as the API server authenticates its tokens. */}}
{{- define "memwatch.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "memwatch.serviceAccountName" .) -}}
{{- end -}}

{{/* One TOML table's keys: `key = value`, values as JSON (valid TOML for strings, numbers, booleans). */}}
{{- define "memwatch.tomlKeys" -}}
{{- range $key, $value := . }}
{{ $key }} = {{ $value | toJson }}
{{- end }}
{{- end -}}

{{/*
The token scopes: (scope, its values, its config key). Each scope's token is
mounted as the file /var/run/memwatch-token/<scope>.
*/}}
{{- define "memwatch.tokenScopes" -}}
{{- $v := .Values -}}
{{- list (list "admin" $v.apiToken "api_token_file") (list "task" $v.taskToken "task_token_file") (list "read" $v.readToken "read_token_file") | toJson -}}
{{- end -}}

{{/* The Secret the chart makes for the scopes given no existingSecret. */}}
{{- define "memwatch.tokenSecret" -}}
{{- printf "%s-tokens" (include "memwatch.fullname" .) -}}
{{- end -}}

{{/*
Whether a Prometheus operator kind is rendered: (enabled, root, kind).
`auto`: only when the cluster serves monitoring.coreos.com/v1 <kind>.
*/}}
{{- define "memwatch.operatorKind" -}}
{{- $enabled := index . 0 -}}
{{- $root := index . 1 -}}
{{- $kind := index . 2 -}}
{{- if eq (toString $enabled) "auto" -}}
{{- if $root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind) -}}true{{- end -}}
{{- else if eq (toString $enabled) "true" -}}true
{{- end -}}
{{- end -}}
