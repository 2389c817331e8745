package interop

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// antreaFlow holds the values of one Antrea v2.7 data record, one field per
// element of ipfixtest.AntreaV27IPv4 (or its IPv6 counterpart), in template
// order. Addresses are kept twice, as netip.Addr for Sluice and as net.IP
// for go-ipfix, so that neither side converts while it is being measured.
type antreaFlow struct {
	FlowStart, FlowEnd                               time.Time
	FlowEndReason                                    uint8
	SrcPort, DstPort                                 uint16
	Proto                                            uint8
	Packets, Octets, DeltaPackets, DeltaOctets       uint64
	Src, Dst                                         netip.Addr
	RevPackets, RevOctets, RevDeltaPkts, RevDeltaOct uint64
	SrcPod, SrcNamespace, SrcNode                    string
	DstPod, DstNamespace, DstNode                    string
	DstSvcPort                                       uint16
	DstSvcPortName                                   string
	InPolicy, InPolicyNamespace                      string
	InPolicyType                                     uint8
	InRule                                           string
	InRuleAction                                     uint8
	EgPolicy, EgPolicyNamespace                      string
	EgPolicyType                                     uint8
	EgRule                                           string
	EgRuleAction                                     uint8
	TCPState                                         string
	FlowType                                         uint8
	EgressName, EgressIP, EgressNode                 string
	ProxySnatPort                                    uint16
	ClusterIP, ProxySnatIP, ServiceIP                netip.Addr

	srcIP, dstIP, clusterIP, snatIP, serviceIP net.IP
}

// antreaNames is the element list of the Antrea v2.7 template: the IPv4 one
// of ipfixtest, or its IPv6 counterpart (the agent swaps exactly the five
// address elements).
func antreaNames(ipv6 bool) []string {
	names := ipfixtest.AntreaV27IPv4()
	if ipv6 {
		for i, n := range names {
			names[i] = strings.Replace(n, "IPv4", "IPv6", 1)
		}
	}
	return names
}

// sampleAntreaFlow returns a deterministic flow numbered i. Consecutive
// flows differ in nearly every field, and the set covers what real agents
// send: empty strings for unknown peers, zero addresses for unset ones,
// counters beyond 32 bits, enum values of every u8 element, a non-ASCII
// name, and (flow 7) a string longer than 254 octets, which needs the
// three-octet length prefix.
func sampleAntreaFlow(i int, ipv6 bool) antreaFlow {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	start := base.Add(time.Duration(i*7) * time.Second)
	dstPorts := []uint16{80, 443, 8080, 53, 5432}
	namespaces := []string{"default", "kube-system", "payments"}
	states := []string{"ESTABLISHED", "TIME_WAIT", "SYN_SENT", "CLOSE_WAIT"}
	addr := func(v4 [4]byte) netip.Addr {
		if !ipv6 {
			return netip.AddrFrom4(v4)
		}
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, v4[0], v4[1], v4[2], v4[3]})
	}
	zero := netip.IPv4Unspecified()
	if ipv6 {
		zero = netip.IPv6Unspecified()
	}

	f := antreaFlow{
		FlowStart:     start,
		FlowEnd:       start.Add(time.Duration(30+i%90) * time.Second),
		FlowEndReason: uint8(1 + i%4),
		SrcPort:       uint16(32768 + (i*131)%28000),
		DstPort:       dstPorts[i%len(dstPorts)],
		Proto:         6,
		Packets:       uint64(1000 + 37*i),
		Octets:        1<<33 + uint64(1500*i),
		DeltaPackets:  uint64(3 * i),
		DeltaOctets:   uint64(4500 * i),
		Src:           addr([4]byte{10, 244, byte(i % 4), byte(i%250 + 1)}),
		Dst:           addr([4]byte{10, 244, byte(4 + i%3), byte((7*i)%250 + 1)}),
		RevPackets:    uint64(800 + 29*i),
		RevOctets:     1<<35 + uint64(9000*i),
		RevDeltaPkts:  uint64(2 * i),
		RevDeltaOct:   uint64(3000 * i),
		SrcPod:        fmt.Sprintf("frontend-7d9c5-%d", i),
		SrcNamespace:  namespaces[i%len(namespaces)],
		SrcNode:       fmt.Sprintf("worker-%d", i%4),
		DstPod:        fmt.Sprintf("backend-%d", i),
		DstNamespace:  namespaces[(i+1)%len(namespaces)],
		DstNode:       fmt.Sprintf("worker-%d", (i+1)%4),
		TCPState:      states[i%len(states)],
		FlowType:      uint8(1 + i%4),
		ClusterIP:     addr([4]byte{10, 96, 0, byte(i%200 + 10)}),
		ProxySnatIP:   zero,
	}
	if f.DstPort == 53 {
		f.Proto, f.TCPState = 17, ""
	}
	if i%6 == 5 { // to an external address: no destination Pod, no Service
		f.DstPod, f.DstNamespace, f.DstNode = "", "", ""
		f.ClusterIP = zero
	} else {
		f.DstSvcPort = f.DstPort
		f.DstSvcPortName = f.DstNamespace + "/backend:" + fmt.Sprint(f.DstPort)
	}
	f.ServiceIP = f.ClusterIP
	if i%3 == 0 {
		f.InPolicy, f.InPolicyNamespace = fmt.Sprintf("allow-frontend-%d", i), f.DstNamespace
		f.InPolicyType, f.InRule, f.InRuleAction = uint8(1+i%3), fmt.Sprintf("ingress-rule-%d", i), 1
	}
	if i%4 == 1 {
		f.EgPolicy, f.EgPolicyType, f.EgRule, f.EgRuleAction = "deny-egress", 3, "drop-all", uint8(2+i%2)
	}
	if i%5 == 2 {
		f.EgressName, f.EgressIP, f.EgressNode = "egress-prod", fmt.Sprintf("172.18.0.%d", 10+i%50), "gateway-0"
	}
	if i%7 == 3 {
		f.ProxySnatPort = uint16(40000 + i)
		f.ProxySnatIP = addr([4]byte{172, 18, 0, 2})
	}
	if i == 7 {
		f.InRule = strings.Repeat("long-rule-name/", 20) // 300 octets
	}
	if i == 11 {
		f.SrcPod = "pod-ünïcödé-✓"
	}
	f.srcIP, f.dstIP = net.IP(f.Src.AsSlice()), net.IP(f.Dst.AsSlice())
	f.clusterIP, f.snatIP, f.serviceIP = net.IP(f.ClusterIP.AsSlice()), net.IP(f.ProxySnatIP.AsSlice()), net.IP(f.ServiceIP.AsSlice())
	return f
}

