// Package crd holds the few Antrea custom resource types that Traceflow
// reads or writes (Traceflow, Egress, Antrea-native NetworkPolicy and
// ClusterNetworkPolicy), written from the reference description. Antrea's
// own Go module is not a dependency: only the fields the model uses are
// declared, and field order follows the upstream JSON layout because that
// order is the output order.
package crd

import (
	"bytes"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// GroupVersion of every type here.
const GroupVersion = "crd.antrea.io/v1beta1"

// Component names an observation's source in the pipeline.
type Component string

// Components as Antrea's Traceflow API spells them. Routing is declared
// upstream but never emitted; it is kept so input objects round-trip.
const (
	ComponentSpoofGuard    Component = "SpoofGuard"
	ComponentLB            Component = "LB"
	ComponentRouting       Component = "Routing"
	ComponentNetworkPolicy Component = "NetworkPolicy"
	ComponentForwarding    Component = "Forwarding"
	ComponentEgress        Component = "Egress"
)

// Action is what happened to the packet at a component.
type Action string

// Actions, current names (ForwardedOutOfOverlay was renamed upstream).
const (
	ActionDelivered             Action = "Delivered"
	ActionReceived              Action = "Received"
	ActionForwarded             Action = "Forwarded"
	ActionDropped               Action = "Dropped"
	ActionRejected              Action = "Rejected"
	ActionForwardedOutOfNetwork Action = "ForwardedOutOfNetwork"
	ActionMarkedForSNAT         Action = "MarkedForSNAT"
	ActionForwardedToEgressNode Action = "ForwardedToEgressNode"
)

// Phase of a Traceflow.
type Phase string

// Phases of v1beta1 (there is no Pending).
const (
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

// Traceflow is the cluster-scoped trace request and its result.
type Traceflow struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              TraceflowSpec   `json:"spec"`
	Status            TraceflowStatus `json:"status,omitempty"`
}

// TraceflowSpec is what to trace.
type TraceflowSpec struct {
	Source      Source      `json:"source,omitempty"`
	Destination Destination `json:"destination,omitempty"`
	Packet      Packet      `json:"packet,omitempty"`
	LiveTraffic bool        `json:"liveTraffic,omitempty"`
	DroppedOnly bool        `json:"droppedOnly,omitempty"`
	Timeout     int32       `json:"timeout,omitempty"`
}

// Source of a trace.
type Source struct {
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	IP        string `json:"ip,omitempty"`
}

// Destination of a trace: a Pod, a Service or an IP.
type Destination struct {
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Service   string `json:"service,omitempty"`
	IP        string `json:"ip,omitempty"`
}

// Packet describes the injected packet's headers.
type Packet struct {
	SrcIP           string          `json:"srcIP,omitempty"`
	DstIP           string          `json:"dstIP,omitempty"`
	Length          int32           `json:"length,omitempty"`
	IPHeader        *IPHeader       `json:"ipHeader,omitempty"`
	IPv6Header      *IPv6Header     `json:"ipv6Header,omitempty"`
	TransportHeader TransportHeader `json:"transportHeader,omitempty"`
}

// IPHeader of an IPv4 packet.
type IPHeader struct {
	Protocol int32 `json:"protocol,omitempty"`
	TTL      int32 `json:"ttl,omitempty"`
	Flags    int32 `json:"flags,omitempty"`
}

// IPv6Header of an IPv6 packet; its presence makes the trace IPv6.
type IPv6Header struct {
	NextHeader *int32 `json:"nextHeader,omitempty"`
	HopLimit   int32  `json:"hopLimit,omitempty"`
}

// TransportHeader holds at most one of its members.
type TransportHeader struct {
	ICMP *ICMPEchoRequestHeader `json:"icmp,omitempty"`
	UDP  *UDPHeader             `json:"udp,omitempty"`
	TCP  *TCPHeader             `json:"tcp,omitempty"`
}

// ICMPEchoRequestHeader of an echo request.
type ICMPEchoRequestHeader struct {
	ID       int32 `json:"id,omitempty"`
	Sequence int32 `json:"sequence,omitempty"`
}

// UDPHeader ports.
type UDPHeader struct {
	SrcPort int32 `json:"srcPort,omitempty"`
	DstPort int32 `json:"dstPort,omitempty"`
}

// TCPHeader ports and flags (nil flags means SYN).
type TCPHeader struct {
	SrcPort int32  `json:"srcPort,omitempty"`
	DstPort int32  `json:"dstPort,omitempty"`
	Flags   *int32 `json:"flags,omitempty"`
}

// TraceflowStatus is filled in by the trace.
type TraceflowStatus struct {
	Phase        Phase        `json:"phase,omitempty"`
	Reason       string       `json:"reason,omitempty"`
	StartTime    *metav1.Time `json:"startTime,omitempty"`
	DataplaneTag int8         `json:"dataplaneTag,omitempty"`
	Results      []NodeResult `json:"results,omitempty"`
}

// NodeResult is what one Node reported.
type NodeResult struct {
	Node         string        `json:"node,omitempty" yaml:"node,omitempty"`
	Role         string        `json:"role,omitempty" yaml:"role,omitempty"`
	Timestamp    int64         `json:"timestamp,omitempty" yaml:"timestamp,omitempty"`
	Observations []Observation `json:"observations,omitempty" yaml:"observations,omitempty"`
}

// Observation is one step of a NodeResult. Field order is output order.
type Observation struct {
	Component         Component `json:"component,omitempty" yaml:"component,omitempty"`
	ComponentInfo     string    `json:"componentInfo,omitempty" yaml:"componentInfo,omitempty"`
	Action            Action    `json:"action,omitempty" yaml:"action,omitempty"`
	Pod               string    `json:"pod,omitempty" yaml:"pod,omitempty"`
	DstMAC            string    `json:"dstMAC,omitempty" yaml:"dstMAC,omitempty"`
	NetworkPolicy     string    `json:"networkPolicy,omitempty" yaml:"networkPolicy,omitempty"`
	NetworkPolicyRule string    `json:"networkPolicyRule,omitempty" yaml:"networkPolicyRule,omitempty"`
	Egress            string    `json:"egress,omitempty" yaml:"egress,omitempty"`
	TTL               int32     `json:"ttl,omitempty" yaml:"ttl,omitempty"`
	TranslatedSrcIP   string    `json:"translatedSrcIP,omitempty" yaml:"translatedSrcIP,omitempty"`
	TranslatedDstIP   string    `json:"translatedDstIP,omitempty" yaml:"translatedDstIP,omitempty"`
	TunnelDstIP       string    `json:"tunnelDstIP,omitempty" yaml:"tunnelDstIP,omitempty"`
	EgressIP          string    `json:"egressIP,omitempty" yaml:"egressIP,omitempty"`
	EgressNode        string    `json:"egressNode,omitempty" yaml:"egressNode,omitempty"`
	SrcPodIP          string    `json:"srcPodIP,omitempty" yaml:"srcPodIP,omitempty"`
}

// Egress selects Pods whose external traffic leaves with a given IP.
type Egress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              EgressSpec   `json:"spec"`
	Status            EgressStatus `json:"status,omitempty"`
}

