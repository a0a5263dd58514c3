#!/usr/bin/env bash
# Regenerates everything a generator writes for the network.ofsdn.io API:
#   apis/network/v1/zz_generated.deepcopy.go      deepcopy-gen   (k8s.io/code-generator, version from go.mod)
#   client/{clientset,informers,listers}/         client-gen, informer-gen, lister-gen (same)
#   deploy/crds/network.ofsdn.io_*.yaml            controller-gen (sigs.k8s.io/controller-tools) from the markers
# With --verify it generates into a scratch copy and fails if the committed files differ.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONTROLLER_TOOLS_VERSION=v0.19.0
MODULE=github.com/ofsdn/ofsdn

verify=false
if [ "${1:-}" = "--verify" ]; then verify=true; fi

gen() { # gen DIR: generate into the checkout (or a copy of it) at DIR
  # (kube_codegen.sh assigns globals such as $dir, hence the long name)
  local ofsdn_root=$1
  cd "$ofsdn_root"
  local codegen
  # `go list -m` names the directory only once the module is in the cache; a fresh machine has no copy yet.
  go mod download k8s.io/code-generator
  codegen=$(go list -m -f '{{.Dir}}' k8s.io/code-generator)
  if [ -z "$codegen" ] || [ ! -f "$codegen/kube_codegen.sh" ]; then
    echo "update-codegen: k8s.io/code-generator not found in the module cache (got '$codegen')" >&2
    return 1
  fi
  local boilerplate
  boilerplate=$(mktemp)
  : >"$boilerplate" # no licence header
  # shellcheck disable=SC1091
  source "$codegen/kube_codegen.sh"
  kube::codegen::gen_helpers --boilerplate "$boilerplate" "$ofsdn_root/apis"
  kube::codegen::gen_client --with-watch \
    --output-dir "$ofsdn_root/client" --output-pkg "$MODULE/client" \
    --boilerplate "$boilerplate" "$ofsdn_root/apis"
  rm -f "$boilerplate"
  # controller-gen runs outside the module so its own dependencies never enter go.mod. Only ofsdn's own
  # API: apis/policy is ofsdn's reading of ClusterNetworkPolicy, whose CRD is network-policy-api's own.
  mkdir -p "$ofsdn_root/deploy/crds"
  find "$ofsdn_root/deploy/crds" -name 'network.ofsdn.io_*.yaml' -delete
  go run "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION" \
    crd:crdVersions=v1 paths=./apis/network/... output:crd:dir=./deploy/crds
}

if ! $verify; then
  gen "$ROOT"
  exit 0
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# Copy what the generators read and write (go.mod/go.sum for the versions), generate, compare.
cp "$ROOT/go.mod" "$ROOT/go.sum" "$scratch/"
mkdir -p "$scratch/deploy"
cp -r "$ROOT/apis" "$ROOT/client" "$scratch/"
cp -r "$ROOT/deploy/crds" "$scratch/deploy/"
(gen "$scratch")
status=0
for d in apis client deploy/crds; do
  if ! diff -ru "$ROOT/$d" "$scratch/$d"; then status=1; fi
done
if [ $status -ne 0 ]; then
  echo "generated code is out of date: run hack/update-codegen.sh" >&2
fi
exit $status