func sampleAntreaFlows(n int, ipv6 bool) []antreaFlow {
	fs := make([]antreaFlow, n)
	for i := range fs {
		fs[i] = sampleAntreaFlow(i, ipv6)
	}
	return fs
}

// values lists f's values in template order as the Go types the checks
// compare: uint64 for every unsigned element, string, netip.Addr and
// time.Time.
func (f *antreaFlow) values() []any {
	u := func(v uint64) any { return v }
	return []any{
		f.FlowStart, f.FlowEnd, u(uint64(f.FlowEndReason)),
		u(uint64(f.SrcPort)), u(uint64(f.DstPort)), u(uint64(f.Proto)),
		f.Packets, f.Octets, f.DeltaPackets, f.DeltaOctets,
		f.Src, f.Dst,
		f.RevPackets, f.RevOctets, f.RevDeltaPkts, f.RevDeltaOct,
		f.SrcPod, f.SrcNamespace, f.SrcNode,
		f.DstPod, f.DstNamespace, f.DstNode,
		u(uint64(f.DstSvcPort)), f.DstSvcPortName,
		f.InPolicy, f.InPolicyNamespace, u(uint64(f.InPolicyType)), f.InRule, u(uint64(f.InRuleAction)),
		f.EgPolicy, f.EgPolicyNamespace, u(uint64(f.EgPolicyType)), f.EgRule, u(uint64(f.EgRuleAction)),
		f.TCPState, u(uint64(f.FlowType)), f.EgressName, f.EgressIP, f.EgressNode,
		u(uint64(f.ProxySnatPort)), f.ClusterIP, f.ProxySnatIP, f.ServiceIP,
	}
}

