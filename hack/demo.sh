#!/usr/bin/env bash
# make demo: a whole ofsdn cluster in the lab — three node namespaces with their own Open vSwitch, a real
# kube-apiserver (+ etcd, controller-manager, scheduler), containerd and kubelet per node running
# deploy/'s ofsdn-controller and ofsdn-agent from the image, pods started by kubelet through the ofsdn CNI
# plugin — then two tenants and default, the connectivity matrix and a flowctl dump. Tears down on exit;
# `make demo-down` (hack/demo.sh down) removes what an interrupted run left. Extra arguments go to
# ofsdn-demo (e.g. --keep, --mode subnet, -v, --kubelets=false for the kubelet stand-in).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "down" ]; then
  exec _output/bin/ofsdn-demo --down
fi
exec _output/bin/ofsdn-demo --bin-dir _output/bin "$@"
