package ipfix

// antreaElements returns the complete Antrea registry: elements 100-172 of
// private enterprise 56506, as defined by go-ipfix up to v0.17.
//
// Some of them are never sent by current Antrea (114, 116, 117, 119, 138, and
// the L7 elements 155-156 removed in Antrea v2.6), and 106-107 are
// deprecated in favour of 168-169; all are kept so that records from any
// Antrea version decode by name.
//
// The UUID elements (159-167) are fixed 16-octet octetArrays holding the
// binary UUID, all zero when unset.
func antreaElements() []InfoElement {
	const pen = EnterpriseAntrea
	const uuidLength = 16
	return []InfoElement{
		// Kubernetes identity of the flow endpoints.
		{Name: "sourcePodNamespace", EnterpriseID: pen, ID: 100, Type: String},
		{Name: "sourcePodName", EnterpriseID: pen, ID: 101, Type: String},
		{Name: "destinationPodNamespace", EnterpriseID: pen, ID: 102, Type: String},
		{Name: "destinationPodName", EnterpriseID: pen, ID: 103, Type: String},
		{Name: "sourceNodeName", EnterpriseID: pen, ID: 104, Type: String},
		{Name: "destinationNodeName", EnterpriseID: pen, ID: 105, Type: String},
		{Name: "destinationClusterIPv4", EnterpriseID: pen, ID: 106, Type: IPv4Address},
		{Name: "destinationClusterIPv6", EnterpriseID: pen, ID: 107, Type: IPv6Address},
		{Name: "destinationServicePort", EnterpriseID: pen, ID: 108, Type: Unsigned16},
		{Name: "destinationServicePortName", EnterpriseID: pen, ID: 109, Type: String},

		// NetworkPolicies that allowed or denied the flow.
		{Name: "ingressNetworkPolicyName", EnterpriseID: pen, ID: 110, Type: String},
		{Name: "ingressNetworkPolicyNamespace", EnterpriseID: pen, ID: 111, Type: String},
		{Name: "egressNetworkPolicyName", EnterpriseID: pen, ID: 112, Type: String},
		{Name: "egressNetworkPolicyNamespace", EnterpriseID: pen, ID: 113, Type: String},
		{Name: "ingressNetworkPolicyUID", EnterpriseID: pen, ID: 114, Type: String},
		{Name: "ingressNetworkPolicyType", EnterpriseID: pen, ID: 115, Type: Unsigned8},
		{Name: "ingressNetworkPolicyRulePriority", EnterpriseID: pen, ID: 116, Type: Signed32},
		{Name: "egressNetworkPolicyUID", EnterpriseID: pen, ID: 117, Type: String},
		{Name: "egressNetworkPolicyType", EnterpriseID: pen, ID: 118, Type: Unsigned8},
		{Name: "egressNetworkPolicyRulePriority", EnterpriseID: pen, ID: 119, Type: Signed32},

		// Per-Node counters kept by the Flow Aggregator.
		{Name: "packetTotalCountFromSourceNode", EnterpriseID: pen, ID: 120, Type: Unsigned64},
		{Name: "octetTotalCountFromSourceNode", EnterpriseID: pen, ID: 121, Type: Unsigned64},
		{Name: "packetDeltaCountFromSourceNode", EnterpriseID: pen, ID: 122, Type: Unsigned64},
		{Name: "octetDeltaCountFromSourceNode", EnterpriseID: pen, ID: 123, Type: Unsigned64},
		{Name: "reversePacketTotalCountFromSourceNode", EnterpriseID: pen, ID: 124, Type: Unsigned64},
		{Name: "reverseOctetTotalCountFromSourceNode", EnterpriseID: pen, ID: 125, Type: Unsigned64},
		{Name: "reversePacketDeltaCountFromSourceNode", EnterpriseID: pen, ID: 126, Type: Unsigned64},
		{Name: "reverseOctetDeltaCountFromSourceNode", EnterpriseID: pen, ID: 127, Type: Unsigned64},
		{Name: "packetTotalCountFromDestinationNode", EnterpriseID: pen, ID: 128, Type: Unsigned64},
		{Name: "octetTotalCountFromDestinationNode", EnterpriseID: pen, ID: 129, Type: Unsigned64},
		{Name: "packetDeltaCountFromDestinationNode", EnterpriseID: pen, ID: 130, Type: Unsigned64},
		{Name: "octetDeltaCountFromDestinationNode", EnterpriseID: pen, ID: 131, Type: Unsigned64},
		{Name: "reversePacketTotalCountFromDestinationNode", EnterpriseID: pen, ID: 132, Type: Unsigned64},
		{Name: "reverseOctetTotalCountFromDestinationNode", EnterpriseID: pen, ID: 133, Type: Unsigned64},
		{Name: "reversePacketDeltaCountFromDestinationNode", EnterpriseID: pen, ID: 134, Type: Unsigned64},
		{Name: "reverseOctetDeltaCountFromDestinationNode", EnterpriseID: pen, ID: 135, Type: Unsigned64},

		// Connection state, flow classification and rule details.
		{Name: "tcpState", EnterpriseID: pen, ID: 136, Type: String},
		{Name: "flowType", EnterpriseID: pen, ID: 137, Type: Unsigned8},
		{Name: "tcpStatePrevList", EnterpriseID: pen, ID: 138, Type: String},
		{Name: "ingressNetworkPolicyRuleAction", EnterpriseID: pen, ID: 139, Type: Unsigned8},
		{Name: "egressNetworkPolicyRuleAction", EnterpriseID: pen, ID: 140, Type: Unsigned8},
		{Name: "ingressNetworkPolicyRuleName", EnterpriseID: pen, ID: 141, Type: String},
		{Name: "egressNetworkPolicyRuleName", EnterpriseID: pen, ID: 142, Type: String},
		{Name: "sourcePodLabels", EnterpriseID: pen, ID: 143, Type: String},
		{Name: "destinationPodLabels", EnterpriseID: pen, ID: 144, Type: String},

		// Throughput (bits per second) and per-Node end times.
		{Name: "throughput", EnterpriseID: pen, ID: 145, Type: Unsigned64},
		{Name: "reverseThroughput", EnterpriseID: pen, ID: 146, Type: Unsigned64},
		{Name: "throughputFromSourceNode", EnterpriseID: pen, ID: 147, Type: Unsigned64},
		{Name: "throughputFromDestinationNode", EnterpriseID: pen, ID: 148, Type: Unsigned64},
		{Name: "reverseThroughputFromSourceNode", EnterpriseID: pen, ID: 149, Type: Unsigned64},
		{Name: "reverseThroughputFromDestinationNode", EnterpriseID: pen, ID: 150, Type: Unsigned64},
		{Name: "flowEndSecondsFromSourceNode", EnterpriseID: pen, ID: 151, Type: DateTimeSeconds},
		{Name: "flowEndSecondsFromDestinationNode", EnterpriseID: pen, ID: 152, Type: DateTimeSeconds},

		// Egress (SNAT gateway), L7 and cluster identity.
		{Name: "egressName", EnterpriseID: pen, ID: 153, Type: String},
		{Name: "egressIP", EnterpriseID: pen, ID: 154, Type: String},
		{Name: "appProtocolName", EnterpriseID: pen, ID: 155, Type: String},
		{Name: "httpVals", EnterpriseID: pen, ID: 156, Type: String},
		{Name: "egressNodeName", EnterpriseID: pen, ID: 157, Type: String},
		{Name: "clusterId", EnterpriseID: pen, ID: 158, Type: String},

		// Kubernetes UIDs, as binary UUIDs.
		{Name: "sourcePodUUID", EnterpriseID: pen, ID: 159, Type: OctetArray, Length: uuidLength},
		{Name: "destinationPodUUID", EnterpriseID: pen, ID: 160, Type: OctetArray, Length: uuidLength},
		{Name: "sourceNodeUUID", EnterpriseID: pen, ID: 161, Type: OctetArray, Length: uuidLength},
		{Name: "destinationNodeUUID", EnterpriseID: pen, ID: 162, Type: OctetArray, Length: uuidLength},
		{Name: "destinationServiceUUID", EnterpriseID: pen, ID: 163, Type: OctetArray, Length: uuidLength},
		{Name: "ingressNetworkPolicyUUID", EnterpriseID: pen, ID: 164, Type: OctetArray, Length: uuidLength},
		{Name: "egressNetworkPolicyUUID", EnterpriseID: pen, ID: 165, Type: OctetArray, Length: uuidLength},
		{Name: "egressUUID", EnterpriseID: pen, ID: 166, Type: OctetArray, Length: uuidLength},
		{Name: "egressNodeUUID", EnterpriseID: pen, ID: 167, Type: OctetArray, Length: uuidLength},

		// Service IP (successor of destinationClusterIP*) and proxy SNAT.
		{Name: "destinationServiceIPv4", EnterpriseID: pen, ID: 168, Type: IPv4Address},
		{Name: "destinationServiceIPv6", EnterpriseID: pen, ID: 169, Type: IPv6Address},
		{Name: "proxySnatIPv4", EnterpriseID: pen, ID: 170, Type: IPv4Address},
		{Name: "proxySnatIPv6", EnterpriseID: pen, ID: 171, Type: IPv6Address},
		{Name: "proxySnatPort", EnterpriseID: pen, ID: 172, Type: Unsigned16},
	}
}
