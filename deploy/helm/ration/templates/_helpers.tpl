{{/*
Labels of every object's metadata: Helm's own, and the region (Prometheus
copies ration.dev/region onto every series as region). Selectors never
use them: they stay those of deploy/kubernetes.
*/}}
{{- define "ration.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{ include "ration.regionLabel" . }}
{{- end }}

{{- define "ration.regionLabel" -}}
ration.dev/region: {{ include "ration.region" . }}
{{- end }}

{{/* The region, checked: required, and a name the rules file accepts. */}}
{{- define "ration.region" -}}
{{- $r := required "region is required: the region this release serves (\"global\" for the global coordinator group)" .Values.region -}}
{{- if not (regexMatch "^[a-z0-9][a-z0-9_-]{0,31}$" $r) -}}
{{- fail (printf "region %q: want [a-z0-9][a-z0-9_-]{0,31}, as the rules file's region names" $r) -}}
{{- end -}}
{{ $r }}
{{- end }}

{{/* image reference of a Ration image: registry, repository, tag. */}}
{{- define "ration.image" -}}
{{- $img := index .root.Values.images .name -}}
{{- $repo := $img.repository -}}
{{- with .root.Values.images.registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end -}}
{{ $repo }}:{{ $img.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/*
extraEnv of a container, checked: the variables the chart sets itself are
refused (defined twice, Kubernetes keeps the last one, silently). Renders
the list, for nindent.
*/}}
{{- define "ration.extraEnv" -}}
{{- range .env }}
{{- if has .name $.set }}
{{- fail (printf "%s: %s is set by the chart: use its value instead" $.what .name) }}
{{- end }}
{{- end }}
{{- with .env }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* The coordinator pods' ids, comma separated, for a replica count. */}}
{{- define "ration.initialMembers" -}}
{{- $ids := list -}}
{{- range $i := until (int .) -}}{{- $ids = append $ids (printf "coordinator-%d" $i) -}}{{- end -}}
{{ join "," $ids }}
{{- end }}
