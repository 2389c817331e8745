package synthetic

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"sluice/exporter/source"
)

func TestRoutesAreTheOnlyConnections(t *testing.T) {
	client := netip.MustParseAddr("10.10.1.5")
	pod := netip.MustParseAddrPort("10.10.2.7:5432")
	vip := netip.MustParseAddrPort("10.96.0.20:8080")
	eps := []netip.AddrPort{netip.MustParseAddrPort("10.10.2.8:8080"), netip.MustParseAddrPort("10.10.3.9:8080")}
	routes := []Route{
		{Client: client, Proto: source.ProtoTCP, Dst: pod},
		{Client: client, Proto: source.ProtoTCP, Dst: vip, Endpoints: eps},
	}
	now := time.Unix(1_700_000_000, 0)
	s, err := New(Options{Rate: 500, Routes: routes, Seed: 7, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	var conns []source.Conn
	for range 5 {
		now = now.Add(200 * time.Millisecond)
		if conns, err = s.Dump(context.Background(), conns[:0]); err != nil {
			t.Fatal(err)
		}
	}
	if len(conns) < 100 {
		t.Fatalf("%d connections after 1 s at 500/s", len(conns))
	}
	seen := map[netip.AddrPort]int{}
	for _, c := range conns {
		if c.OrigSrc.Addr() != client || c.ReplyDst != c.OrigSrc {
			t.Fatalf("client side %v / %v is not the route's client", c.OrigSrc, c.ReplyDst)
		}
		switch c.OrigDst {
		case pod:
			if c.ReplySrc != pod {
				t.Fatalf("a direct connection was answered by %v", c.ReplySrc)
			}
		case vip:
			if c.ReplySrc != eps[0] && c.ReplySrc != eps[1] {
				t.Fatalf("a Service connection was answered by %v, not an endpoint", c.ReplySrc)
			}
		default:
			t.Fatalf("destination %v is on no route", c.OrigDst)
		}
		seen[c.ReplySrc]++
	}
	for _, want := range []netip.AddrPort{pod, eps[0], eps[1]} {
		if seen[want] == 0 {
			t.Errorf("no connection answered by %v in %d", want, len(conns))
		}
	}
}

func TestRouteValidation(t *testing.T) {
	if _, err := New(Options{Rate: 1}); err == nil {
		t.Error("no Pod CIDR and no route: want an error")
	}
	bad := Route{Client: netip.MustParseAddr("10.0.0.1"), Proto: 1, Dst: netip.MustParseAddrPort("10.0.0.2:80")}
	if _, err := New(Options{Rate: 1, Routes: []Route{bad}}); err == nil {
		t.Error("ICMP route: want an error")
	}
	bad.Proto, bad.Dst = source.ProtoTCP, netip.AddrPort{}
	if _, err := New(Options{Rate: 1, Routes: []Route{bad}}); err == nil {
		t.Error("route without destination: want an error")
	}
}
