package flowlog

import (
	"strconv"

	"sluice/flow"
	"sluice/sink/rowtext"
)

// Fields is the number of comma-separated fields of a line.
const Fields = 30

// AppendLine appends f's flow-log line (no newline) to b: Antrea's
// 30-field layout, comma-joined without quoting. With pretty, the
// protocol, rule actions and policy types are written as words;
// otherwise as their numbers.
func AppendLine(b []byte, f *flow.Flow, pretty bool) []byte {
	b = rowtext.AppendSeconds(b, f.StartTime)
	b = append(b, ',')
	b = rowtext.AppendSeconds(b, f.EndTime)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.SourceIP)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.DestinationIP)
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(f.SourcePort), 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(f.DestinationPort), 10)
	b = append(b, ',')
	if pretty {
		b = append(b, ProtocolName(f.Protocol)...)
	} else {
		b = strconv.AppendUint(b, uint64(f.Protocol), 10)
	}
	for _, s := range [...]string{f.SourcePodName, f.SourcePodNamespace, f.SourceNodeName,
		f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName} {
		b = append(b, ',')
		b = rowtext.AppendText(b, s)
	}
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.DestinationClusterIP)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.DestinationServiceIP)
	b = append(b, ',')
	b = strconv.AppendUint(b, uint64(f.DestinationServicePort), 10)
	b = append(b, ',')
	b = rowtext.AppendText(b, f.DestinationServicePortName)
	b = appendPolicy(b, &f.Ingress, pretty)
	b = appendPolicy(b, &f.Egress, pretty)
	b = append(b, ',')
	b = rowtext.AppendText(b, f.EgressName)
	b = append(b, ',')
	b = rowtext.AppendAddr(b, f.EgressIP)
	b = append(b, ',')
	b = rowtext.AppendText(b, f.EgressNodeName)
	return b
}

// appendPolicy writes name, namespace, rule name, rule action and type.
func appendPolicy(b []byte, p *flow.Policy, pretty bool) []byte {
	for _, s := range [...]string{p.Name, p.Namespace, p.RuleName} {
		b = append(b, ',')
		b = rowtext.AppendText(b, s)
	}
	b = append(b, ',')
	if pretty {
		b = append(b, ActionName(p.RuleAction)...)
	} else {
		b = strconv.AppendUint(b, uint64(p.RuleAction), 10)
	}
	b = append(b, ',')
	if pretty {
		b = append(b, PolicyTypeName(p.Type)...)
	} else {
		b = strconv.AppendUint(b, uint64(p.Type), 10)
	}
	return b
}

// ProtocolName is the prettyPrint name of an IP protocol number: TCP, UDP,
// ICMP, IPv6-ICMP, SCTP, or the number for the rest.
func ProtocolName(p uint8) string {
	if p == 58 {
		return "IPv6-ICMP" // the reference's flow log spelling
	}
	return flow.ProtocolName(p)
}

// ActionName is the prettyPrint name of a rule action: "" (none), Allow,
// Drop, Reject, or Invalid.
func ActionName(a uint8) string { return flow.ActionName(a) }

// PolicyTypeName is the prettyPrint name of a policy type: "" (none),
// K8sNetworkPolicy, AntreaNetworkPolicy, AntreaClusterNetworkPolicy,
// K8sClusterNetworkPolicy (type 4, which the reference still writes as
// Invalid), or Invalid.
func PolicyTypeName(t uint8) string {
	switch t {
	case 0:
		return ""
	case 1:
		return "K8sNetworkPolicy"
	case 2:
		return "AntreaNetworkPolicy"
	case 3:
		return "AntreaClusterNetworkPolicy"
	case 4:
		return "K8sClusterNetworkPolicy"
	}
	return "Invalid"
}
