{{/*
The chart renders deploy/'s own manifests (files/ links to deploy/base and
deploy/components): the base, then the components the values switch on, applied as kustomize
applies them, then what the other values name. So `helm template` and `kubectl kustomize`
give the same objects, and neither can drift from the other.
*/}}

{{/* A manifest file of deploy/ in the release's namespace: (list $ path) -> {items: [...]} */}}
{{- define "dispatcher.load" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $text := $root.Files.Get $path -}}
{{- if not $text -}}
{{- fail (printf "the chart has no %s: charts/dispatcher/files/ links to deploy/, and a packaged chart holds copies" $path) -}}
{{- end -}}
{{- $items := list -}}
{{- range regexSplit "(?m)^---\\s*$" ($text | replace "dispatcher-system" $root.Release.Namespace) -1 -}}
{{- $o := fromYaml . -}}
{{- if hasKey $o "Error" -}}{{- fail (printf "%s: %s" $path $o.Error) -}}{{- end -}}
{{- if $o -}}{{- $items = append $items $o -}}{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $items) -}}
{{- end -}}

{{/* deploy/base: the files its kustomization lists (the CRDs are the chart's crds/). */}}
{{- define "dispatcher.base" -}}
{{- $root := index . 0 -}}
{{- $items := list -}}
{{- range (include "dispatcher.load" (list $root "files/base/kustomization.yaml") | fromYaml | dig "items" list | first).resources -}}
{{- if hasSuffix ".yaml" . -}}
{{- $items = concat $items (include "dispatcher.load" (list $root (printf "files/base/%s" .)) | fromYaml).items -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $items) -}}
{{- end -}}

{{/*
A kustomize component of deploy/components applied to the objects: (list $ name items) ->
{items}. Its resources are added; a patch with a target is a JSON patch (add, remove, test)
applied to every object it targets; one without is a `$patch: delete`.
*/}}
{{- define "dispatcher.component" -}}
{{- $root := index . 0 -}}
{{- $dir := printf "files/components/%s" (index . 1) -}}
{{- $items := index . 2 -}}
{{- $k := include "dispatcher.load" (list $root (printf "%s/kustomization.yaml" $dir)) | fromYaml | dig "items" list | first -}}
{{- range $k.resources -}}
{{- $items = concat $items (include "dispatcher.load" (list $root (printf "%s/%s" $dir .)) | fromYaml).items -}}
{{- end -}}
{{- range $p := $k.patches -}}
{{- if $p.target -}}
{{- $ops := fromYamlArray $p.patch -}}
{{- range $o := $items -}}
{{- if include "dispatcher.targets" (list $p.target $o) -}}
{{- range $ops -}}{{- include "dispatcher.jsonpatch" (list $dir $o .) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $gone := fromYaml $p.patch -}}
{{- if ne (get $gone "$patch") "delete" -}}
{{- fail (printf "%s: a patch without a target must be `$patch: delete`" $dir) -}}
{{- end -}}
{{- $kept := list -}}
{{- range $items -}}
{{- if not (and (eq .kind $gone.kind) (eq .metadata.name $gone.metadata.name)) -}}
{{- $kept = append $kept . -}}
{{- end -}}
{{- end -}}
{{- if eq (len $kept) (len $items) -}}
{{- fail (printf "%s deletes %s %s, which is not there" $dir $gone.kind $gone.metadata.name) -}}
{{- end -}}
{{- $items = $kept -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $items) -}}
{{- end -}}

{{/* Whether a patch target (group, kind, name) selects an object: (list target object). */}}
{{- define "dispatcher.targets" -}}
{{- $t := index . 0 -}}
{{- $o := index . 1 -}}
{{- $group := regexReplaceAll "/?[^/]*$" $o.apiVersion "" -}}
{{- if and (or (not $t.kind) (eq $t.kind $o.kind)) (or (not $t.name) (eq $t.name $o.metadata.name)) (or (not (hasKey $t "group")) (eq $t.group $group)) -}}
true
{{- end -}}
{{- end -}}