// EgressSpec of an Egress.
type EgressSpec struct {
	AppliedTo       AppliedTo `json:"appliedTo"`
	EgressIP        string    `json:"egressIP,omitempty"`
	EgressIPs       []string  `json:"egressIPs,omitempty"`
	ExternalIPPool  string    `json:"externalIPPool,omitempty"`
	ExternalIPPools []string  `json:"externalIPPools,omitempty"`
}

// EgressStatus says which Node holds the effective IP.
type EgressStatus struct {
	EgressNode string `json:"egressNode,omitempty"`
	EgressIP   string `json:"egressIP,omitempty"`
}

// AppliedTo selects Pods by Pod and Namespace labels.
type AppliedTo struct {
	PodSelector       *metav1.LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// Kinds of Antrea-native policy.
const (
	KindAntreaNetworkPolicy  = "NetworkPolicy"
	KindAntreaClusterPolicy  = "ClusterNetworkPolicy"
	KindEgress               = "Egress"
	KindClusterGroup         = "ClusterGroup"
	KindGroup                = "Group"
	KindTraceflow            = "Traceflow"
	RuleActionAllow          = "Allow"
	RuleActionDrop           = "Drop"
	RuleActionReject         = "Reject"
	RuleActionPass           = "Pass"
	DefaultTierName          = "application"
	DefaultTraceflowTimeout  = 20
	DefaultAntreaNPPriority  = 5.0
	AntreaNetworkPolicyType  = "AntreaNetworkPolicy"
	AntreaClusterPolicyType  = "AntreaClusterNetworkPolicy"
	K8sNetworkPolicyType     = "K8sNetworkPolicy"
	ServiceCIDRDefault       = "10.96.0.0/12"
	HairpinVirtualIPv4       = "169.254.0.253"
	HairpinVirtualIPv6       = "fc01::aabb:ccdd:eeff"
	GlobalVirtualMACAddress  = "aa:bb:cc:dd:ee:ff"
	FirstTraceflowTag        = 7
	TraceflowTagStep         = 4
	MaxTraceflowTag          = 59
	DefaultTraceflowHopLimit = 64
)

// AntreaGroup is a ClusterGroup (cluster-scoped) or a Group (namespaced),
// which policies select through by name; Kind tells which.
type AntreaGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              GroupSpec `json:"spec"`
}

