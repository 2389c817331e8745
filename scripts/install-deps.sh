#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine: the third-party
# IPFIX peers the interop tests run for real, the tools of the end-to-end
# tests, ClickHouse for the ClickHouse sink's tests, protoc for the check
# of the generated code, and the Go modules.
set -euo pipefail

need=()
command -v softflowd >/dev/null || need+=(softflowd)
command -v nfcapd >/dev/null || need+=(nfdump)
command -v tshark >/dev/null || need+=(tshark)
command -v tcpdump >/dev/null || need+=(tcpdump)
command -v nfacctd >/dev/null || need+=(pmacct)
# The exporter's end-to-end test: network namespaces, a conntrack rule,
# and the conntrack tool as an independent witness of the kernel counters.
command -v ip >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v conntrack >/dev/null || need+=(conntrack)
# The Traceflow model's check against real Open vSwitch (userspace
# datapath: no kernel module; the test starts its own daemons).
command -v ovs-vswitchd >/dev/null || need+=(openvswitch-switch)
# The Kubernetes tests: etcd beside a kube-apiserver built from source
# (scripts/build-kube.sh, run by `make deps`).
command -v etcd >/dev/null || need+=(etcd-server)
# The real-cluster tests (test/cluster, scripts/local-cluster.sh): a
# container runtime and the bridge CNI beside the Kubernetes binaries
# scripts/build-kube.sh builds. The image test also imports the image into
# a containerd of its own, as a containerd Node does.
command -v containerd >/dev/null || need+=(containerd)
command -v runc >/dev/null || need+=(runc)
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
command -v iptables >/dev/null || need+=(iptables)
command -v openssl >/dev/null || need+=(openssl)
# The ClickHouse sink's tests start their own server (Debian's 18.16).
command -v clickhouse-server >/dev/null || need+=(clickhouse-server)
command -v clickhouse-client >/dev/null || need+=(clickhouse-client)
# `make generate-check`: protoc and the well-known .proto files it includes.
command -v protoc >/dev/null || need+=(protobuf-compiler)
[[ -f /usr/include/google/protobuf/timestamp.proto ]] || need+=(libprotobuf-dev)
# The web UI: `make ui` builds it with Node.js and npm (the machine's own
# when it has them); its browser tests drive Debian's Chromium headless.
command -v node >/dev/null || need+=(nodejs npm)
command -v chromium >/dev/null || need+=(chromium)
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: need root to apt-get install ${need[*]}" >&2
    exit 1
  fi
  echo "install-deps: apt-get install ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

go mod download
(cd interop && go mod download)
