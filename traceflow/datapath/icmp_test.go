package datapath

import (
	"net/netip"
	"testing"
)

// TestICMPMatch checks ICMP type and code matches: masked values against
// the packet's, only for ICMP and ICMPv6 packets, printed as OVS prints
// them (icmp_type and icmp_code for both families).
func TestICMPMatch(t *testing.T) {
	v4 := func(proto, typ, code uint8) *Packet {
		return &Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: proto, ICMPType: typ, ICMPCode: code}
	}
	v6 := func(proto, typ, code uint8) *Packet {
		return &Packet{Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), Proto: proto, ICMPType: typ, ICMPCode: code}
	}
	exact := func(v uint32) Masked { return Masked{Value: v, Mask: 0xff} }
	cases := []struct {
		name  string
		m     Match
		p     *Packet
		want  bool
		print string
	}{
		{"type and code", Match{EthType: EthIPv4, IPProto: ProtoICMP, ICMPType: exact(8), ICMPCode: exact(0)}, v4(ProtoICMP, 8, 0), true, "icmp,icmp_type=8,icmp_code=0"},
		{"other type", Match{EthType: EthIPv4, IPProto: ProtoICMP, ICMPType: exact(8)}, v4(ProtoICMP, 0, 0), false, "icmp,icmp_type=8"},
		{"other code", Match{EthType: EthIPv4, IPProto: ProtoICMP, ICMPType: exact(3), ICMPCode: exact(1)}, v4(ProtoICMP, 3, 3), false, "icmp,icmp_type=3,icmp_code=1"},
		{"code only", Match{EthType: EthIPv4, IPProto: ProtoICMP, ICMPCode: exact(0)}, v4(ProtoICMP, 8, 0), true, "icmp,icmp_code=0"},
		{"any ICMP", Match{EthType: EthIPv4, IPProto: ProtoICMP}, v4(ProtoICMP, 13, 0), true, "icmp"},
		{"not ICMP", Match{EthType: EthIPv4, ICMPType: exact(0)}, v4(ProtoTCP, 0, 0), false, "ip,icmp_type=0"},
		{"ICMPv6 type", Match{EthType: EthIPv6, IPProto: ProtoICMPv6, ICMPType: exact(128)}, v6(ProtoICMPv6, 128, 0), true, "icmp6,icmp_type=128"},
		{"ICMPv6 other type", Match{EthType: EthIPv6, IPProto: ProtoICMPv6, ICMPType: exact(8)}, v6(ProtoICMPv6, 128, 0), false, "icmp6,icmp_type=8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.m.matches(c.p, &Metadata{}); got != c.want {
				t.Errorf("matches = %v, want %v", got, c.want)
			}
			if got := c.m.String(); got != c.print {
				t.Errorf("prints %q, want %q", got, c.print)
			}
		})
	}
}
