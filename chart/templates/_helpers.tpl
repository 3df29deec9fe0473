{{/*
Every runner object is called telo-k8s-runner, whatever the release is called:
the self URL, the session NetworkPolicy and the Service address baked into
session pods all assume that one name, so there is exactly one runner per
namespace pair.
*/}}
{{- define "telo-runner.name" -}}
telo-k8s-runner
{{- end -}}

{{- define "telo-runner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "telo-runner.name" . }}
{{- end -}}

{{- define "telo-runner.labels" -}}
{{ include "telo-runner.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "telo-runner.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The address session init containers fetch their bundle from. */}}
{{- define "telo-runner.selfUrl" -}}
{{- if .Values.runner.selfUrl -}}
{{ trimSuffix "/" .Values.runner.selfUrl }}
{{- else -}}
http://{{ include "telo-runner.name" . }}.{{ .Release.Namespace }}.svc:{{ .Values.runner.port }}
{{- end -}}
{{- end -}}

{{/*
The TLS Secret session Ingresses reference, or nothing. Under Gateway API the
certificate lives on the Gateway listener, so whenever the Gateway can be the
layer (mode gateway, or a gateway named and the mode not pinned to ingress)
there is none: the runner refuses a TLS Secret it would silently ignore.
*/}}
{{- define "telo-runner.sessionIngressTlsSecretName" -}}
{{- $routing := .Values.sessionRouting -}}
{{- $tls := $routing.ingress.tls -}}
{{- $gatewayLayer := or (eq $routing.mode "gateway") (and $routing.gateway.name (ne $routing.mode "ingress")) -}}
{{- if not $gatewayLayer -}}
{{- if and $tls.cert $tls.key -}}
{{ include "telo-runner.name" . }}-ingress-tls
{{- else if $tls.secretName -}}
{{ $tls.secretName }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the replicas' shared peer token. */}}
{{- define "telo-runner.peerSecretName" -}}
{{- .Values.replication.existingSecret | default (printf "%s-peer-token" (include "telo-runner.name" .)) -}}
{{- end -}}

{{/* The app catalog as JSON text: given as text, or as a map to encode. */}}
{{- define "telo-runner.appCatalogJson" -}}
{{- $catalog := .Values.apps.catalog -}}
{{- if kindIs "map" $catalog -}}
{{ toJson $catalog }}
{{- else -}}
{{ $catalog }}
{{- end -}}
{{- end -}}

{{/*
A name/value env entry; the value is always a string. Whole numbers from a
values file arrive as floats, which would print as 1.048576e+06: print them
as integers.
*/}}
{{- define "telo-runner.env" -}}
{{- $value := index . 1 -}}
{{- if and (kindIs "float64" $value) (eq (float64 (int64 $value)) $value) -}}
{{- $value = int64 $value -}}
{{- end -}}
- name: {{ index . 0 }}
  value: {{ $value | toString | quote }}
{{- end -}}
