package flowspec

import (
	"reflect"
	"strings"
	"testing"

	"sluice/traceflow/crd"
)

func i32(v int32) *int32 { return &v }

func TestParse(t *testing.T) {
	cases := []struct {
		in   string
		want crd.Packet
	}{
		{"", crd.Packet{}},
		{"tcp,tcp_dst=80", crd.Packet{TransportHeader: crd.TransportHeader{TCP: &crd.TCPHeader{DstPort: 80}}}},
		{"tcp_src=1000, tcp_dst=0x50,tcp_flags=18", crd.Packet{TransportHeader: crd.TransportHeader{TCP: &crd.TCPHeader{SrcPort: 1000, DstPort: 80, Flags: i32(18)}}}},
		{"udp,udp_dst=53,ipv6", crd.Packet{IPv6Header: &crd.IPv6Header{}, TransportHeader: crd.TransportHeader{UDP: &crd.UDPHeader{DstPort: 53}}}},
		{"icmp", crd.Packet{TransportHeader: crd.TransportHeader{ICMP: &crd.ICMPEchoRequestHeader{}}}},
		{"icmpv6,icmp_id=7", crd.Packet{IPv6Header: &crd.IPv6Header{}, TransportHeader: crd.TransportHeader{ICMP: &crd.ICMPEchoRequestHeader{ID: 7}}}},
		{"ipv6", crd.Packet{IPv6Header: &crd.IPv6Header{}}},
	}
	for _, c := range cases {
		got, err := Parse(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: got %+v want %+v", c.in, got, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for in, want := range map[string]string{
		"tcp,udp":                    `protocol "udp" conflicts with "tcp"`,
		"tcp_dst=70000":              "tcp_dst=\"70000\" is not a number from 0 to 65535",
		"tcp_flags=256":              "not a number from 0 to 255",
		"udp,tcp_dst=1":              `protocol "tcp" conflicts with "udp"`,
		"sctp":                       `unknown token "sctp"`,
		"tcp_dst=1,tcp_dst=2":        `field "tcp_dst" given twice`,
		"tcp_dts=1":                  `unknown field "tcp_dts"`,
		"tcp_dst=-1":                 "not a number",
		strings.Repeat("tcp,", 2000): "longer than",
	} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.30q: error %v, want %q", in, err, want)
		}
	}
}

// FuzzParse checks that any input either parses into a consistent packet
// or returns an error, and never panics.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"", "tcp,tcp_dst=80", "ipv6,udp,udp_src=1,udp_dst=65535", "icmp,icmp_id=1,icmp_seq=2", "tcp_flags=0x12", "a=b=c", ",,,", "tcp_dst=9999999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			return
		}
		n := 0
		th := p.TransportHeader
		for _, set := range []bool{th.TCP != nil, th.UDP != nil, th.ICMP != nil} {
			if set {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("%q: more than one transport header: %+v", s, th)
		}
		if th.TCP != nil && (th.TCP.DstPort < 0 || th.TCP.DstPort > 65535 || th.TCP.SrcPort < 0 || th.TCP.SrcPort > 65535) {
			t.Fatalf("%q: port out of range: %+v", s, th.TCP)
		}
	})
}
