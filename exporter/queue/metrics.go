package queue

import "github.com/prometheus/client_golang/prometheus"

// SenderMetrics are the series of a transport that sends what a Queue
// holds to the aggregator (ipfixsend over IPFIX, grpcsend over gRPC):
// one type, so that an exporter counts either transport in the same
// series. Nil fields are not counted.
type SenderMetrics struct {
	// Sent counts records written to the aggregator.
	Sent prometheus.Counter
	// EncodeErrors counts records that could not be encoded (dropped).
	EncodeErrors prometheus.Counter
	// Connected is 1 while connected (an Export stream is open).
	Connected prometheus.Gauge
	// Reconnects counts connections made after the first.
	Reconnects prometheus.Counter
	// ConnectFailures counts failed connection attempts.
	ConnectFailures prometheus.Counter
	// Resent counts records written again because the aggregator had not
	// confirmed them when the connection broke: the most duplicates it
	// may have received.
	Resent prometheus.Counter
}
