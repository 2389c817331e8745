// Package interop holds the tests and benchmarks that run Sluice's IPFIX
// codec against peer libraries. It is a module of its own so that the
// peers never become dependencies of the main module.
package interop
