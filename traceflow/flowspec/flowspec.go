// Package flowspec parses antctl's `-f/--flow` packet description, such as
// "tcp,tcp_dst=80,tcp_flags=2" or "ipv6,udp,udp_dst=53", into the packet
// part of a Traceflow spec.
package flowspec

import (
	"fmt"
	"strconv"
	"strings"

	"sluice/traceflow/crd"
)

// maxLen bounds the flow string; a longer one is certainly a mistake.
const maxLen = 4096

// Parse reads comma-separated tokens: a protocol (icmp, tcp, udp;
// icmpv6 means ipv6 and icmp), ipv6, and key=value fields tcp_src,
// tcp_dst, tcp_flags, udp_src, udp_dst, icmp_id, icmp_seq. Upstream antctl
// silently ignores tokens it does not know; we refuse them, naming the
// token, because a typo would otherwise trace a different packet.
func Parse(s string) (crd.Packet, error) {
	var pkt crd.Packet
	if len(s) > maxLen {
		return pkt, fmt.Errorf("flow: longer than %d characters", maxLen)
	}
	proto := ""
	v6 := false
	fields := map[string]int64{}
	setProto := func(p string) error {
		if proto != "" && proto != p {
			return fmt.Errorf("flow: protocol %q conflicts with %q", p, proto)
		}
		proto = p
		return nil
	}
	for _, raw := range strings.Split(s, ",") {
		tok := strings.TrimSpace(raw)
		if tok == "" {
			continue
		}
		key, val, hasVal := strings.Cut(tok, "=")
		key = strings.ToLower(strings.TrimSpace(key))
		if !hasVal {
			switch key {
			case "tcp", "udp", "icmp":
				if err := setProto(key); err != nil {
					return pkt, err
				}
			case "icmpv6", "icmp6":
				if err := setProto("icmp"); err != nil {
					return pkt, err
				}
				v6 = true
			case "ipv6":
				v6 = true
			case "ip", "ipv4":
			default:
				return pkt, fmt.Errorf("flow: unknown token %q (want icmp, tcp, udp, ipv6 or a field=value)", tok)
			}
			continue
		}
		max := int64(65535)
		switch key {
		case "tcp_src", "tcp_dst", "udp_src", "udp_dst":
		case "tcp_flags":
			max = 255
		case "icmp_id", "icmp_seq":
		default:
			return pkt, fmt.Errorf("flow: unknown field %q", key)
		}
		if _, dup := fields[key]; dup {
			return pkt, fmt.Errorf("flow: field %q given twice", key)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(val), 0, 64)
		if err != nil || n < 0 || n > max {
			return pkt, fmt.Errorf("flow: %s=%q is not a number from 0 to %d", key, val, max)
		}
		fields[key] = n
		p := strings.SplitN(key, "_", 2)[0]
		if err := setProto(p); err != nil {
			return pkt, err
		}
	}
	if v6 {
		pkt.IPv6Header = &crd.IPv6Header{}
	}
	switch proto {
	case "tcp":
		h := &crd.TCPHeader{SrcPort: int32(fields["tcp_src"]), DstPort: int32(fields["tcp_dst"])}
		if f, ok := fields["tcp_flags"]; ok {
			v := int32(f)
			h.Flags = &v
		}
		pkt.TransportHeader.TCP = h
	case "udp":
		pkt.TransportHeader.UDP = &crd.UDPHeader{SrcPort: int32(fields["udp_src"]), DstPort: int32(fields["udp_dst"])}
	case "icmp":
		pkt.TransportHeader.ICMP = &crd.ICMPEchoRequestHeader{ID: int32(fields["icmp_id"]), Sequence: int32(fields["icmp_seq"])}
	}
	return pkt, nil
}
