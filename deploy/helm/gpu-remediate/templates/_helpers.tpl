{{/*
Labels on every object: the kustomize base's (app.kubernetes.io/part-of) and the overlay's
(gpu-remediate.io/mode), so the chart and `kubectl apply -k deploy/overlays/<mode>` render
the same objects.
*/}}
{{- define "gpu-remediate.labels" -}}
app.kubernetes.io/part-of: gpu-remediate
gpu-remediate.io/mode: {{ .Values.mode }}
{{- end -}}

{{/*
kustomize's name for a generated ConfigMap: <name>-<hash>, the hash being the first ten hex
digits of the SHA-256 of the JSON {data, kind, name: ""}, with 0 1 3 a e written g h k m t.
A new config is a new name, so the pods roll when it changes; and the names equal those of
`kubectl kustomize` (tests/deploy/kustomize.py has the same function).
Argument: list NAME DATA.
*/}}
{{- define "gpu-remediate.generatedName" -}}
{{- $name := index . 0 -}}
{{- $data := index . 1 -}}
{{- $hash := dict "data" $data "kind" "ConfigMap" "name" "" | toJson | sha256sum | trunc 10 -}}
{{- printf "%s-%s" $name ($hash | replace "0" "g" | replace "1" "h" | replace "3" "k" | replace "a" "m" | replace "e" "t") -}}
{{- end -}}

{{/*
The worker config file: .Values.config with the settings the chart's own values own. A
value set in both places is an error naming both, never a silent choice.
*/}}
{{- define "gpu-remediate.config" -}}
{{- $v := .Values -}}
{{- $c := deepCopy $v.config -}}
{{- range $section := list "detector" "remediation" "jobs" -}}
{{- if not (kindIs "map" (get $c $section)) -}}
{{- $_ := set $c $section (dict) -}}
{{- end -}}
{{- end -}}
{{- $detector := $c.detector -}}
{{- $remediation := $c.remediation -}}
{{- if hasKey $detector "dry_run" -}}
{{- fail "config.detector.dry_run: set mode instead (dry-run, supervised or autonomous)" -}}
{{- end -}}
{{- if hasKey $detector "max_unavailable" -}}
{{- fail "config.detector.max_unavailable: set budget.maxUnavailable instead" -}}
{{- end -}}
{{- if hasKey $c "policy" -}}
{{- fail "config.policy: set policy instead" -}}
{{- end -}}
{{- $temporal := get $c "temporal" | default (dict) -}}
{{- range $field := list "address" "namespace" "api_key" "api_key_file" "tls" -}}
{{- if hasKey $temporal $field -}}
{{- fail (printf "config.temporal.%s: set temporal.* instead (the address, namespace and API key reach the pods from a ConfigMap and the Secret)" $field) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $detector "dry_run" (eq $v.mode "dry-run") -}}
{{- $_ := set $detector "max_unavailable" $v.budget.maxUnavailable -}}
{{- $approval := get $remediation "approval" | default (dict) -}}
{{- if hasKey $approval "required_for" -}}
{{- fail "config.remediation.approval.required_for: set approval.requiredFor (and mode) instead" -}}
{{- end -}}
{{- $_ := set $approval "required_for" (ternary $v.approval.requiredFor (list) (eq $v.mode "supervised")) -}}
{{- $_ := set $remediation "approval" $approval -}}
{{- $templates := get $c.jobs "templates" | default (dict) -}}
{{- range $name, $job := $v.jobs -}}
{{- if hasKey $templates $name -}}
{{- fail (printf "config.jobs.templates.%s: set it under jobs.%s only" $name $name) -}}
{{- end -}}
{{- $_ := set $templates $name $job -}}
{{- end -}}
{{- if $templates -}}
{{- $_ := set $c.jobs "templates" $templates -}}
{{- end -}}
{{- /* The reboot Job runs the worker's own image (@worker): the one the Deployment runs,
unless config.jobs.worker_image names another (the same image by digest, for require_digest). */ -}}
{{- if not (get $c.jobs "worker_image") -}}
{{- $_ := set $c.jobs "worker_image" (include "gpu-remediate.image" .) -}}
{{- end -}}
{{- /* require_digest: every image a node Job runs by digest, refused here with what to
set rather than by a worker that will not start. The built-in validation runs
nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04 (activities/job_templates.py); the
built-in gpu-reset and reboot run the worker's image (@worker). */ -}}
{{- if get $c.jobs "require_digest" -}}
{{- $pinned := "@sha256:[0-9a-f]{64}$" -}}
{{- if not (regexMatch $pinned $c.jobs.worker_image) -}}
{{- fail (printf "image.digest is required: config.jobs.require_digest is true and the worker's image %s, which the reboot and GPU reset Jobs run, is not pinned; --set image.digest=$(crane digest %s) (docs/install.md, \"Pin every image by digest\"), or set config.jobs.require_digest=false" $c.jobs.worker_image $c.jobs.worker_image) -}}
{{- end -}}
{{- $all := merge (deepCopy $templates) (dict "validation" (dict)) -}}
{{- range $name, $job := $all -}}
{{- $image := get $job "image" | default "" -}}
{{- if and (not $image) (eq $name "validation") -}}
{{- fail "jobs.validation.image is required: config.jobs.require_digest is true and the built-in validation image nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04 is not pinned; --set jobs.validation.image=nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04@$(crane digest nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04) (docs/install.md, \"Pin every image by digest\"), or set config.jobs.require_digest=false" -}}
{{- end -}}
{{- if and $image (ne $image "@worker") (not (regexMatch $pinned $image)) -}}
{{- fail (printf "jobs.%s.image: %s is not pinned by digest and config.jobs.require_digest is true; set it to %s@$(crane digest %s)" $name $image $image $image) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.policy -}}
{{- $_ := set $c "policy" $v.policy -}}
{{- end -}}
{{- if $v.temporal.tls.enabled -}}
{{- $tls := dict "enabled" true -}}
{{- if $v.temporal.tls.clientCertificate -}}
{{- $_ := set $tls "client_cert" "/etc/gpu-remediate/temporal/tls.crt" -}}
{{- $_ := set $tls "client_key" "/etc/gpu-remediate/temporal/tls.key" -}}
{{- end -}}
{{- if $v.temporal.tls.privateCA -}}
{{- $_ := set $tls "server_ca" "/etc/gpu-remediate/temporal/ca.crt" -}}
{{- end -}}
{{- if $v.temporal.tls.serverName -}}
{{- $_ := set $tls "server_name" $v.temporal.tls.serverName -}}
{{- end -}}
{{- $_ := set $temporal "tls" $tls -}}
{{- end -}}
{{- if hasKey $temporal "require_auth" -}}
{{- fail "config.temporal.require_auth: set temporal.requireAuth instead" -}}
{{- end -}}
{{- $_ := set $temporal "require_auth" $v.temporal.requireAuth -}}
{{- $_ := set $temporal "api_key_file" "/etc/gpu-remediate/temporal/api-key" -}}
{{- if $temporal -}}
{{- $_ := set $c "temporal" $temporal -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{/* Data of the three generated ConfigMaps, shared by the objects and their names. */}}
{{- define "gpu-remediate.configData" -}}
{{- dict "config.yaml" (include "gpu-remediate.config" . | printf "%s\n") | toJson -}}
{{- end -}}
{{- define "gpu-remediate.temporalData" -}}
{{- dict "address" .Values.temporal.address "namespace" .Values.temporal.namespace | toJson -}}
{{- end -}}
{{- define "gpu-remediate.scriptsData" -}}
{{- dict "search-attributes.sh" (.Files.Get "files/search-attributes.sh") | toJson -}}
{{- end -}}

{{- define "gpu-remediate.configName" -}}
{{- include "gpu-remediate.generatedName" (list "gpu-remediate-config" (include "gpu-remediate.configData" . | fromJson)) -}}
{{- end -}}
{{- define "gpu-remediate.temporalName" -}}
{{- include "gpu-remediate.generatedName" (list "gpu-remediate-temporal" (include "gpu-remediate.temporalData" . | fromJson)) -}}
{{- end -}}
{{- define "gpu-remediate.scriptsName" -}}
{{- include "gpu-remediate.generatedName" (list "gpu-remediate-scripts" (include "gpu-remediate.scriptsData" . | fromJson)) -}}
{{- end -}}

{{- define "gpu-remediate.jobNamespace" -}}
{{- dig "jobs" "namespace" "gpu-remediate-jobs" .Values.config -}}
{{- end -}}

{{/* Temporal connection of the setup Jobs' temporal CLI (deploy/base/scripts). */}}
{{- define "gpu-remediate.adminToolsEnv" -}}
- name: TEMPORAL_ADDRESS
  valueFrom:
    configMapKeyRef:
      name: {{ include "gpu-remediate.temporalName" . }}
      key: address
- name: TEMPORAL_NAMESPACE
  valueFrom:
    configMapKeyRef:
      name: {{ include "gpu-remediate.temporalName" . }}
      key: namespace
- name: TEMPORAL_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.temporal.secretName }}
      key: api-key
      optional: true
