{{/*
The chart renders daemonset/'s own objects: each template loads its file from files/ (copied
there from daemonset/ by tests/support/deploy/generate.py), changes it where a value says so,
and prints it with "nodeguard.render", which puts it in the release namespace and adds the
labels: daemonset/base's (its kustomization's labels:) and Helm's standard ones.
*/}}

{{- define "nodeguard.labels" -}}
app.kubernetes.io/name: nodeguard
app.kubernetes.io/part-of: nodeguard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The YAML documents of a file under files/, as a list of dicts. */}}
{{- define "nodeguard.docs" -}}
{{- $docs := list -}}
{{- range regexSplit "(?m)^---[ \t]*$" (.root.Files.Get .file) -1 -}}
{{- $doc := fromYaml . -}}
{{- if $doc -}}{{- $docs = append $docs $doc -}}{{- end -}}
{{- end -}}
{{- toYaml (dict "docs" $docs) -}}
{{- end -}}

{{/* Print one object (dict "root" $ "obj" OBJ "labels" EXTRA): namespaced objects in the
release namespace, base and Helm labels added. */}}
{{- define "nodeguard.render" -}}
{{- $root := .root -}}
{{- $obj := .obj -}}
{{- $md := $obj.metadata -}}
{{- if hasKey $md "namespace" -}}{{- $_ := set $md "namespace" $root.Release.Namespace -}}{{- end -}}
{{- $labels := merge (dict) (.labels | default dict) (include "nodeguard.labels" $root | fromYaml) ($md.labels | default dict) -}}
{{- $_ := set $md "labels" $labels -}}
---
{{ toYaml $obj }}
{{ end -}}

{{/* Every object of a file under files/ (dict "root" $ "file" PATH), bindings' subjects in the
release namespace. */}}
{{- define "nodeguard.file" -}}
{{- $root := .root -}}
{{- range (include "nodeguard.docs" . | fromYaml).docs -}}
{{- range .subjects | default list -}}
{{- if hasKey . "namespace" -}}{{- $_ := set . "namespace" $root.Release.Namespace -}}{{- end -}}
{{- end -}}
{{- include "nodeguard.render" (dict "root" $root "obj" .) -}}
{{- end -}}
{{- end -}}
