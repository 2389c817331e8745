package observed

import (
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/policy/flowsrc"
)

func TestSet(t *testing.T) {
	t0 := time.Unix(1_790_000_000, 0).UTC()
	rec := func(src, dst string, proto uint8, sport, dport uint16, start, end int, action uint8) *flowsrc.Record {
		return &flowsrc.Record{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: proto, SrcPort: sport, DstPort: dport,
			Start: t0.Add(time.Duration(start) * time.Second), End: t0.Add(time.Duration(end) * time.Second),
			Ingress: flow.Policy{Name: "p", Namespace: "ns", RuleName: "r", RuleAction: action}}
	}
	s := NewSet(2)
	for _, r := range []*flowsrc.Record{
		rec("10.0.0.1", "10.0.0.2", 6, 40000, 80, 10, 20, flow.ActionAllow),
		rec("10.0.0.1", "10.0.0.2", 6, 40001, 80, 5, 15, 0),                // another source port: the same connection
		rec("10.0.0.1", "10.0.0.2", 6, 40002, 80, 30, 40, flow.ActionDrop), // denied
		rec("10.0.0.1", "10.0.0.2", 1, 0, 7, 1, 2, flow.ActionAllow),       // ICMP: no port
		rec("10.0.0.1", "10.0.0.2", 1, 0, 9, 1, 3, flow.ActionAllow),       // the same ICMP connection
		rec("10.0.0.3", "10.0.0.2", 17, 5353, 53, 1, 2, flow.ActionReject), // a third connection: the set is full
	} {
		s.Add(r)
	}
	if s.Len() != 2 || s.Records != 6 || s.Dropped != 1 {
		t.Fatalf("%d connections, %d records, %d dropped", s.Len(), s.Records, s.Dropped)
	}
	cs := s.Conns()
	icmp, tcp := cs[0], cs[1]
	if icmp.Proto != 1 || icmp.DstPort != 0 || icmp.Allowed != 2 || icmp.Records() != 2 {
		t.Errorf("ICMP: %+v", icmp)
	}
	if tcp.Allowed != 2 || tcp.Denied != 1 || tcp.DeniedBy != "ns/p r" || tcp.SrcPort != 40000 ||
		!tcp.First.Equal(t0.Add(5*time.Second)) || !tcp.Last.Equal(t0.Add(40*time.Second)) {
		t.Errorf("TCP: %+v", tcp)
	}
	if Compare(icmp.Key, tcp.Key) >= 0 || Compare(tcp.Key, tcp.Key) != 0 {
		t.Error("Compare does not order by protocol")
	}
}
