{{/*
The effector mode for your own agent Deployments: `agent-saga mcp` as a native sidecar, the
only holder of the upstream's credential and of the policy plane's Redis credential, in
front of your application container (docs/install.md, "The effector mode").

A chart that depends on agent-saga includes three templates in its pod spec:

  spec:
    {{- include "agent-saga.effectorPodSettings" $e | nindent 6 }}
    initContainers:
      {{- include "agent-saga.effectorSidecar" $e | nindent 8 }}
    containers:
      - name: app                  # yours: MCP_SERVER_URL=http://127.0.0.1:<port>/mcp, its own UID
    volumes:
      {{- include "agent-saga.effectorVolumes" $e | nindent 8 }}

where $e is a dict:
  image              the image carrying the agent-saga command (required; the recoveryd image)
  agent              the agent's name: AGENT_SAGA_AGENT, what the SagaPolicy's appliesTo matches (required)
  name               the upstream's name in the upstreams ConfigMap (required)
  upstream           the upstream's Streamable HTTP MCP endpoint URL (required)
  credentialsSecret  the Secret holding the upstream's credential (required)
  upstreamsConfigMap the ConfigMap with mcp-upstreams.json, naming the credentialRef (required)
  credentialItems    list of {key, path}: Secret key -> credentialRef file name (default: every key, by its name)
  policy             NS/NAME of the SagaPolicy (default $(AGENT_SAGA_NAMESPACE)/<agent>)
  port               the proxy's loopback port (default 8931)
  redisSecret        the Secret with the Redis password (default agent-saga-redis)
  redisPasswordKey   its key (default agent-password: the chart's least-privilege agent user)
  redisUser          the Redis user (default agent-saga-agent)
  redisHost          host:port of the policy plane's Redis (default agent-saga-redis:6379)
  walStream          the WAL stream recoveryd sweeps (default agent-saga:wal)
  sessionIdle        seconds before an idle session is dropped and compensated (default 300)
  proxyUser          the proxy's UID and GID, also the pod's fsGroup (default 65532); the app must run as another
*/}}

{{- define "agent-saga.effectorSidecar" -}}
{{- $agent := required "agent-saga.effectorSidecar: set agent (the agent's name, AGENT_SAGA_AGENT)" .agent -}}
{{- $port := int (default 8931 .port) -}}
{{- $uid := int (default 65532 .proxyUser) -}}
- name: agent-saga-mcp
  image: {{ required "agent-saga.effectorSidecar: set image (an image carrying the agent-saga command, e.g. the recoveryd image)" .image }}
  restartPolicy: Always
  command:
    - agent-saga
    - mcp
    - --policy-from-plane={{ default (printf "$(AGENT_SAGA_NAMESPACE)/%s" $agent) .policy }}
    - --name={{ required "agent-saga.effectorSidecar: set name (the upstream's name in mcp-upstreams.json)" .name }}
    - --listen=127.0.0.1:{{ $port }}
    - --upstream={{ required "agent-saga.effectorSidecar: set upstream (the server's MCP endpoint URL)" .upstream }}
    - --session-idle={{ default 300 .sessionIdle }}
  env:
    - name: AGENT_SAGA_MCP_UPSTREAMS
      value: /etc/agent-saga/mcp-upstreams.json
    - name: AGENT_SAGA_CREDENTIALS_DIR
      value: /var/run/secrets/agent-saga/credentials
    - name: REDIS_AGENT_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ default "agent-saga-redis" .redisSecret }}
          key: {{ default "agent-password" .redisPasswordKey }}
    - name: AGENT_SAGA_REDIS_URL
      value: {{ printf "redis://%s:$(REDIS_AGENT_PASSWORD)@%s/0" (default "agent-saga-agent" .redisUser) (default "agent-saga-redis:6379" .redisHost) | quote }}
    - name: AGENT_SAGA_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    - name: AGENT_SAGA_AGENT
      value: {{ $agent | quote }}
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: AGENT_SAGA_WAL_STREAM
      value: {{ default "agent-saga:wal" .walStream | quote }}
  startupProbe:
    exec:
      command: ["python", "-c", "import socket; socket.create_connection(('127.0.0.1', {{ $port }}), 1)"]
    periodSeconds: 1
    failureThreshold: 120
  resources:
    requests: {cpu: 50m, memory: 64Mi}
    limits: {memory: 256Mi}
  securityContext:
    runAsUser: {{ $uid }}
    runAsGroup: {{ $uid }}
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: agent-saga-credentials
      mountPath: /var/run/secrets/agent-saga/credentials
      readOnly: true
    - name: agent-saga-mcp-upstreams
      mountPath: /etc/agent-saga
      readOnly: true
    - name: agent-saga-mcp-tmp
      mountPath: /tmp
{{- end -}}

{{- define "agent-saga.effectorVolumes" -}}
- name: agent-saga-credentials
  secret:
    secretName: {{ required "agent-saga.effectorVolumes: set credentialsSecret (the Secret holding the upstream's credential)" .credentialsSecret }}
    defaultMode: 0440
    {{- with .credentialItems }}
    items:
      {{- toYaml . | nindent 6 }}
    {{- end }}
- name: agent-saga-mcp-upstreams
  configMap:
    name: {{ required "agent-saga.effectorVolumes: set upstreamsConfigMap (the ConfigMap with mcp-upstreams.json)" .upstreamsConfigMap }}
- name: agent-saga-mcp-tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{- define "agent-saga.effectorPodSettings" -}}
automountServiceAccountToken: false
shareProcessNamespace: false
enableServiceLinks: false
securityContext:
  runAsNonRoot: true
  fsGroup: {{ int (default 65532 .proxyUser) }}
  seccompProfile:
    type: RuntimeDefault
{{- end -}}
