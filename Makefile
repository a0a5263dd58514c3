# ofsdn — see README.md. Every target installs what it needs on a bare Debian machine.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
GO       ?= go
OUT      := _output
BIN      := $(OUT)/bin
PKGS     := ./...
STATICCHECK_VERSION := v0.8.2
GOTEST   := $(GO) test -count=1
# Real-OVS and real-apiserver tests run as root in network namespaces the tests make themselves.
export OFSDN_REPO := $(CURDIR)
# make deps installs Chromium: a browser test that cannot find it fails instead of skipping.
export OFSDN_REQUIRE_BROWSER := 1

.PHONY: all build image test unit integration e2e bench demo demo-down lint clean deps k8s-bins sweep conformance-cnp ui-test

all: build

## deps: Debian packages the tests and the lab need (OVS in userspace, ethtool, iproute2).
deps:
	@hack/install-deps.sh

## k8s-bins: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (skipped when built).
k8s-bins:
	@hack/build-k8s.sh

## build: every binary into _output/bin.
build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/... ./e2e/cmd/...

## image: the OCI image (no docker needed) into $(OUT)/image: an OCI layout (oci/) and ofsdn-image.tar for
## docker load / ctr import; prints its name, digest and size. IMAGE names it (the tag is the git version);
## PUSH=1 also pushes it there with your registry credentials (docker login's).
IMAGE    ?= ofsdn/ofsdn
PUSH     ?=
image:
	$(GO) run ./internal/cmd/mkimage --out $(OUT)/image --name $(IMAGE) $(if $(PUSH),--push)

## test: every tier that exists: unit, then integration (real OVS, real API server), then e2e.
test: deps k8s-bins unit integration e2e

## unit: no root, no daemons: logic, and the controller and agent on fake clientsets (tests that need
## real parts skip under -short).
unit:
	$(GOTEST) -short $(PKGS)
	cd conformance/cnp && $(GOTEST) -short ./...

## integration: everything against real ovs-vswitchd / kube-apiserver (needs root).
integration: deps k8s-bins sweep
	$(GOTEST) -timeout 30m $(PKGS)

## e2e: the multi-node lab (tests in e2e/ with build tag e2e; the lab's own packages test in integration).
e2e: deps k8s-bins build sweep
	$(GOTEST) -tags e2e -timeout 40m ./e2e/

## conformance-cnp: SIG Network's ClusterNetworkPolicy conformance suite (network-policy-api v0.3.0, its
## own module in conformance/cnp) on the 3-node lab in networkpolicy mode; writes its ConformanceReport to
## conformance/cnp/report.yaml. About 10 minutes.
conformance-cnp: deps k8s-bins build sweep
	$(BIN)/ofsdn-lab --bin-dir $(CURDIR)/$(BIN) --mode networkpolicy -- bash -c 'cd conformance/cnp && \
		OFSDN_VERSION=$$(git describe --always --dirty) $(GO) test -count=1 -timeout 60m -v \
		-run TestClusterNetworkPolicyConformance . -args -report-output=report.yaml'

## ui-test: the web console's browser tests alone (headless Chromium): the accessibility checker, the
## console on fakes, then on the 3-node lab; screenshots in $(OUT)/ui-screenshots/.
ui-test: deps k8s-bins build sweep
	$(GOTEST) -run 'TestAccessibilityChecker|TestLoopbackOnly|TestUIInBrowser' ./internal/browser/ ./flowctl/
	$(GOTEST) -tags e2e -timeout 20m -run 'TestConsole' ./e2e/

## bench: benchmarks that print their figures (ratios against baselines measured in the same run);
## then the lab's (CNI ADD latency, convergence across nodes, agent memory) on the 3-node cluster.
bench: deps k8s-bins sweep
	$(GO) test -run '^$$' -bench . -benchtime 3x -timeout 60m $(PKGS)
	$(GO) test -tags e2e -run '^$$' -bench . -benchtime 1x -timeout 30m ./e2e/

## demo: the 3-node lab cluster: two tenants and default, the connectivity matrix, a flowctl dump.
demo: deps k8s-bins build
	@hack/demo.sh

demo-down: build
	@hack/demo.sh down

## lint: gofmt, go vet, staticcheck.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags e2e ./e2e/
	@command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@# client/ is code-generator's output; its templates use client-go APIs staticcheck marks deprecated.
	"$$($(GO) env GOPATH)/bin/staticcheck" $$($(GO) list $(PKGS) | grep -v '/ofsdn/client/')
	"$$($(GO) env GOPATH)/bin/staticcheck" -tags e2e ./e2e/

## sweep: remove network namespaces, daemons and temp dirs that killed test runs left behind.
sweep:
	@$(GO) run ./internal/cmd/sweep

clean: sweep
	rm -rf $(OUT)
