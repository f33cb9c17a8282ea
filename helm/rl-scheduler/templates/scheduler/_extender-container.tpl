{{/*
The extender container: a native sidecar (initContainers, restartPolicy: Always) or an ordinary
second container of the scheduler pod (extender.nativeSidecar). Its verbs listen on 127.0.0.1.
*/}}
{{- define "rl-scheduler.extenderContainer" -}}
name: extender
image: {{ include "rl-scheduler.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args:
  - extender
  - --config=/etc/rlsched/config/extender.yaml
env:
  # numba caches compiled kernels next to the package by default: read-only here.
  - name: NUMBA_CACHE_DIR
    value: /tmp/numba-cache
  # One BLAS/OpenMP thread: the policy runs on the event loop's thread (docs/extender.md, Latency).
  - name: OPENBLAS_NUM_THREADS
    value: "1"
  - name: OMP_NUM_THREADS
    value: "1"
  - name: MKL_NUM_THREADS
    value: "1"
  - name: HOME
    value: /tmp
  {{- with .Values.extender.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: http-status
    containerPort: {{ .Values.extender.statusPort }}
    protocol: TCP
{{- with .Values.extender.startupProbe }}
startupProbe:
  {{- include "rl-scheduler.statusProbe" (list $ .) | nindent 2 }}
{{- end }}
{{- with .Values.extender.livenessProbe }}
livenessProbe:
  {{- include "rl-scheduler.statusProbe" (list $ .) | nindent 2 }}
{{- end }}
{{- with .Values.extender.readinessProbe }}
readinessProbe:
  {{- include "rl-scheduler.statusProbe" (list $ .) | nindent 2 }}
{{- end }}
{{- with .Values.extender.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.extender.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: config
    mountPath: /etc/rlsched/config
    readOnly: true
  - name: policy
    mountPath: {{ .Values.extender.policyMountPath }}
    readOnly: true
  - name: scratch
    mountPath: /tmp
  {{- if include "rl-scheduler.statusTlsEnabled" . }}
  # The status port's certificate and key (server.statusTls); re-read when the kubelet updates them.
  - name: status-tls
    mountPath: {{ include "rl-scheduler.statusTlsDir" . }}
    readOnly: true
  {{- end }}
{{- end -}}
