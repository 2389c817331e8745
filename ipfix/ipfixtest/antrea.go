// Package ipfixtest builds IPFIX messages shaped like real exporters'
// output, for tests and benchmarks of this module and of the interop module.
package ipfixtest

import (
	"fmt"
	"net/netip"
	"time"

	"sluice/ipfix"
)

// AntreaV27IPv4 lists, in the agent's template order, the 43 elements an
// Antrea v2.7 agent exports for an IPv4 flow.
func AntreaV27IPv4() []string {
	return []string{
		"flowStartSeconds", "flowEndSeconds", "flowEndReason",
		"sourceTransportPort", "destinationTransportPort", "protocolIdentifier",
		"packetTotalCount", "octetTotalCount", "packetDeltaCount", "octetDeltaCount",
		"sourceIPv4Address", "destinationIPv4Address",
		"reversePacketTotalCount", "reverseOctetTotalCount", "reversePacketDeltaCount", "reverseOctetDeltaCount",
		"sourcePodName", "sourcePodNamespace", "sourceNodeName",
		"destinationPodName", "destinationPodNamespace", "destinationNodeName",
		"destinationServicePort", "destinationServicePortName",
		"ingressNetworkPolicyName", "ingressNetworkPolicyNamespace", "ingressNetworkPolicyType",
		"ingressNetworkPolicyRuleName", "ingressNetworkPolicyRuleAction",
		"egressNetworkPolicyName", "egressNetworkPolicyNamespace", "egressNetworkPolicyType",
		"egressNetworkPolicyRuleName", "egressNetworkPolicyRuleAction",
		"tcpState", "flowType", "egressName", "egressIP", "egressNodeName",
		"proxySnatPort", "destinationClusterIPv4", "proxySnatIPv4", "destinationServiceIPv4",
	}
}

// Template builds a template of the named elements of reg.
func Template(reg *ipfix.Registry, id uint16, names []string) (*ipfix.Template, error) {
	elems := make([]*ipfix.InfoElement, len(names))
	for i, n := range names {
		ie, ok := reg.ByName(n)
		if !ok {
			return nil, fmt.Errorf("ipfixtest: registry has no element %q", n)
		}
		elems[i] = ie
	}
	return ipfix.TemplateOf(id, elems...)
}

// Flow is the content of one synthetic Antrea flow record.
type Flow struct {
	Start, End       time.Time
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
	Packets, Octets  uint64
	RevPackets       uint64
	RevOctets        uint64
	SrcPod, DstPod   string
	Namespace        string
	SrcNode, DstNode string
}

// SampleFlow returns a deterministic flow numbered i.
func SampleFlow(i int) Flow {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return Flow{
		Start: base.Add(time.Duration(i) * time.Second), End: base.Add(time.Duration(i+30) * time.Second),
		Src: netip.AddrFrom4([4]byte{10, 244, 1, byte(i%250 + 2)}), Dst: netip.AddrFrom4([4]byte{10, 244, 2, byte(i%200 + 2)}),
		SrcPort: uint16(30000 + i%30000), DstPort: 8080, Proto: 6,
		Packets: uint64(100 + i), Octets: uint64(10000 + 13*i), RevPackets: uint64(80 + i), RevOctets: uint64(90000 + 7*i),
		SrcPod: fmt.Sprintf("client-%d", i%50), DstPod: fmt.Sprintf("server-%d", i%20), Namespace: "default",
		SrcNode: "node-1", DstNode: "",
	}
}

// WriteAntreaV27 writes f as a record of a template built from
// AntreaV27IPv4, with the values an agent would send.
func WriteAntreaV27(e *ipfix.Encoder, domain uint32, t *ipfix.Template, f Flow) error {
	return e.Begin(domain, t).
		Time(f.Start).Time(f.End).Uint(2).
		Uint(uint64(f.SrcPort)).Uint(uint64(f.DstPort)).Uint(uint64(f.Proto)).
		Uint(f.Packets).Uint(f.Octets).Uint(f.Packets / 10).Uint(f.Octets / 10).
		Addr(f.Src).Addr(f.Dst).
		Uint(f.RevPackets).Uint(f.RevOctets).Uint(f.RevPackets / 10).Uint(f.RevOctets / 10).
		String(f.SrcPod).String(f.Namespace).String(f.SrcNode).
		String(f.DstPod).String(f.Namespace).String(f.DstNode).
		Uint(uint64(f.DstPort)).String("default/server:http").
		String("allow-web").String("default").Uint(1).String("rule-1").Uint(1).
		String("").String("").Uint(0).String("").Uint(0).
		String("ESTABLISHED").Uint(2).String("").String("").String("").
		Uint(0).Addr(netip.AddrFrom4([4]byte{10, 96, 0, 10})).Addr(netip.Addr{}).Addr(netip.AddrFrom4([4]byte{10, 96, 0, 10})).
		End()
}
