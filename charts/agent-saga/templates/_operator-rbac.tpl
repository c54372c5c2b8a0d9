{{/*
The operator's permissions, one rule list for both scopes (ClusterRole when it watches
the whole cluster, a Role per watched namespace otherwise). What each rule is for:

- agentsaga.dev kinds: list + watch (kopf's watch streams), patch (finalizer and kopf's
  progress annotations, merge- and JSON-patch); .../status: patch (conditions,
  observedGeneration, revision).
- get on every kind but budgetlimits: the acknowledgement writer re-reads a KillSwitch,
  SagaPolicy or ModelRoute for its resourceVersion before it patches what the agents'
  heartbeats show (Acknowledged, ACKED), and the approval bridge re-reads an Approval to
  reflect a decision made with the CLI.
- approvals also: create (the approval bridge mirrors each runtime request into an
  Approval named after it); delete only with operator.approvalTtlSecondsAfterFinished > 0
  (finished Approvals are removed that long after their decision). No update on any kind,
  no delete on the others, and no create on the others.
- events: create (kopf.event: Engaged, Invalid, Removed, ...). Nothing else in core.
- kopf.dev peerings: list + watch all (kopf watches the kind), patch only our own
  object (its keep-alive record in status).
No Secrets, Pods or Leases: Redis credentials come from the pod's env, and kopf peering
replaces leader-election leases. One ConfigMap, by name, in the release's namespace
(operator-role.yaml): get + patch of <release>-approval-keys, where the operator writes the
approver keys it publishes for agents to mount (approvals.signing.agentKeys).
*/}}
{{- define "agent-saga.operator.rules" -}}
{{- $peeringKind := index . 1 -}}
{{- $root := index . 0 -}}
- apiGroups: ["agentsaga.dev"]
  resources: ["killswitches", "budgetlimits", "sagapolicies", "approvals", "modelroutes"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["agentsaga.dev"]
  resources: ["killswitches", "sagapolicies", "approvals", "modelroutes"]
  verbs: ["get"]
- apiGroups: ["agentsaga.dev"]
  resources: ["approvals"]
  verbs: ["create"]
{{- if gt (int $root.Values.operator.approvalTtlSecondsAfterFinished) 0 }}
- apiGroups: ["agentsaga.dev"]
  resources: ["approvals"]
  verbs: ["delete"]
{{- end }}
- apiGroups: ["agentsaga.dev"]
  resources: ["killswitches/status", "budgetlimits/status", "sagapolicies/status", "approvals/status", "modelroutes/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if $root.Values.operator.peering.enabled }}
- apiGroups: ["kopf.dev"]
  resources: [{{ $peeringKind | quote }}]
  verbs: ["list", "watch"]
- apiGroups: ["kopf.dev"]
  resources: [{{ $peeringKind | quote }}]
  resourceNames: [{{ include "agent-saga.peeringName" $root | quote }}]
  verbs: ["patch"]
{{- end }}
{{- end -}}