// writeSluice writes f as one data record of t with Sluice's encoder.
func writeSluice(e *ipfix.Encoder, domain uint32, t *ipfix.Template, f *antreaFlow) error {
	return e.Begin(domain, t).
		Time(f.FlowStart).Time(f.FlowEnd).Uint(uint64(f.FlowEndReason)).
		Uint(uint64(f.SrcPort)).Uint(uint64(f.DstPort)).Uint(uint64(f.Proto)).
		Uint(f.Packets).Uint(f.Octets).Uint(f.DeltaPackets).Uint(f.DeltaOctets).
		Addr(f.Src).Addr(f.Dst).
		Uint(f.RevPackets).Uint(f.RevOctets).Uint(f.RevDeltaPkts).Uint(f.RevDeltaOct).
		String(f.SrcPod).String(f.SrcNamespace).String(f.SrcNode).
		String(f.DstPod).String(f.DstNamespace).String(f.DstNode).
		Uint(uint64(f.DstSvcPort)).String(f.DstSvcPortName).
		String(f.InPolicy).String(f.InPolicyNamespace).Uint(uint64(f.InPolicyType)).String(f.InRule).Uint(uint64(f.InRuleAction)).
		String(f.EgPolicy).String(f.EgPolicyNamespace).Uint(uint64(f.EgPolicyType)).String(f.EgRule).Uint(uint64(f.EgRuleAction)).
		String(f.TCPState).Uint(uint64(f.FlowType)).String(f.EgressName).String(f.EgressIP).String(f.EgressNode).
		Uint(uint64(f.ProxySnatPort)).Addr(f.ClusterIP).Addr(f.ProxySnatIP).Addr(f.ServiceIP).
		End()
}

// goIPFIXElements returns one empty go-ipfix element with value per
// template element, in template order.
func goIPFIXElements(ipv6 bool) ([]entities.InfoElementWithValue, error) {
	loadGoIPFIXRegistry()
	reg := ipfix.DefaultRegistry()
	names := antreaNames(ipv6)
	elems := make([]entities.InfoElementWithValue, len(names))
	for i, n := range names {
		ie, err := goIPFIXLookup(reg, n)
		if err != nil {
			return nil, err
		}
		if elems[i], err = entities.DecodeAndCreateInfoElementWithValue(ie, nil); err != nil {
			return nil, err
		}
	}
	return elems, nil
}

// setGoIPFIX stores f's values into elements made by goIPFIXElements, the
// way an Antrea agent refills one reused record per connection.
func setGoIPFIX(e []entities.InfoElementWithValue, f *antreaFlow) {
	_ = e[42]
	e[0].SetUnsigned32Value(uint32(f.FlowStart.Unix()))
	e[1].SetUnsigned32Value(uint32(f.FlowEnd.Unix()))
	e[2].SetUnsigned8Value(f.FlowEndReason)
	e[3].SetUnsigned16Value(f.SrcPort)
	e[4].SetUnsigned16Value(f.DstPort)
	e[5].SetUnsigned8Value(f.Proto)
	e[6].SetUnsigned64Value(f.Packets)
	e[7].SetUnsigned64Value(f.Octets)
	e[8].SetUnsigned64Value(f.DeltaPackets)
	e[9].SetUnsigned64Value(f.DeltaOctets)
	e[10].SetIPAddressValue(f.srcIP)
	e[11].SetIPAddressValue(f.dstIP)
	e[12].SetUnsigned64Value(f.RevPackets)
	e[13].SetUnsigned64Value(f.RevOctets)
	e[14].SetUnsigned64Value(f.RevDeltaPkts)
	e[15].SetUnsigned64Value(f.RevDeltaOct)
	e[16].SetStringValue(f.SrcPod)
	e[17].SetStringValue(f.SrcNamespace)
	e[18].SetStringValue(f.SrcNode)
	e[19].SetStringValue(f.DstPod)
	e[20].SetStringValue(f.DstNamespace)
	e[21].SetStringValue(f.DstNode)
	e[22].SetUnsigned16Value(f.DstSvcPort)
	e[23].SetStringValue(f.DstSvcPortName)
	e[24].SetStringValue(f.InPolicy)
	e[25].SetStringValue(f.InPolicyNamespace)
	e[26].SetUnsigned8Value(f.InPolicyType)
	e[27].SetStringValue(f.InRule)
	e[28].SetUnsigned8Value(f.InRuleAction)
	e[29].SetStringValue(f.EgPolicy)
	e[30].SetStringValue(f.EgPolicyNamespace)
	e[31].SetUnsigned8Value(f.EgPolicyType)
	e[32].SetStringValue(f.EgRule)
	e[33].SetUnsigned8Value(f.EgRuleAction)
	e[34].SetStringValue(f.TCPState)
	e[35].SetUnsigned8Value(f.FlowType)
	e[36].SetStringValue(f.EgressName)
	e[37].SetStringValue(f.EgressIP)
	e[38].SetStringValue(f.EgressNode)
	e[39].SetUnsigned16Value(f.ProxySnatPort)
	e[40].SetIPAddressValue(f.clusterIP)
	e[41].SetIPAddressValue(f.snatIP)
	e[42].SetIPAddressValue(f.serviceIP)
}
