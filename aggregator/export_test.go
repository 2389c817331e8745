package aggregator

import "sluice/enrich"

// CloseIPFIXListenerForTest simulates the IPFIX listener failing.
func (a *Aggregator) CloseIPFIXListenerForTest() { a.tcpLn.Close() }

// MetadataSourceForTest is the aggregator's Pod metadata source (nil
// without one).
func (a *Aggregator) MetadataSourceForTest() enrich.Source { return a.meta }
