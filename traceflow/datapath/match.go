package datapath

import (
	"fmt"
	"net/netip"
	"strings"
)

// EtherType values a match can require.
const (
	EthIPv4 uint16 = 0x0800
	EthIPv6 uint16 = 0x86dd
)

// Masked is a value under a mask; a zero mask matches anything.
type Masked struct{ Value, Mask uint32 }

// Exact is a fully masked 32-bit value.
func Exact(v uint32) Masked { return Masked{v, 0xffffffff} }

func (m Masked) matches(v uint32) bool { return v&m.Mask == m.Value&m.Mask }

func (m Masked) String() string {
	if m.Mask == 0xffffffff {
		return fmt.Sprintf("0x%x", m.Value)
	}
	return fmt.Sprintf("0x%x/0x%x", m.Value, m.Mask)
}

// Ct state bits.
const (
	CtNew uint8 = 1 << iota
	CtEst
	CtRel
	CtRpl
	CtInv
	CtTrk
)

var ctNames = []struct {
	bit  uint8
	name string
}{{CtNew, "new"}, {CtEst, "est"}, {CtRel, "rel"}, {CtRpl, "rpl"}, {CtInv, "inv"}, {CtTrk, "trk"}}

// CtStateMatch requires some ct_state bits set and others clear.
type CtStateMatch struct{ Set, Clear uint8 }

func (c CtStateMatch) String() string {
	var b strings.Builder
	for _, n := range ctNames {
		if c.Clear&n.bit != 0 {
			b.WriteString("-" + n.name)
		}
		if c.Set&n.bit != 0 {
			b.WriteString("+" + n.name)
		}
	}
	return b.String()
}

// RegMatch is a masked match on one 32-bit register.
type RegMatch struct {
	Reg int
	Masked
}

// Match is a flow's match. Zero fields match anything.
type Match struct {
	CtState CtStateMatch
	CtMark  Masked
	EthType uint16
	IPProto uint8
	Regs    []RegMatch
	XXReg3  netip.Addr // 128-bit endpoint address (IPv6 Services)
	InPort  uint32
	EthSrc  MAC
	EthDst  MAC
	TunDst  netip.Addr
	NwSrc   netip.Prefix
	NwDst   netip.Prefix
	TpSrc   Masked
	TpDst   Masked
	PktMark Masked
	DSCP    uint8
	HasDSCP bool
	ConjID  uint32

	// ICMPType and ICMPCode match ICMP or ICMPv6 (by IPProto); a zero
	// mask is any value.
	ICMPType Masked
	ICMPCode Masked
	// VLANTCI matches the 802.1Q TCI as OVS's vlan_tci: 0x1000|VID when
	// tagged, 0 when not; a zero mask is any.
	VLANTCI Masked
}

func (m *Match) matches(p *Packet, md *Metadata) bool {
	if m.ConjID != 0 && md.ConjID != m.ConjID {
		return false
	}
	if m.InPort != 0 && m.InPort != md.InPort {
		return false
	}
	if m.CtState.Set != 0 || m.CtState.Clear != 0 {
		if md.CtState&m.CtState.Set != m.CtState.Set || md.CtState&m.CtState.Clear != 0 {
			return false
		}
	}
	if !m.CtMark.matches(md.CtMark) || !m.PktMark.matches(md.PktMark) {
		return false
	}
	for _, r := range m.Regs {
		if !r.matches(md.Regs[r.Reg]) {
			return false
		}
	}
	if m.XXReg3.IsValid() && m.XXReg3 != md.XXReg3 {
		return false
	}
	if m.EthSrc != (MAC{}) && m.EthSrc != p.EthSrc {
		return false
	}
	if m.VLANTCI.Mask != 0 {
		tci := uint32(0)
		if p.VLAN != 0 {
			tci = 0x1000 | uint32(p.VLAN)
		}
		if !m.VLANTCI.matches(tci) {
			return false
		}
	}
	if m.EthDst != (MAC{}) && m.EthDst != p.EthDst {
		return false
	}
	if m.TunDst.IsValid() && m.TunDst != md.TunDst {
		return false
	}
	if m.EthType != 0 {
		if (m.EthType == EthIPv6) != p.IsV6() {
			return false
		}
		if m.IPProto != 0 && m.IPProto != p.Proto {
			return false
		}
		if m.NwSrc.IsValid() && !m.NwSrc.Contains(p.Src) {
			return false
		}
		if m.NwDst.IsValid() && !m.NwDst.Contains(p.Dst) {
			return false
		}
		if m.HasDSCP && m.DSCP != p.DSCP {
			return false
		}
		if !m.TpSrc.matches(uint32(p.SrcPort)) || !m.TpDst.matches(uint32(p.DstPort)) {
			return false
		}
		if m.ICMPType.Mask != 0 || m.ICMPCode.Mask != 0 {
			if p.Proto != ProtoICMP && p.Proto != ProtoICMPv6 {
				return false
			}
			if !m.ICMPType.matches(uint32(p.ICMPType)) || !m.ICMPCode.matches(uint32(p.ICMPCode)) {
				return false
			}
		}
	}
	return true
}