// GroupSpec selects Pods, IP blocks, or other groups of the same kind
// (and, for a Group, namespace) by name.
type GroupSpec struct {
	PodSelector       *metav1.LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	IPBlocks          []IPBlock             `json:"ipBlocks,omitempty"`
	ChildGroups       []string              `json:"childGroups,omitempty"`
	// Not modelled; kept to warn that such a group selects nothing.
	ServiceReference       json.RawMessage `json:"serviceReference,omitempty"`
	ExternalEntitySelector json.RawMessage `json:"externalEntitySelector,omitempty"`
}

// AntreaPolicy is an Antrea-native NetworkPolicy (namespaced) or
// ClusterNetworkPolicy (cluster-scoped); Kind tells which.
type AntreaPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              AntreaPolicySpec `json:"spec"`
}

// AntreaPolicySpec of an Antrea-native policy.
type AntreaPolicySpec struct {
	Tier      string             `json:"tier,omitempty"`
	Priority  float64            `json:"priority"`
	AppliedTo []PolicyPeer       `json:"appliedTo,omitempty"`
	Ingress   []AntreaPolicyRule `json:"ingress,omitempty"`
	Egress    []AntreaPolicyRule `json:"egress,omitempty"`
}

// AntreaPolicyRule is one ordered rule.
type AntreaPolicyRule struct {
	Action    string       `json:"action"`
	Name      string       `json:"name,omitempty"`
	From      []PolicyPeer `json:"from,omitempty"`
	To        []PolicyPeer `json:"to,omitempty"`
	Ports     []PolicyPort `json:"ports,omitempty"`
	AppliedTo []PolicyPeer `json:"appliedTo,omitempty"`
	// Protocols are ICMP matches (modelled) and IGMP matches (warned
	// about: upstream's Traceflow cannot send IGMP); L7Protocols are read
	// only to be warned about.
	Protocols   []PolicyProtocol  `json:"protocols,omitempty"`
	L7Protocols []json.RawMessage `json:"l7Protocols,omitempty"`
}

// PolicyProtocol is one entry of a rule's protocols: ICMP or IGMP.
type PolicyProtocol struct {
	ICMP *ICMPProtocol `json:"icmp,omitempty"`
	IGMP *IGMPProtocol `json:"igmp,omitempty"`
}

// ICMPProtocol matches ICMP (ICMPv6 for IPv6 traffic) by type and code;
// an unset field matches any value.
type ICMPProtocol struct {
	ICMPType *int32 `json:"icmpType,omitempty"`
	ICMPCode *int32 `json:"icmpCode,omitempty"`
}

// IGMPProtocol matches IGMP messages by type and multicast group.
type IGMPProtocol struct {
	IGMPType     *int32 `json:"igmpType,omitempty"`
	GroupAddress string `json:"groupAddress,omitempty"`
}

