{{/*
Names, labels, images and the Redis connection shared by every template.

Invariants:
- every object carries the same five recommended labels plus its component;
- selectors use only name, instance and component (immutable across upgrades);
- a Redis password is only ever read from a Secret (secretKeyRef), never from values.
*/}}

{{- define "agent-saga.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "agent-saga.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "agent-saga.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of one component's objects: <fullname>-<component>, at most 63 characters. */}}
{{- define "agent-saga.componentName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "agent-saga.fullname" $root | trunc (int (sub 62 (len (index . 1))))) (index . 1) | trimSuffix "-" -}}
{{- end -}}

{{- define "agent-saga.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "agent-saga.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels of every object of a component: (list $ "operator"). */}}
{{- define "agent-saga.labels" -}}
{{- $root := index . 0 -}}
{{ include "agent-saga.selectorLabels" . }}
app.kubernetes.io/part-of: agent-saga
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ include "agent-saga.chart" $root }}
{{- with $root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* An image reference: repository[:tag][@digest]; the tag defaults to the appVersion. */}}
{{- define "agent-saga.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- $ref := $image.repository -}}
{{- if $image.registry -}}
{{- $ref = printf "%s/%s" $image.registry $image.repository -}}
{{- end -}}
{{- $tag := $image.tag | default $root.Chart.AppVersion -}}
{{- if $image.digest -}}
{{- printf "%s:%s@%s" $ref $tag $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref $tag -}}
{{- end -}}
{{- end -}}

{{- define "agent-saga.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "agent-saga.componentName" (list . "operator")) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create=false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "agent-saga.recoveryd.serviceAccountName" -}}
{{- if .Values.recoveryd.serviceAccount.create -}}
{{- default (include "agent-saga.componentName" (list . "recoveryd")) .Values.recoveryd.serviceAccount.name -}}
{{- else -}}
{{- required "recoveryd.serviceAccount.name is required when recoveryd.serviceAccount.create=false" .Values.recoveryd.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "agent-saga.agent.serviceAccountName" -}}
{{- default (include "agent-saga.componentName" (list . "agent")) .Values.agentServiceAccount.name -}}
{{- end -}}

{{/* The kopf peering object's name (ClusterKopfPeering, or KopfPeering per watched namespace). */}}
{{- define "agent-saga.peeringName" -}}
{{- default (include "agent-saga.fullname" .) .Values.operator.peering.name -}}
{{- end -}}

{{/*
The policy plane. Cross-field rules the JSON schema cannot say with a readable message
are checked here and fail the render naming the value to set.
*/}}
{{- define "agent-saga.redis.secretName" -}}
{{- if .Values.redis.inChart.enabled -}}
{{- include "agent-saga.componentName" (list . "redis") -}}
{{- else -}}
{{- .Values.redis.auth.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "agent-saga.redis.passwordKey" -}}
{{- if .Values.redis.inChart.enabled -}}redis-password{{- else -}}{{- .Values.redis.auth.passwordKey -}}{{- end -}}
{{- end -}}

{{- define "agent-saga.redis.validate" -}}
{{- if or (hasKey .Values.redis "password") (hasKey .Values.redis.auth "password") -}}
{{- fail "redis.password (or redis.auth.password) is not a value (a password in values ends up in the release Secret and in helm get values): put it in a Secret, kubectl -n NAMESPACE create secret generic agent-saga-redis --from-literal=redis-password=PASSWORD, and set redis.auth.existingSecret=agent-saga-redis (docs/install.md, Install)" -}}
{{- end -}}
{{- if and .Values.redis.inChart.enabled .Values.redis.auth.existingSecret -}}
{{- fail "redis.inChart.enabled=true generates its own password Secret: leave redis.auth.existingSecret empty (or use your own Redis with redis.inChart.enabled=false)" -}}
{{- end -}}
{{- $topology := .Values.redis.topology | default "single" -}}
{{- if and (eq $topology "sentinel") (not .Values.redis.inChart.enabled) (not .Values.redis.auth.urlKey) (not .Values.redis.sentinel.hosts) -}}
{{- fail "redis.topology=sentinel needs redis.sentinel.hosts (host:port of each Sentinel) and redis.sentinel.service (the monitored primary's name)" -}}
{{- end -}}
{{- if and (eq $topology "cluster") (not .Values.redis.inChart.enabled) -}}
{{- if and (not .Values.redis.auth.urlKey) (not .Values.redis.cluster.hosts) -}}
{{- fail "redis.topology=cluster needs redis.cluster.hosts (host:port of some cluster nodes)" -}}
{{- end -}}
{{- if ne (int .Values.redis.db) 0 -}}
{{- fail "redis.topology=cluster: a Redis Cluster has only database 0, set redis.db: 0" -}}
{{- end -}}
{{- if not (contains "{" .Values.policyPlane.keyPrefix) -}}
{{- fail "redis.topology=cluster: set policyPlane.keyPrefix to a hash tag such as \"{agentsaga}\" so the policy plane's scripts keep their keys in one cluster slot" -}}
{{- end -}}
{{- range .Values.recoveryd.wal.redisKeys -}}
{{- if not (contains "{" .) -}}
{{- fail (printf "redis.topology=cluster: recoveryd.wal.redisKeys entry %q needs a hash tag such as \"{agent-saga}:wal\" (a WAL's keys must share one cluster slot)" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.redis.auth.urlKey (not .Values.redis.auth.existingSecret) -}}
{{- fail "redis.auth.urlKey names a key of redis.auth.existingSecret: set redis.auth.existingSecret too" -}}
{{- end -}}
{{- if and (not .Values.redis.inChart.enabled) (not .Values.redis.host) (not .Values.redis.auth.urlKey) -}}
{{- fail "set redis.host (your Redis), or redis.auth.existingSecret + redis.auth.urlKey (a URL kept in a Secret), or redis.inChart.enabled=true (a throwaway Redis for trials, NOT FOR PRODUCTION)" -}}
{{- end -}}
{{- end -}}

{{/*
Environment giving a container the policy plane's URL as AGENT_SAGA_REDIS_URL.
The password comes from the Secret into AGENT_SAGA_REDIS_PASSWORD and is spliced into the
URL by the kubelet's $(VAR) expansion: the pod spec shows only "$(AGENT_SAGA_REDIS_PASSWORD)".
*/}}
{{- define "agent-saga.redis.env" -}}
{{- include "agent-saga.redis.validate" . -}}
{{- $secret := include "agent-saga.redis.secretName" . -}}
{{- if and .Values.redis.auth.urlKey (not .Values.redis.inChart.enabled) }}
- name: AGENT_SAGA_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.redis.auth.urlKey }}
{{- else }}
{{- $host := .Values.redis.host -}}
{{- $port := int .Values.redis.port -}}
{{- $scheme := ternary "rediss" "redis" .Values.redis.tls -}}
{{- $db := int .Values.redis.db -}}
{{- if .Values.redis.inChart.enabled -}}
{{- $host = include "agent-saga.componentName" (list . "redis") -}}
{{- $port = 6379 -}}
{{- $scheme = "redis" -}}
{{- end -}}
{{- $userinfo := "" -}}
{{- if $secret }}
- name: AGENT_SAGA_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "agent-saga.redis.passwordKey" . }}
{{- $userinfo = printf "%s:$(AGENT_SAGA_REDIS_PASSWORD)@" (.Values.redis.auth.username | default "") -}}
{{- else if .Values.redis.auth.username -}}
{{- $userinfo = printf "%s@" .Values.redis.auth.username -}}
{{- end }}
{{- $topology := .Values.redis.topology | default "single" -}}
{{- if .Values.redis.inChart.enabled -}}{{- $topology = "single" -}}{{- end }}
- name: AGENT_SAGA_REDIS_URL
{{- if eq $topology "sentinel" }}
  value: {{ printf "%s+sentinel://%s%s/%s%s" $scheme $userinfo (join "," .Values.redis.sentinel.hosts) .Values.redis.sentinel.service (ternary "" (printf "?db=%d" $db) (eq $db 0)) | quote }}
{{- else if eq $topology "cluster" }}
  value: {{ printf "%s+cluster://%s%s" $scheme $userinfo (join "," .Values.redis.cluster.hosts) | quote }}
{{- else }}
  value: {{ printf "%s://%s%s:%d/%d" $scheme $userinfo $host $port $db | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* recoveryd's default anti-affinity: spread replicas over nodes (soft or hard). */}}
{{- define "agent-saga.recoveryd.affinity" -}}
{{- if .Values.recoveryd.affinity -}}
{{- toYaml .Values.recoveryd.affinity -}}
{{- else if eq .Values.recoveryd.podAntiAffinityPreset "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "agent-saga.selectorLabels" (list . "recoveryd") | nindent 12 }}
{{- else if eq .Values.recoveryd.podAntiAffinityPreset "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "agent-saga.selectorLabels" (list . "recoveryd") | nindent 10 }}
{{- end -}}
{{- end -}}

{{/*
recoveryd's logs: a RedisWAL per key on the policy-plane Redis ($(AGENT_SAGA_REDIS_URL)?key=K),
plus the comma-separated URLs kept in recoveryd.wal.existingSecret (PostgreSQL, another Redis).
*/}}
{{- define "agent-saga.recoveryd.walUrls" -}}
{{- $w := .Values.recoveryd.wal -}}
{{- $urls := list -}}
{{- $sep := "?" -}}
{{- if and (eq (.Values.redis.topology | default "single") "sentinel") (ne (int .Values.redis.db) 0) (not .Values.redis.inChart.enabled) -}}
{{- $sep = "&" -}}{{/* the Sentinel URL carries ?db=N */}}
{{- end -}}
{{- $wait := int ($w.waitReplicas | default 0) -}}
{{- if and $wait (eq (.Values.redis.topology | default "single") "cluster") (not .Values.redis.inChart.enabled) -}}
{{- fail "recoveryd.wal.waitReplicas is not available on a Redis Cluster (WAIT must run on the connection that wrote); use redis.topology=sentinel, or waitReplicas: 0" -}}
{{- end -}}
{{- range $w.redisKeys -}}
{{- $urls = append $urls (printf "$(AGENT_SAGA_REDIS_URL)%skey=%s%s" $sep . (ternary (printf "&wait_replicas=%d" $wait) "" (gt $wait 0))) -}}
{{- end -}}
{{- if $w.existingSecret -}}
{{- $urls = append $urls "$(AGENT_SAGA_WAL_URLS)" -}}
{{- end -}}
{{- if not $urls -}}
{{- fail "recoveryd has no log to recover: set recoveryd.wal.redisKeys (RedisWAL keys on the policy-plane Redis) or recoveryd.wal.existingSecret + recoveryd.wal.urlsKey (comma-separated WAL URLs)" -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/*
ServiceMonitors are rendered only where the Prometheus Operator's CRD is served: asked for
(metrics.serviceMonitor.enabled) on a cluster without it, the install still succeeds and
NOTES.txt says why there is no ServiceMonitor. "true" or empty.
*/}}
{{- define "agent-saga.serviceMonitor.render" -}}
{{- if and .Values.metrics.serviceMonitor.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/ServiceMonitor") -}}
true
{{- end -}}
{{- end -}}

{{/*
The alert rules are rendered as a PrometheusRule only where the Prometheus Operator's CRD is
served (metrics.prometheusRule.enabled, on by default): elsewhere the install succeeds
without it, and deploy/prometheus/ holds the same rules as a plain rules file. "true" or empty.
*/}}
{{- define "agent-saga.prometheusRule.render" -}}
{{- if and .Values.metrics.prometheusRule.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") -}}
true
{{- end -}}
{{- end -}}
