{{/* The chart's name. */}}
{{- define "trellis.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: names every object, the ClusterRole and the Lease.
The release name alone when it already contains the chart's name.
*/}}
{{- define "trellis.fullname" -}}
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

{{- define "trellis.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trellis.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "trellis.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "trellis.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "trellis.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trellis.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trellis.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "trellis.fullname" .)) .Values.rules.existingConfigMap }}
{{- end }}

{{/*
The rule files the chart ships, path -> content, as JSON: the examples
(files/rules/, a copy of the repository's rules/) unless rules.examples is
false, then rules.files over them.
*/}}
{{- define "trellis.ruleFiles" -}}
{{- $files := dict }}
{{- if .Values.rules.examples }}
{{- range $path, $_ := .Files.Glob "files/rules/**" }}
{{- $_ := set $files (trimPrefix "files/rules/" $path) ($.Files.Get $path) }}
{{- end }}
{{- end }}
{{- range $path, $text := .Values.rules.files }}
{{- $_ := set $files $path $text }}
{{- end }}
{{- toJson $files }}
{{- end }}

{{/* A rule file's ConfigMap key: keys are flat, so `/` is spelled `.`. */}}
{{- define "trellis.ruleKey" -}}
{{- . | replace "/" "." }}
{{- end }}
