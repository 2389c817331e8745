#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, offline, for trying
# Sluice as users run it (docs/development.md) and for the real-cluster
# tests (test/cluster):
#
#   scripts/local-cluster.sh up       start it (builds what it needs once),
#                                     import Sluice's image; prints KUBECONFIG=...
#   scripts/local-cluster.sh down     stop it and leave the machine as it was
#   scripts/local-cluster.sh import F import an image tar (OCI layout) into the Node
#   scripts/local-cluster.sh env      print KUBECONFIG=... of a running cluster
#
# Parts: Debian's etcd, containerd, runc and CNI plugins (bridge,
# host-local); kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy (nftables mode) and kubectl built from
# k8s.io/kubernetes by scripts/build-kube.sh. No registry: images are
# imported with ctr, the sandbox (pause) image is test/cluster/testkit's.
# Everything lives under $SLUICE_CLUSTER_DIR (default /tmp/sluice-cluster);
# `down` removes processes, mounts, the bridge, nftables tables, cgroups and
# restores the sysctls it changed. Needs root.
set -euo pipefail

DIR=${SLUICE_CLUSTER_DIR:-/tmp/sluice-cluster}
REPO=$(cd "$(dirname "$0")/.." && pwd)
NODE=${SLUICE_CLUSTER_NODE:-node-1}
BRIDGE=sluicebr0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/12
API_PORT=16443
ETCD_PORT=12379
SOCK=$DIR/containerd/containerd.sock
SANDBOX_IMAGE=example.invalid/testkit:1
SYSCTLS=(net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.netfilter.nf_conntrack_acct
  vm.overcommit_memory kernel.panic kernel.panic_on_oops)

