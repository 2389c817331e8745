package datapath

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

func TestPacketRoundTrip(t *testing.T) {
	for _, p := range []Packet{
		{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: 0x12, DSCP: 7, TTL: 64, EthSrc: MAC{2, 0, 0, 0, 0, 1}, EthDst: MAC{2, 0, 0, 0, 0, 2}},
		{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: ProtoICMPv6, ICMPType: 128, ICMPID: 3, ICMPSeq: 9, DSCP: 11, TTL: 5},
		{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("8.8.8.8"), Proto: ProtoUDP, SrcPort: 5353, DstPort: 53, DSCP: 59, TTL: 1},
		{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("8.8.8.8"), Proto: ProtoICMP, ICMPType: 8, ICMPID: 1, ICMPSeq: 2, TTL: 64},
	} {
		b, err := p.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParsePacket(b)
		if err != nil {
			t.Fatal(err)
		}
		got.Length = 0
		if got != p {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, p)
		}
	}
}

func TestTunnels(t *testing.T) {
	inner, err := (&Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.1.2"), Proto: ProtoTCP, SrcPort: 1, DstPort: 2, TTL: 9}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []TunnelType{Geneve, VXLAN} {
		outer, err := Encapsulate(tt, inner, netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("192.168.0.2"))
		if err != nil {
			t.Fatal(err)
		}
		dst, got, err := Decapsulate(tt, outer)
		if err != nil {
			t.Fatalf("%s: %v", tt, err)
		}
		if dst != netip.MustParseAddr("192.168.0.2") || string(got) != string(inner) {
			t.Errorf("%s: dst %v, inner equal %v", tt, dst, string(got) == string(inner))
		}
		other := VXLAN
		if tt == VXLAN {
			other = Geneve
		}
		if _, _, err := Decapsulate(other, outer); err == nil {
			t.Errorf("%s frame decapsulated as %s", tt, other)
		}
	}
	if _, err := Encapsulate(Geneve, inner, netip.MustParseAddr("192.168.0.1"), netip.MustParseAddr("fd00::1")); err == nil {
		t.Error("mixed-family tunnel endpoints accepted")
	}
}

func frame(t *testing.T, p Packet) []byte {
	t.Helper()
	b, err := p.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConjunction checks that a conjunctive match completes only when
// every clause matches, and that the conj_id flow then runs.
func TestConjunction(t *testing.T) {
	b := NewBridge("n", []string{"A", "B"})
	add := func(f *Flow) {
		if err := b.Add(f); err != nil {
			t.Fatal(err)
		}
	}
	add(&Flow{Table: "A", Priority: 100, Match: Match{InPort: 3}, Actions: []Action{Conjunction{ID: 9, K: 1, N: 2}}})
	add(&Flow{Table: "A", Priority: 100, Match: Match{EthType: EthIPv4, NwDst: netip.MustParsePrefix("10.0.0.0/24")}, Actions: []Action{Conjunction{ID: 9, K: 2, N: 2}}})
	add(&Flow{Table: "A", Priority: 100, Match: Match{ConjID: 9}, Actions: []Action{LoadReg{Reg: 5, Hi: 31, Value: 9}, GotoTable{"B"}}})
	add(&Flow{Table: "A", Priority: 0, Actions: []Action{GotoTable{"B"}}})
	add(&Flow{Table: "B", Priority: 0, Actions: []Action{Controller{Category: 1}}})
	for _, c := range []struct {
		port uint32
		dst  string
		want uint32
	}{{3, "10.0.0.9", 9}, {4, "10.0.0.9", 0}, {3, "10.0.1.9", 0}} {
		p := Packet{Src: netip.MustParseAddr("10.0.5.5"), Dst: netip.MustParseAddr(c.dst), Proto: ProtoUDP, SrcPort: 1, DstPort: 2, TTL: 3}
		res, err := b.Run(context.Background(), frame(t, p), Entry{InPort: c.port}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.PacketIns) != 1 || res.PacketIns[0].Meta.Regs[5] != c.want {
			t.Errorf("port %d dst %s: packet-ins %+v, want reg5=%d", c.port, c.dst, res.PacketIns, c.want)
		}
	}
	// An identical clause of another conjunction merges into one flow.
	add(&Flow{Table: "A", Priority: 100, Match: Match{InPort: 3}, Actions: []Action{Conjunction{ID: 10, K: 1, N: 2}}})
	if got := b.Flows()[0].String(); got != "table=A, priority=100,in_port=3 actions=conjunction(9,1/2),conjunction(10,1/2)" {
		t.Errorf("merged clause prints as %q", got)
	}
	if err := b.Add(&Flow{Table: "A", Priority: 0, Actions: []Action{Drop{}}}); err == nil {
		t.Error("duplicate non-conjunctive flow accepted")
	}
}

func TestBackwardJumpIsAnError(t *testing.T) {
	b := NewBridge("n", []string{"A", "B"})
	_ = b.Add(&Flow{Table: "A", Priority: 0, Actions: []Action{GotoTable{"B"}}})
	_ = b.Add(&Flow{Table: "B", Priority: 0, Actions: []Action{GotoTable{"A"}}})
	p := Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: ProtoICMP, TTL: 3}
	if _, err := b.Run(context.Background(), frame(t, p), Entry{InPort: 1}, nil); !errors.Is(err, ErrBackwardJump) {
		t.Fatalf("err %v, want ErrBackwardJump", err)
	}
}

