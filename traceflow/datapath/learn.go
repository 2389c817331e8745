package datapath

import (
	"fmt"
	"net/netip"
)

// Learn is the learn action of a Service with ClientIP session affinity:
// it installs in Table a flow that sends the packet's client (source
// address), for the same Service address, protocol and port, to the
// endpoint just chosen (reg3 or xxreg3, reg4[0..15]), marking it
// EndpointSelected, for HardTimeout seconds.
type Learn struct {
	Table       string
	Priority    int
	HardTimeout int
	EthType     uint16
	Proto       uint8
}

var learnPortField = map[uint8]string{ProtoTCP: "NXM_OF_TCP_DST[]", ProtoUDP: "NXM_OF_UDP_DST[]", ProtoSCTP: "OXM_OF_SCTP_DST[]"}

func (a Learn) String() string {
	src, dst, ep := "NXM_OF_IP_SRC[]", "NXM_OF_IP_DST[]", "NXM_NX_REG3[]"
	if a.EthType == EthIPv6 {
		src, dst, ep = "NXM_NX_IPV6_SRC[]", "NXM_NX_IPV6_DST[]", "NXM_NX_XXREG3[]"
	}
	return fmt.Sprintf("learn(table=%s,hard_timeout=%d,priority=%d,delete_learned,eth_type=0x%x,nw_proto=%d,%s,%s,%s,"+
		"load:%s->%s,load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x%x->NXM_NX_REG4[16..18])",
		a.Table, a.HardTimeout, a.Priority, a.EthType, a.Proto, learnPortField[a.Proto], dst, src, ep, ep, EndpointSelected)
}

func (a Learn) apply(x *execution) error {
	if _, ok := learnPortField[a.Proto]; !ok || x.pkt.Proto != a.Proto || (a.EthType == EthIPv6) != x.pkt.IsV6() {
		return fmt.Errorf("%s: the packet is not %#x/%d", a, a.EthType, a.Proto)
	}
	f := &Flow{Table: a.Table, Priority: a.Priority, HardTimeout: a.HardTimeout, Match: Match{
		EthType: a.EthType, IPProto: a.Proto,
		NwSrc: netip.PrefixFrom(x.pkt.Src, x.pkt.Src.BitLen()), NwDst: netip.PrefixFrom(x.pkt.Dst, x.pkt.Dst.BitLen()),
		TpDst: Masked{Value: uint32(x.pkt.DstPort), Mask: 0xffff},
	}}
	if a.EthType == EthIPv6 {
		f.Actions = append(f.Actions, SetXXReg3{IP: x.md.XXReg3})
	} else {
		f.Actions = append(f.Actions, LoadReg{Reg: 3, Lo: 0, Hi: 31, Value: x.md.Regs[3]})
	}
	f.Actions = append(f.Actions, LoadReg{Reg: 4, Lo: 0, Hi: 15, Value: x.md.Regs[4] & 0xffff},
		LoadReg{Reg: 4, Lo: 16, Hi: 18, Value: EndpointSelected})
	x.res.Learned = append(x.res.Learned, f)
	return nil
}

// SetXXReg3 writes a 128-bit address into xxreg3 (a learned flow's IPv6
// endpoint).
type SetXXReg3 struct{ IP netip.Addr }

func (a SetXXReg3) String() string           { return fmt.Sprintf("set_field:0x%x->xxreg3", a.IP.AsSlice()) }
func (a SetXXReg3) apply(x *execution) error { x.md.XXReg3 = a.IP; return nil }
