package datapath

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"testing"
)

func tables(res *Result) []string {
	var out []string
	for _, s := range res.Trail {
		out = append(out, s.Table)
	}
	return out
}

// TestResubmitReturns checks OVS's resubmit: the resubmitted table's
// flow runs (goto_table chain included), then the caller's next action; a
// miss there returns without dropping; a table may resubmit to itself.
func TestResubmitReturns(t *testing.T) {
	b := NewBridge("n", []string{"A", "B", "C", "D", "E"})
	add := func(f *Flow) {
		t.Helper()
		if err := b.Add(f); err != nil {
			t.Fatal(err)
		}
	}
	add(&Flow{Table: "A", Priority: 0, Actions: []Action{Resubmit{"B"}, Resubmit{"D"}, Resubmit{"C"}}})
	add(&Flow{Table: "B", Priority: 0, Actions: []Action{LoadReg{Reg: 1, Hi: 31, Value: 7}, GotoTable{"C"}}})
	add(&Flow{Table: "C", Priority: 10, Match: Match{Regs: []RegMatch{{2, Exact(0)}}}, Actions: []Action{LoadReg{Reg: 2, Hi: 31, Value: 1}, Resubmit{"C"}}})
	add(&Flow{Table: "C", Priority: 5, Match: Match{Regs: []RegMatch{{2, Exact(1)}}}, Actions: []Action{LoadReg{Reg: 2, Hi: 31, Value: 2}}})
	add(&Flow{Table: "C", Priority: 0, Actions: []Action{GotoTable{"E"}}})
	add(&Flow{Table: "E", Priority: 0, Actions: []Action{Controller{Category: 1}}})
	// D has no flow: its miss returns to A.
	p := Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: ProtoICMP, TTL: 5}
	res, err := b.Run(context.Background(), frame(t, p), Entry{InPort: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A; B, C (reg2 0 -> 1), C again (1 -> 2); D misses; C (reg2 2: the
	// default) goes on to E.
	if want := []string{"A", "B", "C", "C", "D", "C", "E"}; !reflect.DeepEqual(tables(res), want) {
		t.Errorf("tables %v, want %v", tables(res), want)
	}
	if res.Dropped || len(res.PacketIns) != 1 || res.PacketIns[0].Table != "E" || res.PacketIns[0].Meta.Regs[1] != 7 || res.PacketIns[0].Meta.Regs[2] != 2 {
		t.Errorf("dropped %v packet-ins %+v", res.Dropped, res.PacketIns)
	}
	// A miss in a table reached by goto_table is OpenFlow's table-miss,
	// a drop, even inside a resubmit.
	g := NewBridge("n", []string{"A", "B", "C"})
	_ = g.Add(&Flow{Table: "A", Priority: 0, Actions: []Action{Resubmit{"B"}}})
	_ = g.Add(&Flow{Table: "B", Priority: 0, Actions: []Action{GotoTable{"C"}}})
	res, err = g.Run(context.Background(), frame(t, p), Entry{InPort: 1}, nil)
	if err != nil || !res.Dropped || res.DropTable != "C" {
		t.Errorf("goto miss inside a resubmit: %+v %v", res, err)
	}
}

// TestForkInsideResubmit checks that ct(table=) inside a resubmit
// resumes the pipeline there once the caller's actions are done, and
// that an action left after it, which OVS would run on the untracked
// packet, is refused rather than modelled wrong.
func TestForkInsideResubmit(t *testing.T) {
	build := func(after ...Action) *Bridge {
		b := NewBridge("n", []string{"A", "B", "C"})
		_ = b.Add(&Flow{Table: "A", Priority: 0, Actions: append([]Action{Resubmit{"B"}}, after...)})
		_ = b.Add(&Flow{Table: "B", Priority: 0, Actions: []Action{Ct{Zone: 1, Table: "C"}}})
		_ = b.Add(&Flow{Table: "C", Priority: 0, Actions: []Action{Controller{Category: 1}}})
		return b
	}
	p := Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: ProtoICMP, TTL: 5}
	res, err := build().Run(context.Background(), frame(t, p), Entry{InPort: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"A", "B", "C"}; !reflect.DeepEqual(tables(res), want) || len(res.PacketIns) != 1 || res.PacketIns[0].Meta.CtState&CtTrk == 0 {
		t.Errorf("tables %v packet-ins %+v", tables(res), res.PacketIns)
	}
	if _, err := build(Controller{Category: 2}).Run(context.Background(), frame(t, p), Entry{InPort: 1}, nil); !errors.Is(err, ErrAfterStop) {
		t.Errorf("an action after a fork: err %v, want ErrAfterStop", err)
	}
}

// TestLearn checks the affinity learn action: the learned flow matches
// the client, the Service address and port, and loads the endpoint the
// packet carried; the bridge itself is left unchanged.
func TestLearn(t *testing.T) {
	for _, c := range []struct {
		src, dst, ep string
		eth          uint16
		proto        uint8
		flow, learn  string
	}{
		{"10.0.0.1", "10.96.0.9", "10.0.1.5", EthIPv4, ProtoTCP,
			"table=S, hard_timeout=60, priority=200,tcp,nw_src=10.0.0.1,nw_dst=10.96.0.9,tp_dst=80 actions=load:0xa000105->NXM_NX_REG3[],set_field:0x1f90/0xffff->reg4,set_field:0x20000/0x70000->reg4",
			"learn(table=S,hard_timeout=60,priority=200,delete_learned,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],NXM_OF_IP_DST[],NXM_OF_IP_SRC[],load:NXM_NX_REG3[]->NXM_NX_REG3[],load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x2->NXM_NX_REG4[16..18])"},
		{"fd00::1", "fd00:96::9", "fd00:1::5", EthIPv6, ProtoUDP,
			"table=S, hard_timeout=60, priority=200,udp6,ipv6_src=fd00::1,ipv6_dst=fd00:96::9,tp_dst=80 actions=set_field:0xfd000001000000000000000000000005->xxreg3,set_field:0x1f90/0xffff->reg4,set_field:0x20000/0x70000->reg4",
			"learn(table=S,hard_timeout=60,priority=200,delete_learned,eth_type=0x86dd,nw_proto=17,NXM_OF_UDP_DST[],NXM_NX_IPV6_DST[],NXM_NX_IPV6_SRC[],load:NXM_NX_XXREG3[]->NXM_NX_XXREG3[],load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x2->NXM_NX_REG4[16..18])"},
	} {
		b := NewBridge("n", []string{"A", "S"})
		l := Learn{Table: "S", Priority: 200, HardTimeout: 60, EthType: c.eth, Proto: c.proto}
		if l.String() != c.learn {
			t.Errorf("learn prints\n %s\nwant\n %s", l, c.learn)
		}
		_ = b.Add(&Flow{Table: "A", Priority: 0, Actions: []Action{SetEndpoint{IP: netip.MustParseAddr(c.ep), Port: 8080, Learn: true}, l}})
		p := Packet{Src: netip.MustParseAddr(c.src), Dst: netip.MustParseAddr(c.dst), Proto: c.proto, SrcPort: 5, DstPort: 80, TTL: 5}
		res, err := b.Run(context.Background(), frame(t, p), Entry{InPort: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Learned) != 1 || res.Learned[0].String() != c.flow {
			t.Fatalf("learned %v, want %s", res.Learned, c.flow)
		}
		if n := len(b.Flows()); n != 1 {
			t.Errorf("the bridge holds %d flows after the run, want 1", n)
		}
		// Installed, the learned flow selects the endpoint for the
		// client's next packet, whatever its source port.
		if err := b.Add(res.Learned[0]); err != nil {
			t.Fatal(err)
		}
		_ = b.Add(&Flow{Table: "A", Priority: 10, Actions: []Action{Resubmit{"S"}, Controller{Category: 1}}})
		p.SrcPort = 999
		res, err = b.Run(context.Background(), frame(t, p), Entry{InPort: 1}, nil)
		if err != nil || len(res.PacketIns) != 1 {
			t.Fatalf("%+v %v", res, err)
		}
		md := res.PacketIns[0].Meta
		if md.Regs[4] != EndpointSelected<<16|8080 || (c.eth == EthIPv4 && md.Regs[3] != 0x0a000105) || (c.eth == EthIPv6 && md.XXReg3 != netip.MustParseAddr(c.ep)) {
			t.Errorf("after the learned flow: reg3 %#x xxreg3 %v reg4 %#x", md.Regs[3], md.XXReg3, md.Regs[4])
		}
	}
}
