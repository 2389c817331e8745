// Package e2e holds end-to-end tests that run Sluice's components as a
// small cluster on one machine: network namespaces for Nodes and Pods,
// real kernel conntrack, real sockets. They need root; without it, or
// without the tools they use, they skip (or fail with
// SLUICE_REQUIRE_PEERS=1, as in CI).
package e2e
