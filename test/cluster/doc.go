// Package cluster holds the real-cluster tests: Sluice installed with
// `helm install` on a real single-node Kubernetes cluster
// (scripts/local-cluster.sh: kubelet, containerd, the bridge CNI,
// kube-proxy), watching a real workload. They need root and run only
// when SLUICE_CLUSTER_TESTS=1 (`make cluster-test`, part of `make test`),
// on their own, since they change the machine's network (a bridge,
// nftables, sysctls) until they stop.
package cluster
