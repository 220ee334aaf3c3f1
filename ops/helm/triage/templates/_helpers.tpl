{{/* Names and labels shared by every object of the chart. */}}
{{- define "triage.fullname" -}}
{{ .Release.Name }}-triage
{{- end -}}

{{- define "triage.labels" -}}
app.kubernetes.io/name: triage
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "triage.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