func TestMissDropsAndTTL(t *testing.T) {
	b := NewBridge("n", []string{"A", "B"})
	_ = b.Add(&Flow{Table: "A", Priority: 0, Actions: []Action{DecTTL{}, GotoTable{"B"}}})
	p := Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: ProtoICMP, TTL: 5}
	res, err := b.Run(context.Background(), frame(t, p), Entry{}, nil)
	if err != nil || !res.Dropped || res.DropTable != "B" {
		t.Fatalf("table miss: %+v %v", res, err)
	}
	p.TTL = 1
	res, err = b.Run(context.Background(), frame(t, p), Entry{}, nil)
	if err != nil || !res.Dropped || res.DropTable != "A" {
		t.Fatalf("ttl expiry: %+v %v", res, err)
	}
}

// TestConntrackDNAT checks that a committed DNAT rewrites the packet and
// that ct_nw_dst keeps the original destination.
func TestConntrackDNAT(t *testing.T) {
	b := NewBridge("n", []string{"A", "B"})
	vip, ep := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.0.0.9")
	_ = b.Add(&Flow{Table: "A", Priority: 0, Actions: []Action{Ct{Commit: true, Zone: 1, Table: "B", Xlate: &NAT{IP: ep, Port: 8080}}}})
	_ = b.Add(&Flow{Table: "B", Priority: 0, Actions: []Action{Controller{Category: 1}}})
	p := Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: vip, Proto: ProtoTCP, SrcPort: 5, DstPort: 80, TTL: 5}
	res, err := b.Run(context.Background(), frame(t, p), Entry{}, nil)
	if err != nil || len(res.PacketIns) != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	pin := res.PacketIns[0]
	if pin.Packet.Dst != ep || pin.Packet.DstPort != 8080 || pin.Meta.CtNwDst != vip || pin.Meta.CtState != CtTrk|CtNew {
		t.Errorf("after DNAT: packet %v:%d ct_nw_dst %v state %b", pin.Packet.Dst, pin.Packet.DstPort, pin.Meta.CtNwDst, pin.Meta.CtState)
	}
}

func TestPortRange(t *testing.T) {
	for _, r := range [][2]uint16{{80, 80}, {1, 65535}, {1000, 2000}, {0, 7}, {65534, 65535}, {1023, 1025}} {
		blocks := PortRange(r[0], r[1])
		for v := uint32(0); v <= 65535; v++ {
			n := 0
			for _, b := range blocks {
				if b.matches(v) {
					n++
				}
			}
			in := v >= uint32(r[0]) && v <= uint32(r[1])
			if (in && n != 1) || (!in && n != 0) {
				t.Fatalf("range %v: port %d matched by %d blocks %v", r, v, n, blocks)
			}
		}
	}
}

// TestSCTPRoundTrip serializes an SCTP INIT and parses it back, ports
// and all, and prints an SCTP match as ovs-ofctl spells it.
func TestSCTPRoundTrip(t *testing.T) {
	p := Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: ProtoSCTP,
		SrcPort: 40000, DstPort: 3868, TTL: 64}
	b, err := p.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParsePacket(b)
	if err != nil {
		t.Fatal(err)
	}
	if q.Proto != ProtoSCTP || q.SrcPort != 40000 || q.DstPort != 3868 {
		t.Errorf("parsed %+v", q)
	}
	m := Match{EthType: EthIPv6, IPProto: ProtoSCTP, TpDst: Masked{Value: 3868, Mask: 0xffff}}
	if got := m.String(); got != "sctp6,tp_dst=3868" {
		t.Errorf("match %q", got)
	}
}
