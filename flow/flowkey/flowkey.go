// Package flowkey makes the Kafka message key of a record: a symmetric
// flow key, the same for the source Node's and the destination Node's
// records of one connection (and for the two directions of it), with the
// ports in it so that one busy pair of addresses spreads over partitions.
// The Aggregate store correlates by the same 5-tuple, so both halves of a
// connection land on one partition and one replica.
package flowkey

import (
	"net/netip"

	"sluice/flow"
)

// Size is the length of a key: protocol, then the lower endpoint's
// address (16 octets, IPv4 mapped) and port, then the higher's.
const Size = 1 + 2*(16+2)

// Append appends f's key to b.
//
// The ingress-Node half of an inter-Node from-external flow names the
// proxy's SNAT address and port, which is what the destination Node sees
// as the source: it is keyed on them, as the Aggregate store does.
func Append(b []byte, f *flow.Flow) []byte {
	src, sport := f.SourceIP, f.SourcePort
	if IngressHalf(f) {
		src, sport = f.ProxySnatIP, f.ProxySnatPort
	}
	a := endpoint(src, sport)
	z := endpoint(f.DestinationIP, f.DestinationPort)
	if less(z, a) {
		a, z = z, a
	}
	b = append(b, f.Protocol)
	b = append(b, a[:]...)
	return append(b, z[:]...)
}

// AppendSNAT appends the key of f with the proxy's SNAT address and port
// as the source, and reports true, when f is a from-external record that
// names them. The Aggregate store keeps an inter-Node from-external flow
// under that key, but its correlated export names the external client as
// the source (and a destination Pod), so Append gives another key: a
// reader matching exports to records must try both.
func AppendSNAT(b []byte, f *flow.Flow) ([]byte, bool) {
	if f.FlowType != flow.FlowTypeFromExternal || !f.ProxySnatIP.IsValid() || f.ProxySnatIP.IsUnspecified() {
		return b, false
	}
	a := endpoint(f.ProxySnatIP, f.ProxySnatPort)
	z := endpoint(f.DestinationIP, f.DestinationPort)
	if less(z, a) {
		a, z = z, a
	}
	b = append(b, f.Protocol)
	b = append(b, a[:]...)
	return append(b, z[:]...), true
}

// IngressHalf reports whether f is the ingress-Node half of an inter-Node
// from-external flow (the Aggregate store's rule, §3.2).
func IngressHalf(f *flow.Flow) bool {
	return f.FlowType == flow.FlowTypeFromExternal && f.DestinationPodName == "" &&
		f.ProxySnatIP.IsValid() && !f.ProxySnatIP.IsUnspecified()
}

func endpoint(a netip.Addr, port uint16) [18]byte {
	var e [18]byte
	if a.IsValid() {
		x := a.As16()
		copy(e[:16], x[:])
	}
	e[16], e[17] = byte(port>>8), byte(port)
	return e
}

func less(a, b [18]byte) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}
