package ipfixmap

import (
	"fmt"
	"slices"
)

// AgentVersions are the Antrea agent element sets Sluice can emulate, oldest
// first; see AgentElements.
func AgentVersions() []string { return []string{"v1.13", "v1.15", "v2.0", "v2.6", "v2.7"} }

// AgentElements lists, in template order, the elements an Antrea agent of
// the given version exports for one IP family (4 or 6): 39 elements in
// v1.13, 41 in v1.15 (two L7 elements), 42 in v2.0 (egressNodeName inserted
// before destinationClusterIP, not appended), 40 in v2.6 (L7 removed) and
// 43 in v2.7.
func AgentElements(version string, family int) ([]string, error) {
	if family != 4 && family != 6 {
		return nil, fmt.Errorf("ipfixmap: IP family %d is neither 4 nor 6", family)
	}
	if !slices.Contains(AgentVersions(), version) {
		return nil, fmt.Errorf("ipfixmap: unknown agent version %q (have %v)", version, AgentVersions())
	}
	v := "IPv4"
	if family == 6 {
		v = "IPv6"
	}
	out := []string{
		"flowStartSeconds", "flowEndSeconds", "flowEndReason",
		"sourceTransportPort", "destinationTransportPort", "protocolIdentifier",
		"packetTotalCount", "octetTotalCount", "packetDeltaCount", "octetDeltaCount",
		"source" + v + "Address", "destination" + v + "Address",
		"reversePacketTotalCount", "reverseOctetTotalCount", "reversePacketDeltaCount", "reverseOctetDeltaCount",
		"sourcePodName", "sourcePodNamespace", "sourceNodeName",
		"destinationPodName", "destinationPodNamespace", "destinationNodeName",
		"destinationServicePort", "destinationServicePortName",
		"ingressNetworkPolicyName", "ingressNetworkPolicyNamespace", "ingressNetworkPolicyType",
		"ingressNetworkPolicyRuleName", "ingressNetworkPolicyRuleAction",
		"egressNetworkPolicyName", "egressNetworkPolicyNamespace", "egressNetworkPolicyType",
		"egressNetworkPolicyRuleName", "egressNetworkPolicyRuleAction",
		"tcpState", "flowType", "egressName", "egressIP",
	}
	if version == "v1.15" || version == "v2.0" {
		out = append(out, "appProtocolName", "httpVals")
	}
	if version != "v1.13" && version != "v1.15" {
		out = append(out, "egressNodeName")
	}
	if version == "v2.7" {
		out = append(out, "proxySnatPort")
	}
	out = append(out, "destinationCluster"+v)
	if version == "v2.7" {
		out = append(out, "proxySnat"+v, "destinationService"+v)
	}
	return out, nil
}

// NewestAgent is the agent version whose element set the aggregator
// expects; elements of it that a record lacks count as missing.
const NewestAgent = "v2.7"

// ExportOptions selects the optional parts of the aggregator's own export.
type ExportOptions struct {
	// Names and UIDs mirror flowCollector.includeK8sNames/includeK8sUIDs.
	Names, UIDs bool
	// Proxy adds the original* elements and flowDirection.
	Proxy bool
	// Aggregate adds the per-node counters and throughputs.
	Aggregate bool
}

// ExportElements lists, in template order, what the aggregator exports
// for one IP family; the order is Antrea's (names on, UIDs off: 50
// elements in Proxy mode).
func ExportElements(family int, o ExportOptions) []string {
	v := "IPv4"
	if family == 6 {
		v = "IPv6"
	}
	n := func(names ...string) []string {
		if o.Names {
			return names
		}
		return nil
	}
	u := func(names ...string) []string {
		if o.UIDs {
			return names
		}
		return nil
	}
	var out []string
	add := func(parts ...[]string) {
		for _, p := range parts {
			out = append(out, p...)
		}
	}
	add([]string{
		"flowStartSeconds", "flowEndSeconds", "flowEndReason",
		"sourceTransportPort", "destinationTransportPort", "protocolIdentifier",
		"packetTotalCount", "octetTotalCount", "packetDeltaCount", "octetDeltaCount",
		"source" + v + "Address", "destination" + v + "Address",
		"reversePacketTotalCount", "reverseOctetTotalCount", "reversePacketDeltaCount", "reverseOctetDeltaCount",
	},
		n("sourcePodName", "sourcePodNamespace"), u("sourcePodUUID"), n("sourceNodeName"), u("sourceNodeUUID"),
		n("destinationPodName", "destinationPodNamespace"), u("destinationPodUUID"), n("destinationNodeName"), u("destinationNodeUUID"),
		[]string{"destinationServicePort"}, n("destinationServicePortName"), u("destinationServiceUUID"),
		n("ingressNetworkPolicyName", "ingressNetworkPolicyNamespace"), u("ingressNetworkPolicyUUID"),
		[]string{"ingressNetworkPolicyType", "ingressNetworkPolicyRuleName", "ingressNetworkPolicyRuleAction"},
		n("egressNetworkPolicyName", "egressNetworkPolicyNamespace"), u("egressNetworkPolicyUUID"),
		[]string{"egressNetworkPolicyType", "egressNetworkPolicyRuleName", "egressNetworkPolicyRuleAction"},
		[]string{"tcpState", "flowType"}, n("egressName"), u("egressUUID"), []string{"egressIP"},
		n("egressNodeName"), u("egressNodeUUID"),
		[]string{"proxySnatPort", "proxySnat" + v, "destinationCluster" + v, "destinationService" + v},
	)
	if o.Aggregate {
		for _, m := range []string{"octetDeltaCount", "octetTotalCount", "packetDeltaCount", "packetTotalCount",
			"reverseOctetDeltaCount", "reverseOctetTotalCount", "reversePacketDeltaCount", "reversePacketTotalCount"} {
			out = append(out, m+"FromSourceNode", m+"FromDestinationNode")
		}
		out = append(out, "flowEndSecondsFromSourceNode", "flowEndSecondsFromDestinationNode",
			"throughput", "throughputFromSourceNode", "throughputFromDestinationNode",
			"reverseThroughput", "reverseThroughputFromSourceNode", "reverseThroughputFromDestinationNode")
	}
	out = append(out, "sourcePodLabels", "destinationPodLabels", "clusterId")
	if o.Proxy {
		out = append(out, "originalObservationDomainId", "originalExporterIPv4Address", "originalExporterIPv6Address", "flowDirection")
	}
	return out
}