- name: TEMPORAL_TLS_DIR
  value: /etc/gpu-remediate/temporal
{{- with .Values.temporal.tls.serverName }}
- name: TEMPORAL_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
- name: HOME
  value: /tmp
{{- end -}}

{{/* Temporal connection of the gpu-remediate containers (worker/config.py). */}}
{{- define "gpu-remediate.temporalEnv" -}}
- name: GPU_REMEDIATE_TEMPORAL__ADDRESS
  valueFrom:
    configMapKeyRef:
      name: {{ include "gpu-remediate.temporalName" . }}
      key: address
- name: GPU_REMEDIATE_TEMPORAL__NAMESPACE
  valueFrom:
    configMapKeyRef:
      name: {{ include "gpu-remediate.temporalName" . }}
      key: namespace
{{- /* The API key is read from the mounted Secret (temporal.api_key_file), so a rotated
Secret takes effect without a restart. */ -}}
{{- end -}}

{{- define "gpu-remediate.temporalVolume" -}}
- name: temporal
  secret:
    secretName: {{ .Values.temporal.secretName }}
    optional: true
    defaultMode: 0440
{{- end -}}

{{/* Setup Jobs run as Helm hooks: Jobs are immutable, so each install and upgrade
replaces them (they are idempotent), in this order. */}}
{{- define "gpu-remediate.hook" -}}
helm.sh/hook: post-install,post-upgrade
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation
{{- end -}}

{{/*
The worker's image. No default: none is published, and a made-up default would only show
as ImagePullBackOff with no hint.
*/}}
{{- define "gpu-remediate.image" -}}
{{- $repo := required "image.repository is required: build the worker image from this repository's Dockerfile, push it to a registry your nodes pull from, and set image.repository (and image.tag) to it, e.g. --set image.repository=registry.example.com/gpu-remediate (docs/install.md, \"Build and push the image\")" .Values.image.repository -}}
{{- /* values.schema.json holds image.digest to sha256:<64 hex>. */ -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" $repo .Values.image.tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo .Values.image.tag -}}
{{- end -}}
{{- end -}}