log() { echo "local-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

kubectl_() { "$KBIN/kubectl" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }

need_root() { [[ $(id -u) -eq 0 ]] || die "needs root (network, mounts, containerd)"; }

install_deps() {
  local need=()
  command -v etcd >/dev/null || need+=(etcd-server)
  command -v containerd >/dev/null || need+=(containerd)
  command -v runc >/dev/null || need+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
  command -v nft >/dev/null || need+=(nftables)
  command -v iptables >/dev/null || need+=(iptables)
  command -v conntrack >/dev/null || need+=(conntrack)
  command -v openssl >/dev/null || need+=(openssl)
  command -v ip >/dev/null || need+=(iproute2)
  if ((${#need[@]})); then
    log "apt-get install ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

# start NAME CMD... runs a daemon in its own session, its output in
# $DIR/logs/NAME.log, its pid in $DIR/pids/NAME.
start() {
  local name=$1; shift
  setsid "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/pids/$name"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
  local what=$1 secs=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || die "timed out after ${secs}s waiting for $what (logs in $DIR/logs)"
    sleep 0.5
  done
}

certs() {
  local d=$DIR/pki
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=sluice-local-cluster-ca \
    -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$d/apiserver.key" -out "$d/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s,IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost\nextendedKeyUsage=serverAuth\n' \
    "$NODE_IP" >"$d/apiserver.ext"
  openssl x509 -req -in "$d/apiserver.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 30 \
    -extfile "$d/apiserver.ext" -out "$d/apiserver.crt" 2>/dev/null
  # The API server's client certificate towards the kubelet (logs, exec,
  # port-forward), which the kubelet checks against the same CA.
  openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    -keyout "$d/kubelet-client.key" -out "$d/kubelet-client.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' >"$d/client.ext"
  openssl x509 -req -in "$d/kubelet-client.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 30 \
    -extfile "$d/client.ext" -out "$d/kubelet-client.crt" 2>/dev/null
  openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
  openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
  # One token in system:masters for every component and the admin: this
  # cluster is a test bench, not a security boundary.
  TOKEN=$(openssl rand -hex 16)
  echo "$TOKEN,admin,admin,\"system:masters\"" >"$d/tokens.csv"
  chmod 600 "$d"/*.key "$d/tokens.csv"
  cat >"$DIR/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority: "$d/ca.crt"}
users:
- name: admin
  user: {token: "$TOKEN"}
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
EOF
  chmod 600 "$DIR/admin.kubeconfig"
}

# save_state records what `down` must put back: the sysctls, the nftables
# tables that exist (the kubelet's iptables canaries make new ones), and
# whether /run/netns is a mount yet (the first network namespace makes it).
save_state() {
  : >"$DIR/sysctls.saved"
  for s in "${SYSCTLS[@]}"; do
    v=$(sysctl -n "$s" 2>/dev/null) || continue
    echo "$s=$v" >>"$DIR/sysctls.saved"
  done
  nft list tables >"$DIR/nft-tables.saved"
  if grep -q " /run/netns " /proc/self/mounts; then touch "$DIR/netns-mount.saved"; fi
  ls /run/netns 2>/dev/null >"$DIR/netns.saved" || true
  # The KUBE-* chains and kubepods cgroups of a kubelet that may already run
  # here are not ours to remove.
  for ipt in iptables ip6tables; do
    for table in mangle nat filter; do
      { $ipt -t $table -S 2>/dev/null || true; } | awk -v t="$ipt/$table" '$1 == "-N" {print t "/" $2}'
    done
  done >"$DIR/chains.saved"
  ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null >"$DIR/cgroups.saved" || true
}

network() {
  ip link add "$BRIDGE" type bridge
  ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Pod-to-Pod traffic over the bridge passes the host's netfilter, so
  # the host's conntrack (which the exporter reads) sees it; counters need
  # accounting on.
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 net.netfilter.nf_conntrack_acct=1
  # Nothing of the cluster leaves the machine: Service addresses route to
  # the bridge (kube-proxy rewrites them before they get there), and
  # Pods' packets bound elsewhere than the bridge or the host are dropped.
  ip route add "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"
  nft -f - <<EOF
table inet sluice-local-cluster {
  chain forward {
    type filter hook forward priority -10; policy accept;
    ip saddr $CLUSTER_CIDR oifname != "$BRIDGE" drop
  }
}
EOF
  mkdir -p "$DIR/cni/net.d" "$DIR/cni/ipam"
  cat >"$DIR/cni/net.d/10-sluice.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "sluice-local",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$DIR/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP", "rangeStart": "10.244.0.10"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

containerd_() {
  # /run/netns as the shared mount `ip netns add` makes on its first use,
  # before any Pod: made later (by anyone's `ip netns add`), it would cover
  # the Pods' namespaces, and the kubelet could no longer remove them.
  ip netns add sluice-local-cluster-probe
  ip netns delete sluice-local-cluster-probe
  mkdir -p "$DIR/containerd"
  cat >"$DIR/containerd/config.toml" <<EOF
version = 2
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$SANDBOX_IMAGE"
  # These machines lack CAP_SYS_RESOURCE: a sandbox's oom_score_adj of -998
  # would be refused and every Pod fail to start.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
EOF
  start containerd containerd --config "$DIR/containerd/config.toml"
  wait_for containerd 30 ctr -a "$SOCK" version
}

import_image() {
  ctr -a "$SOCK" -n k8s.io images import "$1" >&2
}

control_plane() {
  local p=$DIR/pki
  mkdir -p "$DIR/etcd"
  start etcd etcd --data-dir "$DIR/etcd" --name default \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
    --initial-cluster default=http://127.0.0.1:12380 --log-level warn
  start kube-apiserver "$KBIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" --client-ca-file "$p/ca.crt" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
    --token-auth-file "$p/tokens.csv" --authorization-mode Node,RBAC \
    --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true \
    --kubelet-preferred-address-types InternalIP \
    --kubelet-client-certificate "$p/kubelet-client.crt" --kubelet-client-key "$p/kubelet-client.key"
  wait_for kube-apiserver 90 kubectl_ get --raw /readyz
  start kube-controller-manager "$KBIN/kube-controller-manager" --kubeconfig "$DIR/admin.kubeconfig" \
    --authentication-kubeconfig "$DIR/admin.kubeconfig" --authorization-kubeconfig "$DIR/admin.kubeconfig" \
    --service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
    --cluster-cidr "$CLUSTER_CIDR" --allocate-node-cidrs=true --node-cidr-mask-size 24 \
    --service-cluster-ip-range "$SERVICE_CIDR" --use-service-account-credentials=true \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 10257
  start kube-scheduler "$KBIN/kube-scheduler" --kubeconfig "$DIR/admin.kubeconfig" \
    --authentication-kubeconfig "$DIR/admin.kubeconfig" --authorization-kubeconfig "$DIR/admin.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port 10259
}

node() {
  mkdir -p "$DIR/kubelet"
  cat >"$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# No cluster DNS runs here, and Pods get no name server: no query leaves
# the machine.
resolvConf: ""
clusterDomain: cluster.local
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$DIR/pki/ca.crt"}
authorization: {mode: Webhook}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
  start kubelet "$KBIN/kubelet" --config "$DIR/kubelet/config.yaml" --kubeconfig "$DIR/admin.kubeconfig" \
    --root-dir "$DIR/kubelet/root" --node-ip "$NODE_IP" --hostname-override "$NODE"
  cat >"$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $NODE
clientConnection: {kubeconfig: "$DIR/admin.kubeconfig"}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the machine's conntrack table size alone.
conntrack: {maxPerCore: 0, min: 0}
EOF
  start kube-proxy "$KBIN/kube-proxy" --config "$DIR/kube-proxy.yaml"
  wait_for "Node $NODE to register" 90 kubectl_ get node "$NODE"
  wait_for "Node $NODE to be Ready" 120 kubectl_ wait --for=condition=Ready "node/$NODE" --timeout=2s
  wait_for "a Pod CIDR on Node $NODE" 60 bash -c "[[ -n \$('$KBIN/kubectl' --kubeconfig '$DIR/admin.kubeconfig' get node '$NODE' -o jsonpath='{.spec.podCIDR}') ]]"
  wait_for "the default ServiceAccount" 60 kubectl_ -n default get serviceaccount default
}

images() {
  local t=$DIR/images
  mkdir -p "$t"
  (cd "$REPO" && CGO_ENABLED=0 go build -trimpath -o "$t/testkit" ./test/cluster/testkit)
  "$t/testkit" image -o "$t/testkit.tar" -ref "$SANDBOX_IMAGE"
  import_image "$t/testkit.tar"
  local img=${SLUICE_IMAGE:-}
  if [[ -z $img ]]; then
    (cd "$REPO" && make -s image >&2)
    img=$REPO/bin/sluice-image.tar
  fi
  import_image "$img"
}

up() {
  need_root
  [[ ! -e $DIR/pids ]] || die "a cluster already runs in $DIR (scripts/local-cluster.sh down first)"
  install_deps
  KBIN=$(KUBE_VERSION=${KUBE_VERSION:-v1.37.2} "$REPO/scripts/build-kube.sh")
  mkdir -p "$DIR/logs" "$DIR/pids"
  echo "$KBIN" >"$DIR/kubebin"
  save_state
  certs
  network
  containerd_
  images
  control_plane
  node
  log "up: Node $NODE Ready ($SECONDS s); logs in $DIR/logs"
  echo "KUBECONFIG=$DIR/admin.kubeconfig"
}

# stop_pid NAME: TERM, then KILL after 10 s.
stop_pid() {
  local f=$DIR/pids/$1 pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  need_root
  [[ -d $DIR ]] || { log "nothing under $DIR"; return 0; }
  KBIN=$(cat "$DIR/kubebin" 2>/dev/null || true)
  # No controller or scheduler makes new Pods; then every Pod is deleted
  # and the kubelet tears each one down the ordinary way (the CNI's DEL
  # frees its address and network namespace).
  stop_pid kube-controller-manager
  stop_pid kube-scheduler
  if [[ -n $KBIN ]] && kubectl_ get --raw /readyz >/dev/null 2>&1; then
    kubectl_ delete pods --all -A --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    for _ in $(seq 120); do
      [[ -z $(ctr -a "$SOCK" -n k8s.io containers ls -q 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  stop_pid kubelet
  stop_pid kube-proxy
  # What is left (the kubelet did not finish): killed through containerd.
  if [[ -S $SOCK ]]; then
    for id in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$SOCK" -n k8s.io tasks kill -s KILL "$id" >/dev/null 2>&1 || true
    done
    for id in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      for _ in $(seq 50); do
        ctr -a "$SOCK" -n k8s.io tasks delete "$id" >/dev/null 2>&1 && break
        sleep 0.1
      done
    done
    for id in $(ctr -a "$SOCK" -n k8s.io containers ls -q 2>/dev/null); do
      ctr -a "$SOCK" -n k8s.io containers delete "$id" >/dev/null 2>&1 || true
    done
  fi
  stop_pid kube-apiserver
  stop_pid etcd
  stop_pid containerd
  # Shims outlive containerd by design; theirs are ours.
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null || true
  # Network namespaces the CNI made for the Pods and the kubelet did not
  # tear down (containerd names them cni-<uuid>): those that were not there
  # before `up`.
  for ns in /run/netns/cni-*; do
    [[ -e $ns ]] || continue
    grep -qx "$(basename "$ns")" "$DIR/netns.saved" 2>/dev/null && continue
    while grep -q " $ns " /proc/self/mounts; do umount "$ns" 2>/dev/null || break; done
    rm -f "$ns" 2>/dev/null || true
  done
  # /run/netns itself, when `up` made it a mount and nothing else uses it.
  if [[ -f $DIR/sysctls.saved && ! -f $DIR/netns-mount.saved ]] && [[ -z $(ls /run/netns 2>/dev/null) ]]; then
    while grep -q " /run/netns " /proc/self/mounts; do umount /run/netns 2>/dev/null || break; done
  fi
  # Mounts under our folder (overlay roots, projected volumes, shm),
  # deepest first.
  { grep -o " $DIR[^ ]*" /proc/self/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  # cgroups the kubelet made.
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d $c ]] || continue
    grep -qx "$c" "$DIR/cgroups.saved" 2>/dev/null && continue
    find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  for t in "ip kube-proxy" "ip6 kube-proxy" "inet sluice-local-cluster"; do
    grep -qx "table $t" "$DIR/nft-tables.saved" 2>/dev/null && continue
    nft list table $t >/dev/null 2>&1 && nft delete table $t
  done
  # The kubelet's iptables chains (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY),
  # then the tables that did not exist before `up`.
  for ipt in iptables ip6tables; do
    for table in mangle nat filter; do
      # Only chains that were not there before `up`, and the jumps to them.
      new=$({ $ipt -t $table -S 2>/dev/null || true; } | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}' |
        while read -r chain; do grep -qx "$ipt/$table/$chain" "$DIR/chains.saved" 2>/dev/null || echo "$chain"; done)
      for chain in $new; do
        { $ipt -t $table -S 2>/dev/null || true; } | { grep -E "^-A [^ ]+ .*-j $chain( |\$)" || true; } |
          sed 's/^-A /-D /' | while read -r rule; do eval "$ipt -t $table $rule" 2>/dev/null || true; done
      done
      for chain in $new; do
        $ipt -t $table -F "$chain" 2>/dev/null || true
        $ipt -t $table -X "$chain" 2>/dev/null || true
      done
    done
  done
  if [[ -f $DIR/nft-tables.saved ]]; then
    nft list tables | while read -r _ family name; do
      grep -qx "table $family $name" "$DIR/nft-tables.saved" || nft delete table "$family" "$name" 2>/dev/null || true
    done
  fi

  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  if [[ -f $DIR/sysctls.saved ]]; then
    while IFS= read -r kv; do sysctl -qw "$kv" || true; done <"$DIR/sysctls.saved"
  fi
  rm -rf "$DIR"
  log "down"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  import)
    need_root
    [[ -n ${2:-} ]] || die "usage: $0 import IMAGE.tar"
    import_image "$2"
    ;;
  env) [[ -f $DIR/admin.kubeconfig ]] || die "no cluster in $DIR"; echo "KUBECONFIG=$DIR/admin.kubeconfig" ;;
  *) echo "usage: $0 up|down|import IMAGE.tar|env" >&2; exit 2 ;;
esac
