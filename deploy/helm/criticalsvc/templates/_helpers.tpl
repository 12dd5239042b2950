{{/*
Every object's labels: the bundle's own (app.kubernetes.io/name, which the selectors use) plus
Helm's standard labels (https://helm.sh/docs/chart_best_practices/labels/). Selectors keep only
app.kubernetes.io/name: they are immutable, and deploy/ selects by it alone.
*/}}
{{- define "criticalsvc.labels" -}}
app.kubernetes.io/name: criticalsvc
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The gate's Service DNS name, as the API server calls it and the serving certificate names it. */}}
{{- define "criticalsvc.serviceNames" -}}
{{- $ns := .Release.Namespace -}}
{{- list "criticalsvc" (printf "criticalsvc.%s" $ns) (printf "criticalsvc.%s.svc" $ns) (printf "criticalsvc.%s.svc.cluster.local" $ns) | toJson -}}
{{- end }}
