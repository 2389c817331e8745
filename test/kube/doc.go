// Package kube holds the tests that prove Sluice's Kubernetes objects and
// permissions on a real control plane (see package kubetest): the Helm
// chart renders and refuses what it should, every rendered object is
// accepted by server-side apply, and the aggregator and the exporter work
// with their own ServiceAccounts' tokens. No kubelet runs: Pods are API
// objects only. Without etcd, kube-apiserver or helm the tests skip, or
// fail with SLUICE_REQUIRE_PEERS=1 (as in CI).
package kube
