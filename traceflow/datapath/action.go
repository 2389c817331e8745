package datapath

import (
	"fmt"
	"net/netip"
	"strings"
)

// Metadata is the per-packet pipeline state that flows match and set.
type Metadata struct {
	InPort  uint32
	Regs    [9]uint32
	XXReg3  netip.Addr
	PktMark uint32
	TunDst  netip.Addr
	CtState uint8
	CtMark  uint32
	CtNwSrc netip.Addr // original tuple of the connection of the last ct()
	CtNwDst netip.Addr
	ConjID  uint32
}

// Action is one flow action.
type Action interface {
	fmt.Stringer
	apply(x *execution) error
}

// GotoTable continues the pipeline at a later table.
type GotoTable struct{ Table string }

func (a GotoTable) String() string { return "goto_table:" + a.Table }
func (a GotoTable) apply(x *execution) error {
	return x.jump(a.Table)
}

// Resubmit looks the packet up in a table (any table, this one
// included) and runs that flow's actions, then goes on with the rest of
// the calling flow's actions, as OVS's resubmit does.
type Resubmit struct{ Table string }

func (a Resubmit) String() string { return "resubmit(," + a.Table + ")" }
func (a Resubmit) apply(x *execution) error {
	return x.resubmit(a.Table)
}

// LoadReg writes Value into bits [Lo, Hi] of a register.
type LoadReg struct {
	Reg    int
	Lo, Hi uint
	Value  uint32
}

func (a LoadReg) mask() uint32 {
	return uint32((uint64(1)<<(a.Hi-a.Lo+1) - 1) << a.Lo)
}

func (a LoadReg) String() string {
	if a.Lo == 0 && a.Hi == 31 {
		return fmt.Sprintf("load:0x%x->NXM_NX_REG%d[]", a.Value, a.Reg)
	}
	return fmt.Sprintf("set_field:0x%x/0x%x->reg%d", a.Value<<a.Lo&a.mask(), a.mask(), a.Reg)
}

func (a LoadReg) apply(x *execution) error {
	if a.Reg < 0 || a.Reg >= len(x.md.Regs) || a.Hi > 31 || a.Lo > a.Hi {
		return fmt.Errorf("bad register load %v", a)
	}
	m := a.mask()
	x.md.Regs[a.Reg] = x.md.Regs[a.Reg]&^m | (a.Value<<a.Lo)&m
	return nil
}

// SetEndpoint records the chosen Service endpoint: reg3 (IPv4) or xxreg3
// (IPv6) for the address, reg4[0..15] for the port, and reg4[16..18]
// EndpointSelected, or EndpointToLearn when Learn is set (a Service with
// ClientIP affinity, whose choice a learn action records first).
type SetEndpoint struct {
	IP    netip.Addr
	Port  uint16
	Learn bool
}

func (a SetEndpoint) state() uint32 {
	if a.Learn {
		return EndpointToLearn
	}
	return EndpointSelected
}

func (a SetEndpoint) String() string {
	port := fmt.Sprintf("set_field:0x%x/0x7ffff->reg4", a.state()<<16|uint32(a.Port))
	if a.IP.Is6() {
		return fmt.Sprintf("set_field:0x%x->xxreg3,%s", a.IP.AsSlice(), port)
	}
	b := a.IP.As4()
	return fmt.Sprintf("load:0x%x->NXM_NX_REG3[],%s", uint32(b[0])<<24|uint32(b[1])<<16|uint32(b[2])<<8|uint32(b[3]), port)
}

func (a SetEndpoint) apply(x *execution) error {
	if a.IP.Is6() {
		x.md.XXReg3 = a.IP
	} else {
		b := a.IP.As4()
		x.md.Regs[3] = uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	}
	x.md.Regs[4] = x.md.Regs[4]&^0x7ffff | a.state()<<16 | uint32(a.Port)
	return nil
}

// The reg4[16..18] states of Service endpoint selection.
const (
	EndpointToSelect = 1 // no endpoint yet: ServiceLB load-balances
	EndpointSelected = 2 // chosen (by a group bucket or a learned affinity flow)
	EndpointToLearn  = 3 // chosen by a bucket; the affinity is still to learn
)

// EndpointMatch returns the match fields selecting an endpoint chosen by
// SetEndpoint.
func EndpointMatch(m *Match, ip netip.Addr, port uint16) {
	if ip.Is6() {
		m.XXReg3 = ip
	} else {
		b := ip.As4()
		m.Regs = append(m.Regs, RegMatch{3, Exact(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))})
	}
	m.Regs = append(m.Regs, RegMatch{4, Masked{EndpointSelected<<16 | uint32(port), 0x7ffff}})
}

// SetPktMark writes the packet mark under a mask.
type SetPktMark struct{ Masked }

func (a SetPktMark) String() string { return "set_field:" + a.Masked.String() + "->pkt_mark" }
func (a SetPktMark) apply(x *execution) error {
	x.md.PktMark = x.md.PktMark&^a.Mask | a.Value&a.Mask
	return nil
}

// SetTunDst sets the tunnel destination.
type SetTunDst struct{ IP netip.Addr }

func (a SetTunDst) String() string {
	if a.IP.Is6() {
		return "set_field:" + a.IP.String() + "->tun_ipv6_dst"
	}
	return "set_field:" + a.IP.String() + "->tun_dst"
}
func (a SetTunDst) apply(x *execution) error { x.md.TunDst = a.IP; return nil }

// SetEthSrc rewrites the source MAC.
type SetEthSrc struct{ MAC MAC }

func (a SetEthSrc) String() string           { return "mod_dl_src:" + a.MAC.String() }
func (a SetEthSrc) apply(x *execution) error { x.pkt.EthSrc = a.MAC; return nil }

