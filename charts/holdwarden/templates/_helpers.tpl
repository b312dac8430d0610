{{/* Labels every object carries; component is the part it belongs to. */}}
{{- define "holdwarden.labels" -}}
app.kubernetes.io/name: holdwarden
app.kubernetes.io/component: {{ . }}
app.kubernetes.io/part-of: holdwarden
{{- end -}}

{{/* The selector of the Pods that run the enforcer: its own, or the supervisor's with
the sidecar. */}}
{{- define "holdwarden.selector" -}}
app.kubernetes.io/name: holdwarden
app.kubernetes.io/component: {{ if .Values.sidecar.enabled }}supervisor{{ else }}enforcer{{ end }}
{{- end -}}

{{/* The configuration file, with the readmission gate when it is enabled. */}}
{{- define "holdwarden.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.readmission.enabled -}}
{{- $_ := set $config "readmission" (dict "enabled" true "controllerName" .Values.readmission.controllerName "interval" .Values.readmission.interval "metricsAddress" "0.0.0.0:9091") -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
