// Package collectoraddr reads the exporter's --collector address,
// <HOST>:[<PORT>][:<PROTO>], with the reference agent's defaults.
package collectoraddr

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// DefaultPort and DefaultProto complete a --collector address, as the
// reference agent's flowCollectorAddr does. An address without a port but
// with the grpc protocol gets DefaultGRPCPort instead: 4739 is the IPFIX
// collector's port, where a gRPC client could never succeed.
const (
	DefaultPort     = 4739
	DefaultGRPCPort = 14739
	DefaultProto    = "tls"
)

// Collector is a parsed --collector address.
type Collector struct {
	// Host is an IP address, a DNS name, or "namespace/service" for a
	// Kubernetes Service (resolved to its ClusterIP through the metadata
	// source at each connection).
	Host  string
	Port  uint16
	Proto string // tcp, udp, tls (IPFIX) or grpc
}

// ServiceRef returns the namespace and name when Host names a Service.
func (c Collector) ServiceRef() (namespace, name string, ok bool) {
	return strings.Cut(c.Host, "/")
}

// String formats c as host:port:proto.
func (c Collector) String() string {
	return net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))) + ":" + c.Proto
}

// Parse reads <HOST>:[<PORT>][:<PROTO>]: HOST an IP address (IPv6
// in brackets), a DNS name or namespace/service; PROTO (tcp, udp, tls or
// grpc) defaults to tls, and PORT to 4739, or 14739 with grpc.
func Parse(s string) (Collector, error) {
	c := Collector{Port: DefaultPort, Proto: DefaultProto}
	bad := func(why string) (Collector, error) {
		return Collector{}, fmt.Errorf("collector address %q: %s (want <host>:[<port>][:<proto>])", s, why)
	}
	var rest string
	portGiven := false
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return bad("missing ] after an IPv6 address")
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return bad("not an IPv6 address in brackets")
		}
		c.Host, rest = a.String(), s[end+1:]
	} else {
		h, r, _ := strings.Cut(s, ":")
		c.Host, rest = h, r
		if r != "" || strings.HasSuffix(s, ":") {
			rest = ":" + r
		}
	}
	if c.Host == "" {
		return bad("no host")
	}
	if strings.ContainsAny(c.Host, " \t[]@") {
		return bad("the host has characters no host name has")
	}
	if ns, name, ok := c.ServiceRef(); ok && (ns == "" || name == "" || strings.Contains(name, "/")) {
		return bad("a Service is named namespace/name")
	}
	if rest != "" {
		if rest[0] != ':' {
			return bad("unexpected text after the host")
		}
		parts := strings.Split(rest[1:], ":")
		if len(parts) > 2 {
			if _, err := netip.ParseAddr(s); err == nil {
				return bad("an IPv6 address needs brackets")
			}
			return bad("too many parts")
		}
		if parts[0] != "" {
			p, err := strconv.ParseUint(parts[0], 10, 16)
			if err != nil || p == 0 {
				return bad("the port must be a number from 1 to 65535")
			}
			c.Port = uint16(p)
			portGiven = true
		}
		if len(parts) == 2 {
			switch proto := strings.ToLower(parts[1]); proto {
			case "tcp", "udp", "tls", "grpc":
				c.Proto = proto
			default:
				return bad(fmt.Sprintf("protocol %q is not grpc, tls, tcp or udp", parts[1]))
			}
		}
	}
	if c.Proto == "grpc" && !portGiven {
		c.Port = DefaultGRPCPort
	}
	return c, nil
}
