{{/*
Names, labels and the configuration files shared by the templates. Every template uses these
helpers; nothing hard-codes a name, so two releases never collide.
*/}}

{{/* The chart name (nameOverride wins). */}}
{{- define "rl-scheduler.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The full name prefix of every object: fullnameOverride, else the release name (plus the chart
name unless the release name already contains it), 63 characters at most.
*/}}
{{- define "rl-scheduler.fullname" -}}
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

{{/* A component's name: <fullname>-<component>, 63 characters at most. Call with (list . "operator"). */}}
{{- define "rl-scheduler.componentName" -}}
{{- $ctx := index . 0 -}}
{{- printf "%s-%s" (include "rl-scheduler.fullname" $ctx | trunc (int (sub 62 (len (index . 1))))) (index . 1) | trimSuffix "-" -}}
{{- end -}}

{{/*
Name of a cluster-scoped object (ClusterRole, ClusterRoleBinding): <namespace>-<fullname>-<suffix>,
so that releases with the same name in two namespaces do not collide. Call with (list . "suffix").
*/}}
{{- define "rl-scheduler.clusterScopedName" -}}
{{- $ctx := index . 0 -}}
{{- printf "%s-%s-%s" $ctx.Release.Namespace (include "rl-scheduler.fullname" $ctx) (index . 1) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/* chart label value: name-version. */}}
{{- define "rl-scheduler.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "rl-scheduler.labels" -}}
helm.sh/chart: {{ include "rl-scheduler.chart" . }}
{{ include "rl-scheduler.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kube-rl-scheduler
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of the release (add app.kubernetes.io/component per workload). */}}
{{- define "rl-scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rl-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of one component's objects. Call with (list . "scheduler"). */}}
{{- define "rl-scheduler.componentLabels" -}}
{{ include "rl-scheduler.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Selector labels of one component. Call with (list . "scheduler"). */}}
{{- define "rl-scheduler.componentSelectorLabels" -}}
{{ include "rl-scheduler.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* ServiceAccount names. */}}
{{- define "rl-scheduler.scheduler.serviceAccountName" -}}
{{- if .Values.scheduler.serviceAccount.create -}}
{{- default (include "rl-scheduler.componentName" (list . "scheduler")) .Values.scheduler.serviceAccount.name -}}
{{- else -}}
{{- required "scheduler.serviceAccount.name is required when scheduler.serviceAccount.create is false" .Values.scheduler.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "rl-scheduler.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "rl-scheduler.componentName" (list . "operator")) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An image tag as a string: a tag written unquoted in a values file may reach here as a number (YAML
`tag: 0.2` is a float64). Whole numbers print without an exponent (20240101, not 2.0240101e+07); the
decimals YAML dropped (1.10 read as 1.1) are lost before the chart sees them, hence: quote tags.
*/}}
{{- define "rl-scheduler.tagString" -}}
{{- if and (kindIs "float64" .) (eq . (floor .)) -}}
{{- printf "%.0f" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Images. */}}
{{- define "rl-scheduler.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (include "rl-scheduler.tagString" (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}
{{- end -}}

{{- define "rl-scheduler.scheduler.image" -}}
{{- $img := .Values.scheduler.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (include "rl-scheduler.tagString" (required "scheduler.image.tag is required" $img.tag)) -}}
{{- end -}}
{{- end -}}

{{/* The policy ConfigMap (operator writes it, scheduler pod mounts it) and its rollback slot. */}}
{{- define "rl-scheduler.policyConfigMapName" -}}
{{- default (include "rl-scheduler.componentName" (list . "policy")) .Values.policyConfigMap.name -}}
{{- end -}}

{{/* The Service in front of the scheduler pod. */}}
{{- define "rl-scheduler.serviceName" -}}
{{- include "rl-scheduler.fullname" . -}}
{{- end -}}

{{/*
The status port's TLS (extender.statusTls): on or not ("true" or empty), the Secret (yours, or the one
the chart makes: scheduler/status-tls-secret.yaml), where the extender mounts it, where the operator
mounts its ca.crt, and the scheme of URLs to the port. Every template reads the two values through
these helpers, with dig: `helm upgrade --reuse-values` from a release made before extender.statusTls
existed renders with that release's values, which have no statusTls at all, and must get the defaults
(enabled, the generated Secret) everywhere alike.
*/}}
{{- define "rl-scheduler.statusTlsEnabled" -}}
{{- if dig "statusTls" "enabled" true .Values.extender -}}true{{- end -}}
{{- end -}}

{{- define "rl-scheduler.statusTlsOwnSecret" -}}
{{- dig "statusTls" "secretName" "" .Values.extender -}}
{{- end -}}

{{- define "rl-scheduler.statusTlsSecretName" -}}
{{- default (include "rl-scheduler.componentName" (list . "status-tls")) (include "rl-scheduler.statusTlsOwnSecret" .) -}}
{{- end -}}

{{- define "rl-scheduler.statusTlsDir" -}}
/etc/rlsched/status-tls
{{- end -}}

{{- define "rl-scheduler.operator.extenderCaDir" -}}
/etc/rlsched/extender-ca
{{- end -}}

{{- define "rl-scheduler.statusScheme" -}}
{{- if include "rl-scheduler.statusTlsEnabled" . -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/*
A probe of the status port: with statusTls on, its httpGet gets `scheme: HTTPS` unless it names one
(the kubelet does not verify the certificate). Call with (list . probe).
*/}}
{{- define "rl-scheduler.statusProbe" -}}
{{- $probe := deepCopy (index . 1) -}}
{{- if and (include "rl-scheduler.statusTlsEnabled" (index . 0)) $probe.httpGet -}}
{{- if not (hasKey $probe.httpGet "scheme") -}}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" -}}
{{- end -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}

{{/* Leader-election Lease of our kube-scheduler: unique name and namespace, named by the RBAC Role. */}}
{{- define "rl-scheduler.leaseName" -}}
{{- default .Values.schedulerName .Values.scheduler.config.leaseName -}}
{{- end -}}

{{- define "rl-scheduler.leaseNamespace" -}}
{{- default .Release.Namespace .Values.scheduler.config.leaseNamespace -}}
{{- end -}}

{{/* The Role/RoleBinding for the Lease: in another namespace than the release's, the name carries the
release namespace too. */}}
{{- define "rl-scheduler.leaseRoleName" -}}
{{- if eq (include "rl-scheduler.leaseNamespace" .) .Release.Namespace -}}
{{- include "rl-scheduler.componentName" (list . "scheduler-leader-election") -}}
{{- else -}}
{{- include "rl-scheduler.clusterScopedName" (list . "scheduler-leader-election") -}}
{{- end -}}
{{- end -}}

{{/* kopf peering object(s): a ClusterKopfPeering, or KopfPeerings in the watched namespaces. */}}
{{- define "rl-scheduler.peeringName" -}}
{{- default (include "rl-scheduler.clusterScopedName" (list . "operator")) .Values.operator.peering.name -}}
{{- end -}}

{{/*
listenAddress, checked: the wildcard address of one family, IPv4 or IPv6 (the kubelet probes a pod's
first IP, so the listeners it probes must hold that IP's family).
*/}}
{{- define "rl-scheduler.listenAddress" -}}
{{- $a := toString .Values.listenAddress -}}
{{- if not (has $a (list "0.0.0.0" "::")) -}}
{{- fail (printf "listenAddress=%q: use \"0.0.0.0\" (IPv4) or \"::\" (IPv6, when a pod's first IP is IPv6)" $a) -}}
{{- end -}}
{{- $a -}}
{{- end -}}

{{/*
listenAddress as the host of a URL or host:port (an IPv6 address in brackets).
*/}}
{{- define "rl-scheduler.listenHost" -}}
{{- $a := include "rl-scheduler.listenAddress" . -}}
{{- if contains ":" $a -}}[{{ $a }}]{{- else -}}{{ $a }}{{- end -}}
{{- end -}}

{{/*
The extender's settings file (extender/settings.py keys). extender.config is deep-merged last.
*/}}
{{- define "rl-scheduler.extenderConfig" -}}
{{- $v := .Values.extender -}}
{{- include "rl-scheduler.checkExtenderConfig" . -}}
{{- $policy := dict "mode" $v.policy.mode "fallback" $v.policy.fallback "deadlineMs" $v.policy.deadlineMs "topK" $v.policy.topK -}}
{{- if $v.policy.modelPath -}}
{{- $_ := set $policy "modelPath" $v.policy.modelPath -}}
{{- end -}}
{{- $cfg := dict
  "server" (dict "host" "127.0.0.1" "port" $v.port "statusHost" (include "rl-scheduler.listenAddress" .) "statusPort" $v.statusPort)
  "kubernetes" (dict "schedulerName" .Values.schedulerName)
  "policy" $policy
  "policyFile" (printf "%s/policy.yaml" (trimSuffix "/" $v.policyMountPath))
  "strictModel" $v.strictModel
  "log" (dict "level" $v.log.level "format" $v.log.format)
  "auth" (dict "mode" $v.auth.mode "protectMetrics" $v.auth.protectMetrics)
-}}
{{- if $v.auth.audience -}}
{{- $_ := set $cfg.auth "audiences" (list $v.auth.audience) -}}
{{- end -}}
{{- if $v.prometheusUrl -}}
{{- $_ := set $cfg "prometheus" (dict "url" $v.prometheusUrl) -}}
{{- end -}}
{{- if include "rl-scheduler.statusTlsEnabled" . -}}
{{- $dir := include "rl-scheduler.statusTlsDir" . -}}
{{- $_ := set $cfg.server "statusTls" (dict "certFile" (printf "%s/tls.crt" $dir) "keyFile" (printf "%s/tls.key" $dir)) -}}
{{- end -}}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy $v.config) -}}
{{- if not (has $cfg.server.host (list "127.0.0.1" "localhost" "::1")) -}}
{{- fail (printf "extender.config.server.host=%v: the extender's verbs have no caller authentication and must stay on loopback (kube-scheduler calls them from the same pod)" $cfg.server.host) -}}
{{- end -}}
{{- if and $v.auth.audience (not (regexMatch "^[\x21-\x7e]{1,256}$" (toString $v.auth.audience))) -}}
{{- fail (printf "extender.auth.audience=%q: an audience is 1 to 256 visible ASCII characters, no spaces (e.g. rlsched-extender)" (toString $v.auth.audience)) -}}
{{- end -}}
{{- if and (eq (toString (dig "apiServerAudience" true $cfg.auth)) "false") (empty (default (list) $cfg.auth.audiences)) -}}
{{- fail "extender.config.auth.apiServerAudience=false with no audience would refuse every token: set extender.auth.audience (or extender.config.auth.audiences)" -}}
{{- end -}}
{{- if and $v.auth.audience (not (has $v.auth.audience (default (list) $cfg.auth.audiences))) -}}
{{- fail (printf "extender.config.auth.audiences=%v leaves out extender.auth.audience %q, the audience of the operator's token: add it to the list, or set extender.auth.audience" $cfg.auth.audiences $v.auth.audience) -}}
{{- end -}}
{{- if and (eq (toString $cfg.auth.mode) "none") (not (has $cfg.server.statusHost (list "127.0.0.1" "localhost" "::1"))) -}}
{{- fail "extender.auth.mode=none would open /status and /decisions (pod names, decision features) to anyone who reaches the status port: keep auth.mode kubernetes" -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
Keys of extender.config the rest of the chart depends on: the scheduler's urlPrefix, the container
port, the Service, the NetworkPolicy and the probes follow the first-class values, so setting these
in extender.config would silently disagree with them (server.statusTls: the mounted Secret, the probes'
scheme, the operator's URL and CA). server.tls has no first-class value: the scheduler configuration
calls the loopback verbs over plain HTTP. Fail, naming the value to use.
*/}}
{{- define "rl-scheduler.checkExtenderConfig" -}}
{{- $c := .Values.extender.config | default dict -}}
{{- $server := dig "server" dict $c -}}
{{- $kube := dig "kubernetes" dict $c -}}
{{- $checks := list
  (list (hasKey $server "port") "server.port" "set extender.port instead (the scheduler's urlPrefix follows it)")
  (list (hasKey $server "statusPort") "server.statusPort" "set extender.statusPort instead (the container port, the Service, the NetworkPolicy and the probes follow it)")
  (list (hasKey $server "statusHost") "server.statusHost" "set listenAddress instead (the chart listens there so that the Service and the kubelet's probes reach the status port)")
  (list (hasKey $server "tls") "server.tls" "the chart's kube-scheduler calls the verbs over plain HTTP on loopback (enableHTTPS false, an http:// urlPrefix), so a TLS listener would fail every pod of the profile; the verbs never leave the pod, where mutual TLS adds nothing: remove it")
  (list (hasKey $server "statusTls") "server.statusTls" "set extender.statusTls instead (the chart mounts its Secret, and the probes, the operator and the ServiceMonitor follow it)")
  (list (hasKey $kube "schedulerName") "kubernetes.schedulerName" "set schedulerName instead (the scheduler profile and the operator follow it)")
  (list (hasKey $c "policyFile") "policyFile" "set extender.policyMountPath instead (the policy ConfigMap is mounted there and the operator writes to it)")
-}}
{{- range $checks -}}
{{- if index . 0 -}}
{{- fail (printf "extender.config.%s: %s" (index . 1) (index . 2)) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The KubeSchedulerConfiguration: files/scheduler-config.yaml (a byte copy of
extender/scheduler-config.yaml = rlsched.extender.scheduler_config.render()) with the same
parameters scheduler_config() takes set from the values. tests/unit/test_chart_sync.py renders the
chart and compares the result with scheduler_config(**those parameters).
*/}}
{{- define "rl-scheduler.schedulerConfig" -}}
{{- $c := .Values.scheduler.config -}}
{{- $cfg := .Files.Get "files/scheduler-config.yaml" | fromYaml -}}
{{- if hasKey $cfg "Error" -}}
{{- fail (printf "files/scheduler-config.yaml: %s" $cfg.Error) -}}
{{- end -}}
{{- if not $cfg.leaderElection -}}
{{- fail "files/scheduler-config.yaml is missing or empty: run .venv/bin/python hack/sync-chart.py" -}}
{{- end -}}
{{- $le := $cfg.leaderElection -}}
{{- $_ := set $le "leaderElect" $c.leaderElect -}}
{{- $_ := set $le "resourceName" (include "rl-scheduler.leaseName" .) -}}
{{- $_ := set $le "resourceNamespace" (include "rl-scheduler.leaseNamespace" .) -}}
{{- $profile := first $cfg.profiles -}}
{{- $_ := set $profile "schedulerName" .Values.schedulerName -}}
{{- $pct := int $c.percentageOfNodesToScore -}}
{{- if or (lt $pct 0) (gt $pct 100) -}}
{{- fail (printf "scheduler.config.percentageOfNodesToScore=%v: must be 0 (adaptive) to 100" $c.percentageOfNodesToScore) -}}
{{- end -}}
{{- $_ := set $profile "percentageOfNodesToScore" $pct -}}
{{- $_ := set $cfg "percentageOfNodesToScore" $pct -}}
{{- if $c.keepScorePlugins -}}
{{- $_ := unset $profile "plugins" -}}
{{- end -}}
{{- $gpu := dig "gpu" "gpuMilliResource" "" (.Values.extender.config | default dict) -}}
{{- if $gpu -}}
{{- range $profile.pluginConfig -}}
{{- if eq .name "NodeResourcesFit" -}}
{{- $_ := set .args "ignoredResources" (list $gpu) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $ext := first $cfg.extenders -}}
{{- $prefix := dig "server" "pathPrefix" "" (.Values.extender.config | default dict) -}}
{{- $_ := set $ext "urlPrefix" (printf "http://127.0.0.1:%d%s" (int .Values.extender.port) $prefix) -}}
{{- $_ := set $ext "weight" (int $c.weight) -}}
{{- $_ := set $ext "httpTimeout" $c.httpTimeout -}}
{{- $_ := set $ext "nodeCacheCapable" $c.nodeCacheCapable -}}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy $c.overrides) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
Where the operator pod mounts its token for the extender's status port (audience
extender.auth.audience, a projected serviceAccountToken volume), and the file's name in it. The
operator's settings (extender.tokenFile) point at it.
*/}}
{{- define "rl-scheduler.operator.extenderTokenDir" -}}
/var/run/secrets/rlsched.io/extender-token
{{- end -}}

{{- define "rl-scheduler.operator.extenderTokenName" -}}
token
{{- end -}}

{{/*
The operator's settings file (operator/settings.py keys). operator.config is deep-merged last.
*/}}
{{- define "rl-scheduler.operatorConfig" -}}
{{- $o := .Values.operator -}}
{{- if and $o.watchNamespaces (not (has .Release.Namespace $o.watchNamespaces)) -}}
{{- fail (printf "operator.watchNamespaces=%v leaves out the release namespace %q, where the operator's SchedulingPolicy (operator.policyName) lives: add %q to the list, or leave the list empty to watch every namespace" $o.watchNamespaces .Release.Namespace .Release.Namespace) -}}
{{- end -}}
{{- $cfg := dict
  "scope" (dict "namespaces" $o.watchNamespaces "schedulerName" .Values.schedulerName)
  "policy" (dict "namespace" .Release.Namespace "name" $o.policyName)
  "sink" (dict "kind" "configmap" "namespace" .Release.Namespace "configmap" (include "rl-scheduler.policyConfigMapName" .) "mountPath" .Values.extender.policyMountPath)
  "extender" (dict "statusUrl" (printf "%s://%s.%s.svc:%d" (include "rl-scheduler.statusScheme" .) (include "rl-scheduler.serviceName" .) .Release.Namespace (int .Values.extender.statusPort)) "rolloutTimeoutS" $o.rolloutTimeoutS)
  "livenessEndpoint" (printf "http://%s:%d/healthz" (include "rl-scheduler.listenHost" .) (int $o.healthPort))
  "logLevel" $o.logLevel
  "rebalancer" (dict "enabled" $o.rebalancer.enabled "tickS" $o.rebalancer.tickS)
-}}
{{- if $o.peering.enabled -}}
{{- $_ := set $cfg.scope "peering" (include "rl-scheduler.peeringName" .) -}}
{{- end -}}
{{- if include "rl-scheduler.statusTlsEnabled" . -}}
{{- $_ := set $cfg.extender "caFile" (printf "%s/ca.crt" (include "rl-scheduler.operator.extenderCaDir" .)) -}}
{{- end -}}
{{- if .Values.extender.auth.audience -}}
{{- $_ := set $cfg.extender "tokenFile" (printf "%s/%s" (include "rl-scheduler.operator.extenderTokenDir" .) (include "rl-scheduler.operator.extenderTokenName" .)) -}}
{{- end -}}
{{- /* The rebalancer reads GPUs, typical pods and node load as the extender does (docs/operator.md):
the extender's settings, before operator.config, so that an override there still wins. */ -}}
{{- $ext := .Values.extender.config | default dict -}}
{{- with (dig "gpu" dict $ext) -}}
{{- $_ := set $cfg.rebalancer "gpu" (deepCopy .) -}}
{{- end -}}
{{- $typical := dig "policy" "typicalPodsPath" "" $ext -}}
{{- if and $typical (not (hasPrefix (printf "%s/" (trimSuffix "/" .Values.extender.policyMountPath)) $typical)) -}}
{{- /* Same image, same file; a file under the policy mount exists in the scheduler pod only. */ -}}
{{- $_ := set $cfg.rebalancer "typicalPodsPath" $typical -}}
{{- end -}}
{{- $prom := deepCopy (dig "prometheus" dict $ext) -}}
{{- if .Values.extender.prometheusUrl -}}
{{- $prom = mustMergeOverwrite (dict "url" .Values.extender.prometheusUrl) $prom -}}
{{- end -}}
{{- if $prom -}}
{{- $_ := set $cfg.rebalancer "prometheus" $prom -}}
{{- end -}}
{{- if $o.metricsPort -}}
{{- $_ := set $cfg "metricsEndpoint" (printf "%s:%d" (include "rl-scheduler.listenHost" .) (int $o.metricsPort)) -}}
{{- end -}}
{{- if $o.decisionLog.enabled -}}
{{- $dl := dict "path" "/data/decisions" "maxBytes" (int64 $o.decisionLog.maxBytes) -}}
{{- if $o.prometheusUrl -}}
{{- $_ := set $dl "prometheusUrl" $o.prometheusUrl -}}
{{- end -}}
{{- $_ := set $cfg "decisionLog" $dl -}}
{{- end -}}
{{- $cfg = mustMergeOverwrite $cfg (deepCopy $o.config) -}}
{{- toYaml $cfg -}}
{{- end -}}