// PolicyPeer selects Pods or an IP block.
type PolicyPeer struct {
	PodSelector       *metav1.LabelSelector `json:"podSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	IPBlock           *IPBlock              `json:"ipBlock,omitempty"`
	Group             string                `json:"group,omitempty"`
	Namespaces        *PeerNamespaces       `json:"namespaces,omitempty"`
}

// PeerNamespaces selects namespaces relative to the Pod a rule applies
// to: match Self is its own namespace; sameLabels the namespaces whose
// values for those label keys equal those of its own.
type PeerNamespaces struct {
	Match      string   `json:"match,omitempty"`
	SameLabels []string `json:"sameLabels,omitempty"`
}

// NamespaceMatchSelf is the namespaces.match value for the applied-to
// Pod's own namespace.
const NamespaceMatchSelf = "Self"

// IsSelf reports whether the peer selects in the applied-to Pod's own
// namespace.
func (p *PolicyPeer) IsSelf() bool {
	return p.Namespaces != nil && p.Namespaces.Match == NamespaceMatchSelf
}

// IsSameLabels reports whether the peer selects namespaces by the label
// values of the applied-to Pod's namespace.
func (p *PolicyPeer) IsSameLabels() bool {
	return p.Namespaces != nil && p.Namespaces.Match == "" && len(p.Namespaces.SameLabels) > 0
}

// IPBlock is a CIDR (Antrea-native blocks have no except list).
type IPBlock struct {
	CIDR string `json:"cidr"`
}

// PolicyPort is a protocol and port (range).
type PolicyPort struct {
	Protocol *string             `json:"protocol,omitempty"`
	Port     *intstr.IntOrString `json:"port,omitempty"`
	EndPort  *int32              `json:"endPort,omitempty"`
}

// Clone returns a deep copy (through JSON: the type is small and this
// keeps it free of generated code).
func (t *Traceflow) Clone() *Traceflow {
	b, err := json.Marshal(t)
	if err != nil {
		panic(fmt.Sprintf("crd: Traceflow does not marshal: %v", err)) // cannot happen: plain data
	}
	var out Traceflow
	if err := json.Unmarshal(b, &out); err != nil {
		panic(fmt.Sprintf("crd: Traceflow does not unmarshal: %v", err))
	}
	return &out
}

// DecodeTraceflow reads a Traceflow from JSON, refusing unknown fields so
// a misspelt spec field is reported rather than ignored.
func DecodeTraceflow(raw []byte) (*Traceflow, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var tf Traceflow
	if err := dec.Decode(&tf); err != nil {
		return nil, fmt.Errorf("Traceflow: %w", err)
	}
	if tf.Name == "" {
		return nil, fmt.Errorf("Traceflow: metadata.name is empty")
	}
	return &tf, nil
}

// KindIPPool is Antrea's IPPool (AntreaIPAM); AnnotationIPPools names the
// pools a Pod or Namespace allocates its Pod IPs from.
const (
	KindIPPool        = "IPPool"
	AnnotationIPPools = "ipam.antrea.io/ippools"
)

// IPPool is an AntreaIPAM pool (crd.antrea.io/v1beta1): address ranges
// with the subnet, gateway and VLAN its Pods are on.
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              IPPoolSpec `json:"spec"`
}

// IPPoolSpec of an IPPool.
type IPPoolSpec struct {
	IPRanges   []IPRange  `json:"ipRanges"`
	SubnetInfo SubnetInfo `json:"subnetInfo"`
}

// IPRange is a CIDR or a start-end range.
type IPRange struct {
	CIDR  string `json:"cidr,omitempty"`
	Start string `json:"start,omitempty"`
	End   string `json:"end,omitempty"`
}

// SubnetInfo is the pool's subnet: gateway, prefix length and VLAN (0:
// untagged).
type SubnetInfo struct {
	Gateway      string `json:"gateway"`
	PrefixLength int32  `json:"prefixLength"`
	VLAN         uint16 `json:"vlan,omitempty"`
}
