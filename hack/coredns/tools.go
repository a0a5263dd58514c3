//go:build tools

// Package tools pins CoreDNS, which hack/build-k8s-e2e.sh builds for the lab's cluster DNS (the e2e DNS
// tests need one), so that go.mod and go.sum hold every module it needs. It is never compiled (build
// tag "tools"); the script builds the command by import path.
package tools

import _ "github.com/coredns/coredns"
