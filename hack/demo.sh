#!/usr/bin/env bash
# make demo: a lab of real Open vSwitch nodes in network namespaces of their own, ofsdn's pipeline
# installed over its OpenFlow session, tenants isolated across nodes through VXLAN. Tears down on exit;
# `make demo-down` (hack/demo.sh down) removes what an interrupted run left.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p _output/bin
go build -o _output/bin/ofsdn-demo ./e2e/cmd/ofsdn-demo
if [ "${1:-}" = "down" ]; then
  exec _output/bin/ofsdn-demo --down
fi
exec _output/bin/ofsdn-demo "$@"
