package flow

import "net/netip"

// Query selects flows by their 5-tuple, for the flow-record API. Unset
// fields match anything; with all five set, a flow is found by its key.
type Query struct {
	SrcIP, DstIP     netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
	// Limit caps the records returned (the count of matches is still
	// complete); 0 means no cap.
	Limit int
}

// Exact reports whether all five fields of the 5-tuple are set.
func (q *Query) Exact() bool {
	return q.SrcIP.IsValid() && q.DstIP.IsValid() && q.Proto != 0 && q.SrcPort != 0 && q.DstPort != 0
}

// Matches reports whether a flow with this 5-tuple is selected.
func (q *Query) Matches(src, dst netip.Addr, sport, dport uint16, proto uint8) bool {
	return (!q.SrcIP.IsValid() || q.SrcIP == src) && (!q.DstIP.IsValid() || q.DstIP == dst) &&
		(q.Proto == 0 || q.Proto == proto) && (q.SrcPort == 0 || q.SrcPort == sport) &&
		(q.DstPort == 0 || q.DstPort == dport)
}
