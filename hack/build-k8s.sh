#!/usr/bin/env bash
# Builds the lab's Kubernetes from pinned sources into _output/k8s/bin (git-ignored): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (lab/kubelab runs them), and kubelet
# (e2e/kubelet runs one per lab node, beside Debian's containerd). Nothing in Debian ships them. The
# build lives in its own module (hack/k8s) so ofsdn's module never depends on k8s.io/kubernetes. A cold build takes minutes; the script does nothing when the
# binaries exist and the stamp says they were built from the pins below.
#
#   hack/build-k8s.sh          build when missing or stale
#   hack/build-k8s.sh --force  rebuild regardless of the stamp
#   OFSDN_K8S_BIN=/dir         build into /dir instead (lab/kubelab reads the same variable)
set -euo pipefail

K8S_VERSION=v1.34.4   # k8s.io/kubernetes; staging modules are replaced with v0.${minor}.${patch}
ETCD_VERSION=v3.6.4   # go.etcd.io/etcd/server/v3
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/hack/k8s"
BIN="${OFSDN_K8S_BIN:-$ROOT/_output/k8s/bin}"
STAMP="$BIN/.stamp"

log() { echo "build-k8s: $*" >&2; }
die() { log "error: $*"; exit 1; }

force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) die "unknown argument '$1' (usage: $0 [--force])" ;;
esac

command -v go >/dev/null 2>&1 || die "go is not on PATH"
[ -f "$MOD/go.mod" ] || die "$MOD/go.mod is missing"

# The script's pins and the module's must agree, or the stamp would lie about what was built.
grep -Eq "^[[:space:]]*k8s\.io/kubernetes ${K8S_VERSION//./\\.}\$" "$MOD/go.mod" ||
  die "hack/k8s/go.mod does not require k8s.io/kubernetes $K8S_VERSION"
grep -Eq "^[[:space:]]*go\.etcd\.io/etcd/server/v3 ${ETCD_VERSION//./\\.}\$" "$MOD/go.mod" ||
  die "hack/k8s/go.mod does not require go.etcd.io/etcd/server/v3 $ETCD_VERSION"

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  # Without these kubectl and clients see v0.0.0-master and refuse to parse the server version.
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

# The stamp names everything the binaries depend on: the pins, the module's exact dependency set, the
# link flags. Any change rebuilds.
want="kubernetes=$K8S_VERSION etcd=$ETCD_VERSION deps=$(cat "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -d' ' -f1) ldflags=$(echo "$ldflags" | sha256sum | cut -c1-16)"

up_to_date() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]
}

if [ "$force" -eq 0 ] && up_to_date; then
  log "up to date in $BIN ($K8S_VERSION, etcd $ETCD_VERSION)"
  exit 0
fi

log "building Kubernetes $K8S_VERSION and etcd $ETCD_VERSION into $BIN"
log "a cold build takes about 5 minutes on 2 cores (~3 GB build cache, ~2 GB memory); warm rebuilds ~15 s"
mkdir -p "$BIN"
# Build into a scratch dir beside BIN and move the results in only when all succeeded, so an interrupted
# build never leaves a half-written binary that looks usable.
tmp="$(mktemp -d "$BIN/../.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
rm -f "$STAMP"

start=$SECONDS
cd "$MOD"
export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
log "go build kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet"
# kubelet is the same version as the control plane (a kubelet newer than its API server is unsupported);
# it builds without cgo (cAdvisor's cgo parts are optional) and runs the lab's nodes with cgroupfs.
go build -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet
log "go build etcd"
go build -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3

for b in "${BINARIES[@]}"; do
  [ -x "$tmp/$b" ] || die "go build produced no $b"
  mv -f "$tmp/$b" "$BIN/$b"
done
got="$("$BIN/kubectl" version --client 2>&1)" || die "kubectl version --client failed: $got"
case "$got" in
  *"$K8S_VERSION"*) ;;
  *) die "kubectl reports '$got', want $K8S_VERSION (ldflags not applied?)" ;;
esac
echo "$want" >"$STAMP"
log "done in $((SECONDS - start)) s: ${BINARIES[*]}"
