#!/usr/bin/env bash
# Builds what `make conformance` runs against the lab into _output/k8s/e2e (git-ignored): Kubernetes' own
# e2e suite (e2e.test, `go test -c k8s.io/kubernetes/test/e2e`) and the ginkgo runner at the control
# plane's version (module hack/k8s), and CoreDNS (module hack/coredns) for the lab's cluster DNS. All from
# the Go module proxy; nothing is pulled from a registry. Skipped when the stamp says the binaries were
# built from the modules as they are.
#
#   hack/build-k8s-e2e.sh          build when missing or stale
#   hack/build-k8s-e2e.sh --force  rebuild regardless of the stamp
#   OFSDN_K8S_E2E_BIN=/dir         build into /dir instead (e2e/conformance reads the same variable)
set -euo pipefail

K8S_VERSION=v1.34.4     # must match hack/build-k8s.sh: the suite tests the cluster it was released with
COREDNS_VERSION=v1.12.1 # what kubeadm v1.34 deploys
BINARIES=(e2e.test ginkgo coredns)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${OFSDN_K8S_E2E_BIN:-$ROOT/_output/k8s/e2e}"
STAMP="$BIN/.stamp"

log() { echo "build-k8s-e2e: $*" >&2; }
die() { log "error: $*"; exit 1; }

force=0
case "${1:-}" in
  "") ;;
  --force) force=1 ;;
  *) die "unknown argument '$1' (usage: $0 [--force])" ;;
esac
command -v go >/dev/null 2>&1 || die "go is not on PATH"
grep -Eq "^[[:space:]]*k8s\.io/kubernetes ${K8S_VERSION//./\\.}\$" "$ROOT/hack/k8s/go.mod" ||
  die "hack/k8s/go.mod does not require k8s.io/kubernetes $K8S_VERSION"
grep -Eq "^(require)?[[:space:]]*github\.com/coredns/coredns ${COREDNS_VERSION//./\\.}\$" "$ROOT/hack/coredns/go.mod" ||
  die "hack/coredns/go.mod does not require github.com/coredns/coredns $COREDNS_VERSION"

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
want="kubernetes=$K8S_VERSION coredns=$COREDNS_VERSION deps=$(cat "$ROOT"/hack/k8s/go.{mod,sum} "$ROOT"/hack/coredns/go.{mod,sum} | sha256sum | cut -d' ' -f1) ldflags=$(echo "$ldflags" | sha256sum | cut -c1-16)"

up_to_date() {
  local b
  for b in "${BINARIES[@]}"; do [ -x "$BIN/$b" ] || return 1; done
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]
}
if [ "$force" -eq 0 ] && up_to_date; then
  log "up to date in $BIN (e2e.test $K8S_VERSION, CoreDNS $COREDNS_VERSION)"
  exit 0
fi

log "building e2e.test and ginkgo ($K8S_VERSION) and CoreDNS $COREDNS_VERSION into $BIN"
log "a cold build takes 5-15 minutes on 2 cores (e2e.test compiles most of Kubernetes' test tree)"
mkdir -p "$BIN"
tmp="$(mktemp -d "$BIN/../.build-e2e.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
rm -f "$STAMP"
start=$SECONDS
export GOWORK=off GOFLAGS="-mod=readonly -buildvcs=false" CGO_ENABLED=0
(
  cd "$ROOT/hack/k8s"
  log "go test -c k8s.io/kubernetes/test/e2e"
  go test -c -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
  log "go build ginkgo"
  go build -ldflags "-s -w" -o "$tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
)
(
  cd "$ROOT/hack/coredns"
  log "go build coredns"
  go build -ldflags "-s -w" -o "$tmp/coredns" github.com/coredns/coredns
)
for b in "${BINARIES[@]}"; do
  [ -x "$tmp/$b" ] || die "the build produced no $b"
  mv -f "$tmp/$b" "$BIN/$b"
done
got="$("$BIN/e2e.test" --version 2>&1 | head -1)" || true
case "$got" in
  *"$K8S_VERSION"*) ;;
  *) die "e2e.test --version says '$got', want $K8S_VERSION" ;;
esac
echo "$want" >"$STAMP"
log "done in $((SECONDS - start)) s: ${BINARIES[*]}"
