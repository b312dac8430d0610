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

{{/* A duration as the configuration writes it (60s, 1m30s, 250ms, 2h) in milliseconds;
fails naming the key when it is not one. Args: (list KEY VALUE). */}}
{{- define "holdwarden.durationMillis" -}}
{{- $key := index . 0 -}}
{{- $text := toString (index . 1) -}}
{{- $pattern := "^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?$" -}}
{{- if or (eq $text "") (not (regexMatch $pattern $text)) -}}
{{- fail (printf "values: %s is %q, not a duration; write it like 60s, 1m30s or 250ms" $key $text) -}}
{{- end -}}
{{- $h := regexReplaceAll $pattern $text "${1}" | default "0" | atoi -}}
{{- $m := regexReplaceAll $pattern $text "${2}" | default "0" | atoi -}}
{{- $s := regexReplaceAll $pattern $text "${3}" | default "0" | atoi -}}
{{- $ms := regexReplaceAll $pattern $text "${4}" | default "0" | atoi -}}
{{- add (mul $h 3600000) (mul $m 60000) (mul $s 1000) $ms -}}
{{- end -}}

{{/* The enforcer Pod's terminationGracePeriodSeconds: the preStop sleep, then after
SIGTERM the shutdown delay and at most the drain, and 5 s for the exit and the audit
flush (docs/enforcer.md, "Graceful shutdown"), so that a raised shutdownDelay or
drainTimeout never has the kubelet kill a Pod mid-drain. The fallbacks are holdwarden's
own defaults for keys left out (tests/controlplane/test_chart.py checks they agree). */}}
{{- define "holdwarden.enforcerGraceSeconds" -}}
{{- $hook := .Values.config.webhook | default dict -}}
{{- $delay := include "holdwarden.durationMillis" (list "config.webhook.shutdownDelay" ($hook.shutdownDelay | default "5s")) | atoi -}}
{{- $drain := include "holdwarden.durationMillis" (list "config.webhook.drainTimeout" ($hook.drainTimeout | default "15s")) | atoi -}}
{{- $millis := add (mul (include "holdwarden.preStopSeconds" .) 1000) $delay $drain 5000 -}}
{{- div (add $millis 999) 1000 -}}
{{- end -}}

{{/* The enforcer container's preStop sleep: endpoints and kube-proxy drop the Pod first. */}}
{{- define "holdwarden.preStopSeconds" -}}5{{- end -}}