{{/*
One JSON patch operation, in place: (list dir object op). The path's last two steps are
what it changes: a list (append with "-", remove or test an index) or a map's key.
*/}}
{{- define "dispatcher.jsonpatch" -}}
{{- $dir := index . 0 -}}
{{- $o := index . 1 -}}
{{- $op := index . 2 -}}
{{- $steps := splitList "/" (trimPrefix "/" $op.path) -}}
{{- $n := len $steps -}}
{{- $holder := $o -}}
{{- range slice $steps 0 (int (sub $n 2)) -}}
{{- if kindIs "slice" $holder -}}{{- $holder = index $holder (atoi .) -}}{{- else -}}{{- $holder = get $holder . -}}{{- end -}}
{{- end -}}
{{- $key := index $steps (int (sub $n 2)) -}}
{{- $at := last $steps -}}
{{- $target := get $holder $key -}}
{{- if and (eq $op.op "add") (kindIs "slice" $target) (eq $at "-") -}}
{{- $_ := set $holder $key (append $target $op.value) -}}
{{- else if and (eq $op.op "add") (kindIs "map" $target) -}}
{{- $_ := set $target $at $op.value -}}
{{- else if and (eq $op.op "remove") (kindIs "slice" $target) -}}
{{- $kept := list -}}
{{- range $i, $v := $target -}}{{- if ne $i (atoi $at) -}}{{- $kept = append $kept $v -}}{{- end -}}{{- end -}}
{{- $_ := set $holder $key $kept -}}
{{- else if eq $op.op "test" -}}
{{- $found := "" -}}
{{- if kindIs "slice" $target -}}{{- $found = index $target (atoi $at) -}}{{- else -}}{{- $found = get $target $at -}}{{- end -}}
{{- if ne (toJson $found) (toJson $op.value) -}}
{{- fail (printf "%s: %s is %s, not %s: the component no longer fits deploy/base" $dir $op.path (toJson $found) (toJson $op.value)) -}}
{{- end -}}
{{- else -}}
{{- fail (printf "%s: the chart does not apply %s %s" $dir $op.op $op.path) -}}
{{- end -}}
{{- end -}}

{{/* Labels every object gets: deploy/'s part-of, and Helm's. */}}
{{- define "dispatcher.labels" -}}
app.kubernetes.io/part-of: dispatcher
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "dispatcher.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/*
A Deployment's pod, in place: (list $ deployment values-section). Image, replicas,
resources, scheduling constraints, extra flags.
*/}}
{{- define "dispatcher.pod" -}}
{{- $root := index . 0 -}}
{{- $d := index . 1 -}}
{{- $v := index . 2 -}}
{{- $spec := $d.spec.template.spec -}}
{{- $c := index $spec.containers 0 -}}
{{- $_ := set $d.spec "replicas" (int $v.replicas) -}}
{{- $_ := set $c "image" (include "dispatcher.image" $root) -}}
{{- $_ := set $c "imagePullPolicy" $root.Values.image.pullPolicy -}}
{{- $log := list -}}
{{- if ne $root.Values.logFormat "text" -}}{{- $log = list "--log-format" $root.Values.logFormat -}}{{- end -}}
{{- $_ := set $c "args" (concat $c.args $log $v.extraArgs) -}}
{{- if $v.resources -}}{{- $_ := set $c "resources" $v.resources -}}{{- end -}}
{{- range $key := list "nodeSelector" "tolerations" "affinity" "priorityClassName" -}}
{{- if get $v $key -}}{{- $_ := set $spec $key (get $v $key) -}}{{- end -}}
{{- end -}}
{{- if $root.Values.imagePullSecrets -}}
{{- $_ := set $spec "imagePullSecrets" $root.Values.imagePullSecrets -}}
{{- end -}}
{{- end -}}
