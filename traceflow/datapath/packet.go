// Package datapath is a small OpenFlow-like switch model: ordered tables of
// prioritised match/action flows with registers, conjunctive matches,
// select groups and connection tracking, run over real packet bytes. It
// knows nothing of Kubernetes; package pipeline fills it with Antrea-shaped
// flows. Every flow prints in ovs-ofctl syntax so the model can be read
// (and later loaded) like a real bridge.
package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// MAC is an Ethernet address.
type MAC [6]byte

func (m MAC) String() string { return net.HardwareAddr(m[:]).String() }

// ParseMAC parses "aa:bb:cc:dd:ee:ff".
func ParseMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 {
		return MAC{}, fmt.Errorf("invalid MAC %q", s)
	}
	return MAC(hw), nil
}

// Packet is the header view of a frame that flows read and rewrite. It is
// parsed from bytes on entry and serialized back to bytes on exit, so what
// crosses a tunnel is a real frame.
type Packet struct {
	EthSrc, EthDst MAC
	Src, Dst       netip.Addr
	Proto          uint8 // IP protocol / IPv6 next header
	SrcPort        uint16
	DstPort        uint16
	TCPFlags       uint8
	ICMPType       uint8
	ICMPCode       uint8
	ICMPID         uint16
	ICMPSeq        uint16
	DSCP           uint8
	TTL            uint8 // hop limit for IPv6
	IPFlags        uint8
	Length         int // IP total length, header included
	// VLAN is the 802.1Q VLAN ID of a tagged frame, 0 if untagged.
	VLAN uint16
}

// IP protocol numbers used by the model.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
	ProtoSCTP   = 132
)

// IsV6 reports whether the packet is IPv6.
func (p *Packet) IsV6() bool { return p.Src.Is6() }

// Serialize builds the Ethernet frame for p.
func (p *Packet) Serialize() ([]byte, error) {
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.Src.Is4() != p.Dst.Is4() {
		return nil, errors.New("packet: source and destination must be valid addresses of one family")
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr(p.EthSrc[:]), DstMAC: net.HardwareAddr(p.EthDst[:])}
	var netLayer gopacket.NetworkLayer
	var ls []gopacket.SerializableLayer
	// With a VLAN tag the Ethernet header names 802.1Q, and the tag the
	// IP version.
	var tag *layers.Dot1Q
	if p.VLAN != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		tag = &layers.Dot1Q{VLANIdentifier: p.VLAN & 0xfff}
	}
	ipType := func(t layers.EthernetType) []gopacket.SerializableLayer {
		if tag != nil {
			tag.Type = t
			return []gopacket.SerializableLayer{eth, tag}
		}
		eth.EthernetType = t
		return []gopacket.SerializableLayer{eth}
	}
	if p.IsV6() {
		ip6 := &layers.IPv6{Version: 6, TrafficClass: p.DSCP << 2, HopLimit: p.TTL,
			NextHeader: layers.IPProtocol(p.Proto), SrcIP: p.Src.AsSlice(), DstIP: p.Dst.AsSlice()}
		netLayer = ip6
		ls = append(ipType(layers.EthernetTypeIPv6), ip6)
	} else {
		ip4 := &layers.IPv4{Version: 4, IHL: 5, TOS: p.DSCP << 2, TTL: p.TTL, Flags: layers.IPv4Flag(p.IPFlags),
			Protocol: layers.IPProtocol(p.Proto), SrcIP: p.Src.AsSlice(), DstIP: p.Dst.AsSlice()}
		netLayer = ip4
		ls = append(ipType(layers.EthernetTypeIPv4), ip4)
	}
	switch p.Proto {
	case ProtoTCP:
		tcp := &layers.TCP{SrcPort: layers.TCPPort(p.SrcPort), DstPort: layers.TCPPort(p.DstPort), Window: 64240,
			FIN: p.TCPFlags&0x01 != 0, SYN: p.TCPFlags&0x02 != 0, RST: p.TCPFlags&0x04 != 0, PSH: p.TCPFlags&0x08 != 0,
			ACK: p.TCPFlags&0x10 != 0, URG: p.TCPFlags&0x20 != 0, ECE: p.TCPFlags&0x40 != 0, CWR: p.TCPFlags&0x80 != 0}
		if err := tcp.SetNetworkLayerForChecksum(netLayer); err != nil {
			return nil, fmt.Errorf("packet: %w", err)
		}
		ls = append(ls, tcp)
	case ProtoUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(p.SrcPort), DstPort: layers.UDPPort(p.DstPort)}
		if err := udp.SetNetworkLayerForChecksum(netLayer); err != nil {
			return nil, fmt.Errorf("packet: %w", err)
		}
		ls = append(ls, udp)
	case ProtoSCTP:
		// A connection's first packet: the common header and an INIT chunk.
		init := &layers.SCTPInit{SCTPChunk: layers.SCTPChunk{Type: layers.SCTPChunkTypeInit, Length: 20},
			InitiateTag: 1, AdvertisedReceiverWindowCredit: 65535, OutboundStreams: 1, InboundStreams: 1, InitialTSN: 1}
		ls = append(ls, &layers.SCTP{SrcPort: layers.SCTPPort(p.SrcPort), DstPort: layers.SCTPPort(p.DstPort)}, init)
	case ProtoICMP:
		ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(p.ICMPType, p.ICMPCode), Id: p.ICMPID, Seq: p.ICMPSeq})
	case ProtoICMPv6:
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(p.ICMPType, p.ICMPCode)}
		if err := icmp.SetNetworkLayerForChecksum(netLayer); err != nil {
			return nil, fmt.Errorf("packet: %w", err)
		}
		echo := &layers.ICMPv6Echo{Identifier: p.ICMPID, SeqNumber: p.ICMPSeq}
		ls = append(ls, icmp, echo)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, fmt.Errorf("packet: %w", err)
	}
	return buf.Bytes(), nil
}

