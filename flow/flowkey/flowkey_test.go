package flowkey

import (
	"bytes"
	"net/netip"
	"testing"

	"sluice/flow"
)

func rec(src, dst string, sport, dport uint16) *flow.Flow {
	return &flow.Flow{SourceIP: netip.MustParseAddr(src), DestinationIP: netip.MustParseAddr(dst),
		SourcePort: sport, DestinationPort: dport, Protocol: 6, FlowType: flow.FlowTypeInterNode}
}

func TestSymmetricWithPorts(t *testing.T) {
	a := Append(nil, rec("10.0.1.5", "10.0.2.7", 40000, 80))
	if len(a) != Size {
		t.Fatalf("key of %d octets, want %d", len(a), Size)
	}
	if b := Append(nil, rec("10.0.2.7", "10.0.1.5", 80, 40000)); !bytes.Equal(a, b) {
		t.Errorf("the reverse direction has another key:\n%x\n%x", a, b)
	}
	if c := Append(nil, rec("10.0.1.5", "10.0.2.7", 40001, 80)); bytes.Equal(a, c) {
		t.Error("another source port has the same key: ports are not in it")
	}
	udp := rec("10.0.1.5", "10.0.2.7", 40000, 80)
	udp.Protocol = 17
	if bytes.Equal(a, Append(nil, udp)) {
		t.Error("another protocol has the same key")
	}
}

func TestIngressHalfKeyedOnSNAT(t *testing.T) {
	ingress := rec("203.0.113.9", "10.0.2.7", 5555, 8080)
	ingress.FlowType = flow.FlowTypeFromExternal
	ingress.ProxySnatIP, ingress.ProxySnatPort = netip.MustParseAddr("10.0.1.1"), 61000
	egress := rec("10.0.1.1", "10.0.2.7", 61000, 8080)
	egress.FlowType = flow.FlowTypeFromExternal
	egress.DestinationPodName = "web"
	if a, b := Append(nil, ingress), Append(nil, egress); !bytes.Equal(a, b) {
		t.Errorf("the two halves of a from-external flow have different keys:\n%x\n%x", a, b)
	}
}
