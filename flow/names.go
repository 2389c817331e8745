package flow

import "strconv"

// ProtocolName names an IANA protocol number as people read it (ICMP,
// TCP, UDP, ICMPv6, SCTP), the number for the others.
func ProtocolName(p uint8) string {
	switch p {
	case 1:
		return "ICMP"
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 58:
		return "ICMPv6"
	case 132:
		return "SCTP"
	}
	return strconv.Itoa(int(p))
}

// ActionName names a policy rule action as Antrea does: "" for none,
// Allow, Drop, Reject, and Invalid for a value it does not define.
func ActionName(a uint8) string {
	switch a {
	case ActionNone:
		return ""
	case ActionAllow:
		return "Allow"
	case ActionDrop:
		return "Drop"
	case ActionReject:
		return "Reject"
	}
	return "Invalid"
}

// FlowTypeName names a flow type: intra-node, inter-node, to-external,
// from-external, "" for none or a value it does not define.
func FlowTypeName(t uint8) string {
	switch t {
	case FlowTypeIntraNode:
		return "intra-node"
	case FlowTypeInterNode:
		return "inter-node"
	case FlowTypeToExternal:
		return "to-external"
	case FlowTypeFromExternal:
		return "from-external"
	}
	return ""
}