// String prints the match as ovs-ofctl does (without the priority).
func (m *Match) String() string {
	var parts []string
	add := func(f string, a ...any) { parts = append(parts, fmt.Sprintf(f, a...)) }
	if m.CtState.Set != 0 || m.CtState.Clear != 0 {
		add("ct_state=%s", m.CtState)
	}
	if m.CtMark.Mask != 0 {
		add("ct_mark=%s", m.CtMark)
	}
	v6 := m.EthType == EthIPv6
	if m.EthType != 0 {
		proto := map[uint8]string{ProtoTCP: "tcp", ProtoUDP: "udp", ProtoICMP: "icmp", ProtoICMPv6: "icmp6", ProtoSCTP: "sctp"}[m.IPProto]
		switch {
		case proto == "" && v6:
			add("ipv6")
		case proto == "":
			add("ip")
		case v6 && proto != "icmp6":
			add("%s6", proto)
		default:
			add("%s", proto)
		}
		if proto == "" && m.IPProto != 0 {
			add("nw_proto=%d", m.IPProto)
		}
	}
	if m.ConjID != 0 {
		add("conj_id=%d", m.ConjID)
	}
	for _, r := range m.Regs {
		add("reg%d=%s", r.Reg, r.Masked)
	}
	if m.XXReg3.IsValid() {
		add("xxreg3=0x%x", m.XXReg3.AsSlice())
	}
	if m.PktMark.Mask != 0 {
		add("pkt_mark=%s", m.PktMark)
	}
	if m.InPort != 0 {
		add("in_port=%d", m.InPort)
	}
	if m.EthSrc != (MAC{}) {
		add("dl_src=%s", m.EthSrc)
	}
	if m.EthDst != (MAC{}) {
		add("dl_dst=%s", m.EthDst)
	}
	if m.VLANTCI.Mask != 0 {
		add("vlan_tci=0x%04x/0x%04x", m.VLANTCI.Value, m.VLANTCI.Mask)
	}
	if m.TunDst.IsValid() {
		if m.TunDst.Is6() {
			add("tun_ipv6_dst=%s", m.TunDst)
		} else {
			add("tun_dst=%s", m.TunDst)
		}
	}
	src, dst := "nw_src", "nw_dst"
	if v6 {
		src, dst = "ipv6_src", "ipv6_dst"
	}
	if m.NwSrc.IsValid() {
		add("%s=%s", src, prefixString(m.NwSrc))
	}
	if m.NwDst.IsValid() {
		add("%s=%s", dst, prefixString(m.NwDst))
	}
	if m.HasDSCP {
		add("ip_dscp=%d", m.DSCP)
	}
	if m.TpSrc.Mask != 0 {
		add("tp_src=%s", portString(m.TpSrc))
	}
	if m.TpDst.Mask != 0 {
		add("tp_dst=%s", portString(m.TpDst))
	}
	// OVS prints these names for ICMPv6 too.
	if m.ICMPType.Mask != 0 {
		add("icmp_type=%d", m.ICMPType.Value)
	}
	if m.ICMPCode.Mask != 0 {
		add("icmp_code=%d", m.ICMPCode.Value)
	}
	return strings.Join(parts, ",")
}

func prefixString(p netip.Prefix) string {
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().String()
	}
	return p.String()
}

func portString(m Masked) string {
	if m.Mask == 0xffff || m.Mask == 0xffffffff {
		return fmt.Sprint(m.Value)
	}
	return fmt.Sprintf("0x%x/0x%x", m.Value, m.Mask)
}

// PortRange returns masked port matches that together cover [lo, hi].
func PortRange(lo, hi uint16) []Masked {
	var out []Masked
	for l := uint32(lo); l <= uint32(hi); {
		size := uint32(1)
		// Grow the block while it stays aligned and inside the range.
		for size < 0x10000 && l%(size*2) == 0 && l+size*2-1 <= uint32(hi) {
			size *= 2
		}
		out = append(out, Masked{Value: l, Mask: 0xffff &^ (size - 1)})
		l += size
	}
	return out
}