// ParsePacket decodes an Ethernet frame carrying IPv4 or IPv6.
func ParsePacket(frame []byte) (Packet, error) {
	var p Packet
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		return p, fmt.Errorf("packet: %w", el.Error())
	}
	eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if eth == nil || len(eth.SrcMAC) != 6 || len(eth.DstMAC) != 6 {
		return p, errors.New("packet: not an Ethernet frame")
	}
	p.EthSrc, p.EthDst = MAC(eth.SrcMAC), MAC(eth.DstMAC)
	if tag, ok := pkt.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q); ok {
		p.VLAN = tag.VLANIdentifier
	}
	switch ip := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		p.Src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
		p.Dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
		p.Proto, p.DSCP, p.TTL, p.IPFlags, p.Length = uint8(ip.Protocol), ip.TOS>>2, ip.TTL, uint8(ip.Flags), int(ip.Length)
	case *layers.IPv6:
		p.Src, _ = netip.AddrFromSlice(ip.SrcIP)
		p.Dst, _ = netip.AddrFromSlice(ip.DstIP)
		p.Proto, p.DSCP, p.TTL, p.Length = uint8(ip.NextHeader), ip.TrafficClass>>2, ip.HopLimit, int(ip.Length)+40
	default:
		return p, errors.New("packet: no IPv4 or IPv6 header")
	}
	switch t := pkt.TransportLayer().(type) {
	case *layers.TCP:
		p.SrcPort, p.DstPort = uint16(t.SrcPort), uint16(t.DstPort)
		for i, f := range []bool{t.FIN, t.SYN, t.RST, t.PSH, t.ACK, t.URG, t.ECE, t.CWR} {
			if f {
				p.TCPFlags |= 1 << i
			}
		}
	case *layers.UDP:
		p.SrcPort, p.DstPort = uint16(t.SrcPort), uint16(t.DstPort)
	case *layers.SCTP:
		p.SrcPort, p.DstPort = uint16(t.SrcPort), uint16(t.DstPort)
	}
	if l, ok := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
		p.ICMPType, p.ICMPCode, p.ICMPID, p.ICMPSeq = l.TypeCode.Type(), l.TypeCode.Code(), l.Id, l.Seq
	}
	if l, ok := pkt.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok {
		p.ICMPType, p.ICMPCode = l.TypeCode.Type(), l.TypeCode.Code()
		if e, ok := pkt.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo); ok {
			p.ICMPID, p.ICMPSeq = e.Identifier, e.SeqNumber
		}
	}
	return p, nil
}

// TunnelType is the encapsulation between Nodes.
type TunnelType string

// Tunnel types.
const (
	Geneve TunnelType = "geneve"
	VXLAN  TunnelType = "vxlan"
)

// Encapsulate wraps an inner frame in outer Ethernet/IP/UDP and a Geneve or
// VXLAN header addressed from src to dst, as the tunnel port sends it.
func Encapsulate(tt TunnelType, inner []byte, src, dst netip.Addr) ([]byte, error) {
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("tunnel: endpoints %v and %v are not of one family", src, dst)
	}
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}
	var ipl gopacket.SerializableLayer
	var nl gopacket.NetworkLayer
	if src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		ipl, nl = ip, ip
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		ipl, nl = ip, ip
	}
	udp := &layers.UDP{SrcPort: 49152}
	var header []byte
	switch tt {
	case Geneve:
		udp.DstPort = 6081
		// Geneve base header: version 0, no options, protocol Ethernet
		// (0x6558), VNI 0. gopacket decodes Geneve but cannot write it.
		header = []byte{0, 0, 0x65, 0x58, 0, 0, 0, 0}
	case VXLAN:
		udp.DstPort = 4789
		header = []byte{0x08, 0, 0, 0, 0, 0, 0, 0} // I flag, VNI 0
	default:
		return nil, fmt.Errorf("tunnel: unknown tunnel type %q", tt)
	}
	if err := udp.SetNetworkLayerForChecksum(nl); err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	buf := gopacket.NewSerializeBuffer()
	payload := append(header, inner...)
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ipl, udp, gopacket.Payload(payload)); err != nil {
		return nil, fmt.Errorf("tunnel: %w", err)
	}
	return buf.Bytes(), nil
}

// Decapsulate checks an encapsulated frame and returns the outer
// destination (the receiver's tun_dst) and the inner frame.
func Decapsulate(tt TunnelType, outer []byte) (tunDst netip.Addr, inner []byte, err error) {
	pkt := gopacket.NewPacket(outer, layers.LayerTypeEthernet, gopacket.Default)
	var dst netip.Addr
	switch ip := pkt.NetworkLayer().(type) {
	case *layers.IPv4:
		dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
	case *layers.IPv6:
		dst, _ = netip.AddrFromSlice(ip.DstIP)
	default:
		return dst, nil, errors.New("tunnel: no outer IP header")
	}
	switch tt {
	case Geneve:
		g, ok := pkt.Layer(layers.LayerTypeGeneve).(*layers.Geneve)
		if !ok {
			return dst, nil, errors.New("tunnel: no Geneve header")
		}
		return dst, g.LayerPayload(), nil
	case VXLAN:
		v, ok := pkt.Layer(layers.LayerTypeVXLAN).(*layers.VXLAN)
		if !ok {
			return dst, nil, errors.New("tunnel: no VXLAN header")
		}
		return dst, v.LayerPayload(), nil
	}
	return dst, nil, fmt.Errorf("tunnel: unknown tunnel type %q", tt)
}
