package aggregator

// CloseIPFIXListenerForTest simulates the IPFIX listener failing.
func (a *Aggregator) CloseIPFIXListenerForTest() { a.tcpLn.Close() }
