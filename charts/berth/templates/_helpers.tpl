{{/*
The name every object starts with: berth-controller, berth-webhook, ... for a
release named berth. Truncated so that the longest derived name
(<fullname>-controller-config-<hash>) stays a valid object name.
*/}}
{{- define "berth.fullname" -}}
{{- $name := .Values.fullnameOverride -}}
{{- if not $name -}}
{{- $name = ternary .Release.Name (printf "%s-berth" .Release.Name) (contains "berth" .Release.Name) -}}
{{- end -}}
{{- $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* The Secret holding the serving certificate of the three servers. */}}
{{- define "berth.tlsSecret" -}}
{{- .Values.tls.secretName | default (printf "%s-tls" (include "berth.fullname" .)) -}}
{{- end -}}

{{/*
Labels of every object: those of manifests/ (name, and component when given)
and Helm's own. Called with (dict "root" $ "component" "controller").
*/}}
{{- define "berth.labels" -}}
{{ include "berth.selectorLabels" . }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* What a component's Deployment, Service, PDB and NetworkPolicy select on. */}}
{{- define "berth.selectorLabels" -}}
app.kubernetes.io/name: berth
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{- define "berth.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
The controller's configuration file. Its hash is in the ConfigMap's name, as
kustomize's configMapGenerator does: a change rolls out new controller pods,
which read the file at start. The release namespace is always in
namespaces.exclude: the webhook never sees it, so no replacement there could
bind its Reservation.
*/}}
{{- define "berth.controllerConfig" -}}
{{- $config := deepCopy .Values.controller.config -}}
{{- $namespaces := $config.namespaces | default dict -}}
{{- $exclude := $namespaces.exclude | default list -}}
{{- if not (has .Release.Namespace $exclude) -}}
{{- $_ := set $namespaces "exclude" (append $exclude .Release.Namespace) -}}
{{- $_ := set $config "namespaces" $namespaces -}}
{{- end -}}
{{ toYaml $config }}
{{- end -}}

{{- define "berth.controllerConfigMap" -}}
{{ include "berth.fullname" . }}-controller-config-{{ include "berth.controllerConfig" . | sha256sum | trunc 10 }}
{{- end -}}

{{/*
The parts of a component's pod spec that are the same for all three. Called
with (dict "root" $ "component" "webhook").
*/}}
{{- define "berth.podSpec" -}}
serviceAccountName: {{ include "berth.fullname" .root }}-{{ .component }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A container's image, pull policy and securityContext. */}}
{{- define "berth.container" -}}
image: {{ include "berth.image" .root }}
{{- with .root.Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.securityContext | nindent 2 }}
{{- end -}}

{{/* A Deployment's PodDisruptionBudget, when its values enable it. */}}
{{- define "berth.pdb" -}}
{{- $values := index .root.Values .component -}}
{{- if $values.podDisruptionBudget.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "berth.fullname" .root }}-{{ .component }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "berth.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ $values.podDisruptionBudget.maxUnavailable }}
  # A replica that is not Ready serves nothing: evicting it never waits for the budget.
  unhealthyPodEvictionPolicy: AlwaysAllow
  selector:
    matchLabels:
      {{- include "berth.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{/*
The volumes of the webhook and the extender: the serving certificate, /tmp and,
with "config" true, the controller's configuration file. Called with
(dict "root" $ "config" true).
*/}}
{{- define "berth.volumes" -}}
# Issued by cert-manager, or the Secret created before the install.
- name: tls
  secret:
    secretName: {{ include "berth.tlsSecret" .root }}
{{- if .config }}
# The controller's ConfigMap: its name carries a hash of the file, so a change
# rolls out new pods of both.
- name: config
  configMap:
    name: {{ include "berth.controllerConfigMap" .root }}
{{- end }}
# The root filesystem is read-only; anything that needs a scratch file
# (Python's tempfile) gets this.
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{- define "berth.volumeMounts" -}}
- name: tls
  mountPath: /etc/berth/tls
  readOnly: true
{{- if .config }}
- name: config
  mountPath: /etc/berth/config
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* Probes of a server on its https port, and its stop. */}}
{{- define "berth.probes" -}}
livenessProbe:
  httpGet:
    scheme: HTTPS
    path: /healthz
    port: https
  periodSeconds: 10
readinessProbe:
  httpGet:
    scheme: HTTPS
    path: /readyz
    port: https
  periodSeconds: 5
# The Service's endpoints drop a terminating pod a moment after it is told to
# stop: it serves that moment on (SIGTERM comes after this sleep), so that a
# call routed to it meanwhile is still answered.
lifecycle:
  preStop:
    sleep:
      seconds: 5
{{- end -}}

{{/* Preferred anti-affinity, so that the two replicas run on two nodes when they can. */}}
{{- define "berth.spread" -}}
affinity:
  podAntiAffinity:
    # Preferred, not required: a one-node cluster still runs both.
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "berth.selectorLabels" . | nindent 14 }}
{{- end -}}
