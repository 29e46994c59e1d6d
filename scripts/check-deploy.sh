#!/usr/bin/env bash
# Validates what we ship for Kubernetes and Compose against their schemas, not only as YAML:
# `helm lint` on the chart (deploy/helm/ksched), then the chart rendered (`helm template`,
# with its defaults and with every option on) and the raw manifests (deploy/k8s/*.yaml)
# through kubeconform in strict mode (unknown fields are errors); the compose files through
# compose-go (deploy/tools/compose-check: the loader Docker Compose uses, with the Compose
# Specification's schema; no Docker engine needed). Each check is also shown a broken input
# it must refuse.
#
# Tools, installed once into ~/.cache/ksched/bin with `go install` (Go proxy): helm and
# kubeconform. Schemas: kubeconform fetches them from GitHub by default, which this machine
# cannot reach, so they come from PyPI instead: the kubernetes-validate wheel (hash-pinned
# below) carries the OpenAPI-derived JSON schemas of every Kubernetes release; its
# `local-strict` set is what kubeconform reads.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin="$HOME/.cache/ksched/bin"
schemas_root="$HOME/.cache/ksched/k8s-schemas"
helm_version=v3.22.0
kubeconform_version=v0.7.0
k8s_version=1.33.0
wheel=kubernetes_validate-1.37.0-py3-none-any.whl
wheel_sha256=85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9
mkdir -p "$bin"

# `go install` builds carry no release version of their own: a stamp file says which it is.
if [ "$(cat "$bin/.helm-version" 2>/dev/null)" != "$helm_version" ] || [ ! -x "$bin/helm" ]; then
  echo "check-deploy: installing helm ${helm_version} into $bin (go install)" >&2
  GOBIN="$bin" go install "helm.sh/helm/v3/cmd/helm@${helm_version}"
  echo "$helm_version" >"$bin/.helm-version"
fi
if [ "$(cat "$bin/.kubeconform-version" 2>/dev/null)" != "$kubeconform_version" ] || [ ! -x "$bin/kubeconform" ]; then
  echo "check-deploy: installing kubeconform ${kubeconform_version} into $bin (go install)" >&2
  GOBIN="$bin" go install "github.com/yannh/kubeconform/cmd/kubeconform@${kubeconform_version}"
  echo "$kubeconform_version" >"$bin/.kubeconform-version"
fi
schemas="$schemas_root/v${k8s_version}-local-strict"
if [ ! -f "$schemas/.complete" ]; then
  echo "check-deploy: fetching the Kubernetes ${k8s_version} JSON schemas (PyPI: kubernetes-validate)" >&2
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: "kubernetes-validate==1.37.0" -d "$tmp"
  echo "$wheel_sha256  $tmp/$wheel" | sha256sum -c - >/dev/null ||
    { echo "check-deploy: $wheel does not have the pinned SHA-256" >&2; exit 1; }
  mkdir -p "$schemas_root"
  python3 - "$tmp/$wheel" "$schemas" "v${k8s_version}-local-strict" <<'PY'
# Standalone schemas for the kinds we ship: each with the definitions it references (the
# wheel's schemas point into a shared _definitions.json by a rooted path kubeconform cannot
# follow). A kind not listed has no schema, which kubeconform reports as an error: add it.
import json, os, sys, zipfile
wheel, out, version = sys.argv[1:]
kinds = ["configmap-v1", "secret-v1", "service-v1", "serviceaccount-v1",
         "statefulset-apps-v1", "deployment-apps-v1", "networkpolicy-networking-v1",
         "poddisruptionbudget-policy-v1"]
prefix = f"kubernetes_validate/kubernetes-json-schema/{version}/"
with zipfile.ZipFile(wheel) as z:
    defs = json.loads(z.read(prefix + "_definitions.json"))["$defs"]
    os.makedirs(out, exist_ok=True)
    for kind in kinds:
        schema = json.loads(z.read(f"{prefix}{kind}.json"))
        needed = {}
        def walk(node):
            if isinstance(node, dict):
                ref = node.get("$ref")
                # "/api/_definitions.json#/$defs/X" in a kind's schema, "#/$defs/X" within
                # the definitions themselves.
                if isinstance(ref, str) and "#/$defs/" in ref:
                    name = ref.split("#/$defs/", 1)[1]
                    node["$ref"] = "#/$defs/" + name
                    if name not in needed:
                        needed[name] = json.loads(json.dumps(defs[name]))
                        walk(needed[name])
                for v in node.values():
                    if v is not node.get("$ref"):
                        walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)
        walk(schema)
        schema["$defs"] = needed
        with open(f"{out}/{kind}.json", "w") as f:
            json.dump(schema, f)
PY
  rm -rf "$tmp"
  touch "$schemas/.complete"
fi

chart=deploy/helm/ksched
kubeconform() {
  "$bin/kubeconform" -strict -summary -output text \
    -schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" "$@"
}

echo "check-deploy: helm lint" >&2
"$bin/helm" lint --strict "$chart"
echo "check-deploy: the chart with its defaults" >&2
"$bin/helm" template ksched "$chart" --namespace jobs | kubeconform -
echo "check-deploy: the chart with every option on" >&2
"$bin/helm" template ksched "$chart" --namespace jobs \
  --set kafka.clientPropertiesSecret=kafka-client \
  --set apiTokens.existingSecret=tokens \
  --set persistence.storageClass=fast \
  --set serviceAccount.create=false \
  --set podDisruptionBudget.enabled=false \
  --set-json 'apiTokens.tokens=[{"principal":"alice","token_sha256":"00","roles":["approver"]}]' \
  --set-json 'nodeSelector={"disk":"ssd"}' | kubeconform -
echo "check-deploy: deploy/k8s" >&2
kubeconform deploy/k8s/*.yaml
echo "check-deploy: a misspelt field is refused (the check can fail)" >&2
if "$bin/helm" template ksched "$chart" |
  sed 's/readOnlyRootFilesystem: true/readOnlyRootFileSystem: true/' | kubeconform - >/dev/null 2>&1; then
  echo "check-deploy: kubeconform accepted readOnlyRootFileSystem (a typo): the check is not strict" >&2
  exit 1
fi
echo "check-deploy: compose files (compose-go, the Compose Specification's schema)" >&2
compose_check() { (cd deploy/tools/compose-check && go run . "$@"); }
compose_check "$PWD/deploy/docker-compose.yml" "$PWD/deploy/docker-compose.ksched.yml"
bad=$(mktemp --suffix=.yml)
sed 's/^    image: apache\/kafka/    imagee: apache\/kafka/' deploy/docker-compose.yml >"$bad"
if compose_check "$bad" >/dev/null 2>&1; then
  echo "check-deploy: compose-check accepted an unknown service key: the check is not strict" >&2
  exit 1
fi
rm -f "$bad"
echo "check-deploy: ok" >&2
