// Package interop holds interoperability tests of package sluice/ipfix
// against real third-party IPFIX implementations, run as child processes
// over real sockets: softflowd (exporter, UDP and TCP), tshark (dissector)
// and nfcapd/nfdump (collector).
//
// A test whose peer binary is missing is skipped, unless the environment
// variable SLUICE_REQUIRE_PEERS=1 is set (as in CI), in which case it fails.
package interop
