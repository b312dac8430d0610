{{/* Labels every object carries; component is the part it belongs to. */}}
{{- define "holdwarden.labels" -}}
app.kubernetes.io/name: holdwarden
app.kubernetes.io/component: {{ . }}
app.kubernetes.io/part-of: holdwarden
{{- end -}}

{{/* The enforcer Pods' selector. */}}
{{- define "holdwarden.selector" -}}
app.kubernetes.io/name: holdwarden
app.kubernetes.io/component: enforcer
{{- end -}}

{{/* The configuration file, with the readmission gate when it is enabled. */}}
{{- define "holdwarden.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.readmission.enabled -}}
{{- $_ := set $config "readmission" (dict "enabled" true "controllerName" .Values.readmission.controllerName "interval" .Values.readmission.interval) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}
