#!/usr/bin/env bash
# Installs the Debian packages ofsdn's tests and lab need, only when something is missing.
set -euo pipefail
need=()
command -v ovs-vswitchd >/dev/null 2>&1 || need+=(openvswitch-switch openvswitch-common)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v nft >/dev/null 2>&1 || need+=(nftables) # tests read the table back with nft
command -v curl >/dev/null 2>&1 || need+=(curl) # e2e: pods reach the API server through its service
command -v ctr >/dev/null 2>&1 || need+=(containerd) # tests import the image with ctr; the lab's real nodes run it
[ -x /usr/lib/cni/loopback ] || need+=(containernetworking-plugins) # containerd brings pods' lo up with it
# Browser tests of flowctl ui drive Debian's headless Chromium (internal/browser); a font so that
# their screenshots show text.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${need[*]}; run as root (apt-get install ${need[*]})" >&2
  exit 1
fi
echo "install-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