// SetEthDst rewrites the destination MAC.
type SetEthDst struct{ MAC MAC }

func (a SetEthDst) String() string           { return "mod_dl_dst:" + a.MAC.String() }
func (a SetEthDst) apply(x *execution) error { x.pkt.EthDst = a.MAC; return nil }

// DecTTL decrements the TTL (hop limit); at zero the packet is dropped.
type DecTTL struct{}

func (DecTTL) String() string { return "dec_ttl" }
func (DecTTL) apply(x *execution) error {
	if x.pkt.TTL <= 1 {
		x.drop()
		return nil
	}
	x.pkt.TTL--
	return nil
}

// NAT is a ct() address translation.
type NAT struct {
	Src  bool // SNAT when true, DNAT otherwise
	IP   netip.Addr
	Port uint16 // 0 keeps the port
}

func (n NAT) String() string {
	dir := "dst"
	if n.Src {
		dir = "src"
	}
	addr := n.IP.String()
	if n.IP.Is6() {
		addr = "[" + addr + "]"
	}
	if n.Port != 0 {
		return fmt.Sprintf("nat(%s=%s:%d)", dir, addr, n.Port)
	}
	return fmt.Sprintf("nat(%s=%s)", dir, addr)
}

// Ct sends the packet through connection tracking in Zone.
type Ct struct {
	Commit bool
	Zone   uint16
	Table  string // recirculate to this table; "" continues the action list
	NAT    bool   // apply the connection's existing translation
	Xlate  *NAT   // a new translation, on commit
	Mark   Masked // exec(set_field ct_mark), on commit
}

func (a Ct) String() string {
	var parts []string
	if a.Commit {
		parts = append(parts, "commit")
	}
	if a.Table != "" {
		parts = append(parts, "table="+a.Table)
	}
	parts = append(parts, fmt.Sprintf("zone=%d", a.Zone))
	if a.Xlate != nil {
		parts = append(parts, a.Xlate.String())
	} else if a.NAT {
		parts = append(parts, "nat")
	}
	if a.Mark.Mask != 0 {
		parts = append(parts, "exec(set_field:"+a.Mark.String()+"->ct_mark)")
	}
	return "ct(" + strings.Join(parts, ",") + ")"
}

func (a Ct) apply(x *execution) error {
	x.ct.run(x, a)
	if a.Table != "" {
		return x.fork(a.Table)
	}
	return nil
}

// GroupAction executes one bucket of a group.
type GroupAction struct{ ID uint32 }

func (a GroupAction) String() string { return fmt.Sprintf("group:%d", a.ID) }
func (a GroupAction) apply(x *execution) error {
	g := x.br.groups[a.ID]
	if g == nil {
		return fmt.Errorf("group %d does not exist", a.ID)
	}
	if len(g.Buckets) == 0 {
		x.drop()
		return nil
	}
	// A select group hashes the 5-tuple, so one connection always picks
	// the same bucket, as OVS's default selection does.
	return x.apply(g.Buckets[x.pkt.hash()%uint64(len(g.Buckets))])
}

// Conjunction makes the flow one clause of conjunctive match ID.
type Conjunction struct {
	ID   uint32
	K, N uint8
}

func (a Conjunction) String() string { return fmt.Sprintf("conjunction(%d,%d/%d)", a.ID, a.K, a.N) }
func (Conjunction) apply(*execution) error {
	return nil // resolved at lookup time
}

// OutputReg outputs to the port number held in a register.
type OutputReg struct{ Reg int }

func (a OutputReg) String() string { return fmt.Sprintf("output:NXM_NX_REG%d[]", a.Reg) }
func (a OutputReg) apply(x *execution) error {
	if x.md.Regs[a.Reg] == x.md.InPort {
		return nil // OpenFlow never outputs to the ingress port unless told IN_PORT
	}
	return x.output(x.md.Regs[a.Reg])
}

// OutputInPort sends the packet back out of its ingress port (hairpin).
type OutputInPort struct{}

func (OutputInPort) String() string           { return "IN_PORT" }
func (OutputInPort) apply(x *execution) error { return x.output(x.md.InPort) }

// Controller sends a copy to the agent with a category in userdata.
type Controller struct{ Category uint8 }

func (a Controller) String() string {
	return fmt.Sprintf("controller(reason=no_match,userdata=%02x)", a.Category)
}
func (a Controller) apply(x *execution) error {
	x.packetIn(a.Category)
	return nil
}

// Drop ends processing.
type Drop struct{}

func (Drop) String() string           { return "drop" }
func (Drop) apply(x *execution) error { x.drop(); return nil }

// OutputPort outputs to a fixed port.
type OutputPort struct{ Port uint32 }

func (a OutputPort) String() string { return fmt.Sprintf("output:%d", a.Port) }
func (a OutputPort) apply(x *execution) error {
	if a.Port == x.md.InPort {
		return nil // OVS drops output to the ingress port
	}
	return x.output(a.Port)
}

// PushVLAN tags the frame with an 802.1Q header carrying VLAN ID VID.
type PushVLAN struct{ VID uint16 }

func (a PushVLAN) String() string {
	return fmt.Sprintf("push_vlan:0x8100,set_field:%d->vlan_vid", 0x1000|uint32(a.VID&0xfff))
}
func (a PushVLAN) apply(x *execution) error { x.pkt.VLAN = a.VID & 0xfff; return nil }

// PopVLAN removes the frame's 802.1Q header.
type PopVLAN struct{}

func (PopVLAN) String() string           { return "pop_vlan" }
func (PopVLAN) apply(x *execution) error { x.pkt.VLAN = 0; return nil }
