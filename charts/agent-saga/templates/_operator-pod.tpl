{{/*
The operator's pod template, shared by operator-deployment.yaml (one replica) and
operator-statefulset.yaml (several replicas, kopf peering with distinct priorities).

Priorities: kopf pauses every replica that sees a live peer of higher priority, and all
of them when two share the highest. One replica runs with priority 0 (during a rolling
update the old and the new pod pause each other until the old one exits and removes its
peering record). Several replicas run as a StatefulSet and take the priority
-<pod index> from the apps.kubernetes.io/pod-index label: pod 0 leads, the others stand by
and take over (highest priority first) when it is gone for the peering lifetime (60 s).
*/}}
{{- define "agent-saga.operator.podTemplate" -}}
{{- $sts := gt (int .Values.operator.replicas) 1 -}}
{{- $o := .Values.operator -}}
metadata:
  labels:
    {{- include "agent-saga.labels" (list . "operator") | nindent 4 }}
    {{- with $o.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    kubectl.kubernetes.io/default-container: operator
    {{- with $o.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "agent-saga.operator.serviceAccountName" . }}
  # The operator talks to the API server with this token; it is the only component that does.
  automountServiceAccountToken: true
  enableServiceLinks: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $o.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ $o.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml $o.podSecurityContext | nindent 4 }}
  containers:
    - name: operator
      image: {{ include "agent-saga.image" (list $o.image .) }}
      imagePullPolicy: {{ $o.image.pullPolicy }}
      command: ["python", "-m", "agent_saga_operator"]
      args:
        {{- if $o.peering.enabled }}
        - --peering={{ include "agent-saga.peeringName" . }}
        {{- if $sts }}
        - --priority=-$(POD_INDEX)
        {{- else }}
        - --priority=0
        {{- end }}
        {{- else }}
        - --standalone
        {{- end }}
        {{- range $o.watchNamespaces }}
        - --namespace={{ . }}
        {{- end }}
        - --key-prefix={{ .Values.policyPlane.keyPrefix }}
        - --limit-store-namespace={{ .Values.policyPlane.limitStoreNamespace }}
        - --resync-interval={{ $o.resyncInterval }}
        - --usage-interval={{ $o.usageInterval }}
        - --approval-poll-interval={{ $o.approvalPollInterval }}
        {{- if gt (int $o.approvalTtlSecondsAfterFinished) 0 }}
        - --approval-ttl-after-finished={{ $o.approvalTtlSecondsAfterFinished }}
        {{- end }}
        - --health-port={{ $o.ports.health }}
        - --metrics-port={{ $o.ports.metrics }}
        - --log-level={{ $o.logLevel }}
        {{- if .Values.approvals.signing.enabled }}
        - --approval-signing-key=/etc/agent-saga/approval-signing/signing-key.pem
        {{- end }}
        {{- if .Values.approvals.signing.approverKeys }}
        - --approval-keys=/etc/agent-saga/approver-keys
        {{- end }}
        {{- if and .Values.approvals.signing.enabled .Values.approvals.signing.agentKeys.enabled }}
        - --approval-keys-configmap={{ .Release.Namespace }}/{{ include "agent-saga.componentName" (list . "approval-keys") }}
        {{- end }}
        {{- if .Values.approvals.admission.enabled }}
        - --approver-admission={{ include "agent-saga.componentName" (list . "approver-is-requester") }}
        {{- end }}
        {{- range $o.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      env:
        # kopf's peer identity: the pod name, so `kubectl get clusterkopfpeerings -o yaml`
        # says which pod leads.
        - name: POD_ID
          valueFrom:
            fieldRef:
              fieldPath: metadata.name
        {{- if $sts }}
        - name: POD_INDEX
          valueFrom:
            fieldRef:
              fieldPath: metadata.labels['apps.kubernetes.io/pod-index']
        {{- end }}
        {{- include "agent-saga.redis.env" . | trim | nindent 8 }}
        - name: PYTHONUNBUFFERED
          value: "1"
        {{- with $o.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      ports:
        - name: health
          containerPort: {{ $o.ports.health }}
          protocol: TCP
        - name: metrics
          containerPort: {{ $o.ports.metrics }}
          protocol: TCP
      {{- with $o.startupProbe }}
      startupProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $o.livenessProbe }}
      livenessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $o.readinessProbe }}
      readinessProbe:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      resources:
        {{- toYaml $o.resources | nindent 8 }}
      securityContext:
        {{- toYaml $o.securityContext | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        {{- if .Values.approvals.signing.enabled }}
        - name: approval-signing
          mountPath: /etc/agent-saga/approval-signing
          readOnly: true
        {{- end }}
        {{- if .Values.approvals.signing.approverKeys }}
        - name: approver-keys
          mountPath: /etc/agent-saga/approver-keys
          readOnly: true
        {{- end }}
  volumes:
    # The root filesystem is read-only; Python and aiohttp may want a scratch directory.
    - name: tmp
      emptyDir:
        sizeLimit: 64Mi
    {{- if .Values.approvals.signing.enabled }}
    - name: approval-signing
      secret:
        secretName: {{ .Values.approvals.signing.existingSecret | default (include "agent-saga.componentName" (list . "approval-signing")) }}
        # Readable by the pod's fsGroup (the operator runs as a non-root user).
        defaultMode: 0440
    {{- end }}
    {{- if .Values.approvals.signing.approverKeys }}
    - name: approver-keys
      configMap:
        name: {{ include "agent-saga.componentName" (list . "approver-keys") }}
    {{- end }}
  {{- with $o.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $o.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $o.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $o.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
