{{/*
The operator's rules for the objects it watches (pods of this scheduler, SchedulingPolicies, events,
kopf's peering). Rendered into the operator's ClusterRole when it watches the whole cluster
(operator.watchNamespaces empty), else into one Role per watched namespace — so with
watchNamespaces the operator can patch no pod outside those namespaces (docs/security.md).
*/}}
{{- define "rl-scheduler.operator.watchRules" -}}
# pods: list/watch for kopf's pod watch (the pending-pod index and decision outcomes; the watch is
# filtered by spec.schedulerName); patch for its three pod annotations, rlsched.io/requeue-attempt and
# rlsched.io/room-requeue (the update moves a waiting pod out of kube-scheduler's unschedulable pool) and
# rlsched.io/policy-rejected (the policy's reason). The admission policy (admission-policy.yaml) denies any other change.
# No get (list already returns every pod the operator looks at) and no pods/status: the rejection is
# an event plus that annotation, and kube-scheduler's own PodScheduled condition names the reason.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
{{- if .Values.operator.rebalancer.enabled }}
# pods/eviction: the rebalancer (operator.rebalancer.enabled) moves a pod by evicting it through the
# Eviction API, which enforces PodDisruptionBudgets (a refusal is a 429 the rebalancer counts); its
# controller recreates the pod for this scheduler to place. No delete on pods: eviction is the only way.
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
{{- end }}
# events: RejectedByPolicy, DelayedByPolicy and RequeueGaveUp on pods (and the rebalancer's Rebalanced,
# RebalanceDryRun, RebalanceBlocked, RebalanceFailed, RebalanceUnknown); rollout events on
# SchedulingPolicies (kopf).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# SchedulingPolicies: kopf watches them (list/watch), keeps its progress annotations and its
# finalizer on them (patch); the operator reports rollouts in their status. No get: neither kopf nor
# the operator reads one policy by name (the watch delivers each whole).
- apiGroups: [rlsched.io]
  resources: [schedulingpolicies]
  verbs: [list, watch, patch]
# SchedulingPolicies' status: the operator reports each rollout's progress and conditions there, and
# the rebalancer writes each eviction there before making it (its budget survives a restart). A
# merge patch needs no read first.
- apiGroups: [rlsched.io]
  resources: [schedulingpolicies/status]
  verbs: [patch]
{{- if .Values.operator.peering.enabled }}
# kopf's peering: replicas announce themselves and pause for a higher-priority one (operator.peering).
- apiGroups: [kopf.dev]
  resources: [{{ if .Values.operator.watchNamespaces }}kopfpeerings{{ else }}clusterkopfpeerings{{ end }}]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}

{{/* watchNamespaces entries must be namespace names: a Role needs one (kopf's glob patterns cannot
be granted without cluster-wide rights). */}}
{{- define "rl-scheduler.operator.checkWatchNamespaces" -}}
{{- range .Values.operator.watchNamespaces }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$" (toString .)) }}
{{- fail (printf "operator.watchNamespaces: %q is not a namespace name (the chart grants pod access per namespace, so patterns are not supported; leave the list empty to watch every namespace)" (toString .)) }}
{{- end }}
{{- end }}
{{- end -}}
