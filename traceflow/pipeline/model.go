// Package pipeline generates, from a cluster.State, one modelled Antrea
// OVS bridge per Node: the ordered tables of the reference pipeline with
// their registers, marks, conntrack zones, Service load balancing,
// NetworkPolicy conjunctions, Egress flows and tunnels, plus the flows a
// Traceflow adds for its dataplane tag.
package pipeline

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
)

// TrafficMode is how Pod traffic crosses Nodes.
type TrafficMode string

// Traffic modes.
const (
	Encap             TrafficMode = "encap"
	NoEncap           TrafficMode = "noEncap"
	Hybrid            TrafficMode = "hybrid"
	NetworkPolicyOnly TrafficMode = "networkPolicyOnly"
)

// ParseTrafficMode accepts the four mode names (case as documented).
func ParseTrafficMode(s string) (TrafficMode, error) {
	switch m := TrafficMode(s); m {
	case Encap, NoEncap, Hybrid, NetworkPolicyOnly:
		return m, nil
	}
	return "", fmt.Errorf("traffic mode %q is not one of encap, noEncap, hybrid, networkPolicyOnly", s)
}

// ParseTunnelType accepts geneve or vxlan.
func ParseTunnelType(s string) (datapath.TunnelType, error) {
	switch t := datapath.TunnelType(s); t {
	case datapath.Geneve, datapath.VXLAN:
		return t, nil
	}
	return "", fmt.Errorf("tunnel type %q is not one of geneve, vxlan", s)
}

// Encapsulates reports whether the mode uses the tunnel for some traffic.
func (m TrafficMode) Encapsulates() bool { return m == Encap || m == Hybrid }

// EncryptionMode is the agents' trafficEncryptionMode.
type EncryptionMode string

// Encryption modes (the reference's spelling; parsed without regard to case).
const (
	EncryptionNone EncryptionMode = "none"
	WireGuard      EncryptionMode = "wireGuard"
)

// ParseEncryptionMode accepts none (or empty) and wireGuard in any case,
// as the reference does; ipsec, which the reference also accepts, is not
// modelled (it adds one tunnel port per peer Node).
func ParseEncryptionMode(s string) (EncryptionMode, error) {
	switch strings.ToLower(s) {
	case "", "none":
		return EncryptionNone, nil
	case "wireguard":
		return WireGuard, nil
	case "ipsec":
		return "", fmt.Errorf("traffic encryption mode %q is not modelled (only none and wireGuard are)", s)
	}
	return "", fmt.Errorf("traffic encryption mode %q is not one of none, ipsec, wireGuard", s)
}

// Config is the cluster-wide agent configuration the model depends on.
type Config struct {
	TrafficMode       TrafficMode
	TunnelType        datapath.TunnelType
	ServiceCIDRs      []netip.Prefix
	EgressExceptCIDRs []netip.Prefix
	// Tag is the Traceflow dataplane tag (DSCP) whose flows are added; 0
	// adds none, giving the pipeline as it is without a running trace.
	Tag uint8
	// ProxyAll is the agent's antreaProxy.proxyAll: NodePorts are then
	// load-balanced in OVS (NodePortMark marks the Node's own addresses)
	// rather than by kube-proxy behind the gateway.
	ProxyAll bool
	// Encryption is the agents' trafficEncryptionMode. With WireGuard
	// (encap mode only) Pod traffic to other Nodes is routed by the host
	// through the WireGuard device rather than the OVS tunnel; Egress
	// traffic to a remote Egress Node still takes the tunnel.
	Encryption EncryptionMode
	// Multicast is the agents' multicast.enable: IPv4 multicast then
	// forks to the multicast tables, which the model does not hold and
	// where the reference has no Traceflow flow (the tracer refuses such
	// destinations). Without it multicast is routed as any outside address.
	Multicast bool
	// BridgingMode is the agents' enableBridgingMode (with the AntreaIPAM
	// feature gate; noEncap only, as the reference's agent requires): the
	// Node's uplink is connected to the bridge, and Pods whose IPv4
	// address comes from an IPPool (outside the Node's PodCIDR) are
	// AntreaIPAM Pods, bridged to the underlay through the uplink.
	BridgingMode bool
}

// WireGuard reports whether inter-Node Pod traffic goes through WireGuard.
func (c Config) WireGuard() bool { return c.Encryption == WireGuard }

// tunnelsToPeer reports whether Pod traffic from a Node at local to one
// at peer is encapsulated by the OVS tunnel rather than routed by the host.
func (c Config) tunnelsToPeer(local, peer netip.Addr) bool {
	if c.WireGuard() {
		return false
	}
	return c.TrafficMode == Encap || (c.TrafficMode == Hybrid && !sameSubnet(local, peer))
}

// DefaultConfig is encap over Geneve with kubeadm's Service CIDR.
func DefaultConfig() Config {
	return Config{TrafficMode: Encap, TunnelType: datapath.Geneve, Encryption: EncryptionNone,
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix(crd.ServiceCIDRDefault)}}
}

// Fixed OpenFlow ports, as Antrea numbers them.
const (
	TunnelPort  uint32 = 1
	GatewayPort uint32 = 2
	firstPod    uint32 = 3
	// With BridgingMode, the uplink and the host interface that took over
	// its address, at the "controller" port numbers the reference's agent
	// requests for them (OVS itself never assigns numbers that high, so
	// they never collide with Pod ports).
	UplinkPort uint32 = 32770
	HostPort   uint32 = 32771
)

// Packet-in categories in the controller action's userdata.
const (
	CategoryTraceflow uint8 = 1
	CategoryReject    uint8 = 2
	CategorySvcReject uint8 = 3
)

// Register fields (reg0) and marks.
const (
	SourceTunnel  = 1
	SourceGateway = 2
	SourcePod     = 3
	DestTunnel    = 1
	DestGateway   = 2
	DestUplink    = 4 // reg0[4..7], BridgingMode
	SourceUplink  = 4 // reg0[0..3], BridgingMode
	SourceBridge  = 5 // reg0[0..3], BridgingMode: from the host interface

	RewriteMACBit    = 9
	APDenyBit        = 10
	RemoteSNATBit    = 19
	OutputToPortMode = 1 // reg0[21..22]

	ServiceCTMark  = 0x10
	ConnSNATCTMark = 0x20
	HairpinCTMark  = 0x40

	CtZone      = 65520
	CtZoneV6    = 65510
	SNATCtZone  = 65521
	SNATCtZone6 = 65511

	SvcNoEndpointBit   = 19 // reg4
	NodePortAddressBit = 20 // reg4: the destination is one of the Node's NodePort addresses
	// FlexibleIPAMBit (reg4) marks packets from a local AntreaIPAM Pod.
	// The reference uses reg4[20], which this model gives the NodePort
	// mark, so the model takes the next free bit.
	FlexibleIPAMBit = 21
	// VLANReg[0..11] holds the VLAN ID of the packet's IPPool (BridgingMode),
	// reg8 as in the reference.
	VLANReg = 8

	// AffinityPriority is the priority of the flows a Service with
	// ClientIP session affinity learns into SessionAffinity.
	AffinityPriority = 200
)

// Names of the modelled tables, in pipeline order.
const (
	TPipelineRootClassifier    = "PipelineRootClassifier"
	TClassifier                = "Classifier"
	TSpoofGuard                = "SpoofGuard"
	TUnSNAT                    = "UnSNAT"
	TConntrackZone             = "ConntrackZone"
	TConntrackState            = "ConntrackState"
	TPreRoutingClassifier      = "PreRoutingClassifier"
	TNodePortMark              = "NodePortMark"
	TSessionAffinity           = "SessionAffinity"
	TServiceLB                 = "ServiceLB"
	TEndpointDNAT              = "EndpointDNAT"
	TAntreaPolicyEgressRule    = "AntreaPolicyEgressRule"
	TEgressRule                = "EgressRule"
	TEgressDefaultRule         = "EgressDefaultRule"
	TEgressMetric              = "EgressMetric"
	TL3Forwarding              = "L3Forwarding"
	TEgressMark                = "EgressMark"
	TL3DecTTL                  = "L3DecTTL"
	TSNATMark                  = "SNATMark"
	TSNAT                      = "SNAT"
	TL2ForwardingCalc          = "L2ForwardingCalc"
	TIngressSecurityClassifier = "IngressSecurityClassifier"
	TAntreaPolicyIngressRule   = "AntreaPolicyIngressRule"
	TIngressRule               = "IngressRule"
	TIngressDefaultRule        = "IngressDefaultRule"
	TIngressMetric             = "IngressMetric"
	TConntrackCommit           = "ConntrackCommit"
	TVLAN                      = "VLAN" // BridgingMode only
	TOutput                    = "Output"
)

// Tables is the pipeline order.
var tableOrder = []string{
	TPipelineRootClassifier, TClassifier, TSpoofGuard, TUnSNAT, TConntrackZone, TConntrackState,
	TPreRoutingClassifier, TNodePortMark, TSessionAffinity, TServiceLB, TEndpointDNAT, TAntreaPolicyEgressRule, TEgressRule,
	TEgressDefaultRule, TEgressMetric, TL3Forwarding, TEgressMark, TL3DecTTL, TSNATMark, TSNAT,
	TL2ForwardingCalc, TIngressSecurityClassifier, TAntreaPolicyIngressRule, TIngressRule,
	TIngressDefaultRule, TIngressMetric, TConntrackCommit, TVLAN, TOutput,
}

// tables is the pipeline order of this configuration: NodePortMark exists
// only with proxyAll, VLAN only with the bridging mode, as in Antrea.
func (c Config) tables() []string {
	var out []string
	for _, t := range tableOrder {
		if (t != TNodePortMark || c.ProxyAll) && (t != TVLAN || c.BridgingMode) {
			out = append(out, t)
		}
	}
	return out
}

// postCommit is the table after ConntrackCommit: the first of the output
// stage.
func (c Config) postCommit() string {
	if c.BridgingMode {
		return TVLAN
	}
	return TOutput
}

// RuleRef names the policy rule behind a conjunction ID.
type RuleRef struct {
	PolicyType string // K8sNetworkPolicy, AntreaNetworkPolicy, AntreaClusterNetworkPolicy
	Namespace  string
	Name       string
	Rule       string
	Action     string // Allow, Drop, Reject, Pass
}

// PolicyString is the observation's networkPolicy value: "<Type>:<name>"
// for cluster-scoped types, "<Type>:<ns>/<name>" otherwise.
func (r RuleRef) PolicyString() string {
	if r.PolicyType == crd.AntreaClusterPolicyType || r.PolicyType == "K8sClusterNetworkPolicy" {
		return r.PolicyType + ":" + r.Name
	}
	return r.PolicyType + ":" + r.Namespace + "/" + r.Name
}

// NodeModel is one Node's bridge and the agent-side facts the Traceflow
// agent reads when it interprets a packet-in.
type NodeModel struct {
	Node       *cluster.Node
	Bridge     *datapath.Bridge
	GatewayIPs []netip.Addr
	GatewayMAC datapath.MAC
	PodPort    map[string]uint32 // "ns/name" -> ofport
	PortPod    map[uint32]*cluster.Pod
	// MarkIP maps an Egress SNAT mark to its local Egress IP: the agent's
	// own table, used to name the IP of tunnelled Egress traffic.
	MarkIP map[uint32]netip.Addr
}

// GatewayIP returns the gateway address of one family.
func (n *NodeModel) GatewayIP(v6 bool) (netip.Addr, bool) {
	for _, ip := range n.GatewayIPs {
		if ip.Is6() == v6 {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// Model is the whole modelled datapath.
type Model struct {
	Config Config
	State  *cluster.State
	Nodes  map[string]*NodeModel
	Rules  map[uint32]RuleRef

	isolation map[isolationKey]RuleRef
}

// Isolation names the Kubernetes NetworkPolicy whose isolation drops a
// Pod's traffic in one direction when no rule allows it (the drop of the
// EgressDefaultRule or IngressDefaultRule table): the first such policy in
// namespace/name order, with an empty rule name and the action Drop. ok is
// false when no Kubernetes NetworkPolicy isolates the Pod that way.
func (m *Model) Isolation(p *cluster.Pod, ingress bool) (RuleRef, bool) {
	r, ok := m.isolation[isolationKey{p, ingress}]
	return r, ok
}

// PodMAC is the deterministic MAC of a Pod interface.
func PodMAC(p *cluster.Pod) datapath.MAC {
	if ip, ok := p.IP(false); ok {
		b := ip.As4()
		return datapath.MAC{0x0a, 0x58, b[0], b[1], b[2], b[3]}
	}
	h := sha256.Sum256([]byte(p.Key()))
	return datapath.MAC{0x0a, 0x58, h[0], h[1], h[2], h[3]}
}

func gatewayMAC(node string) datapath.MAC {
	h := sha256.Sum256([]byte(node))
	return datapath.MAC{0x0e, h[0], h[1], h[2], h[3], h[4]}
}

// GlobalVirtualMAC is the destination MAC of tunnelled packets.
var GlobalVirtualMAC = datapath.MAC{0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}

// Build generates every Node's bridge. Problems are warnings about state
// the mode cannot model (Egress in a direct-routing mode, say).
func Build(ctx context.Context, st *cluster.State, cfg Config) (*Model, cluster.Problems, error) {
	if cfg.TrafficMode == "" {
		cfg.TrafficMode = Encap
	}
	if cfg.TunnelType == "" {
		cfg.TunnelType = datapath.Geneve
	}
	if cfg.Encryption == "" {
		cfg.Encryption = EncryptionNone
	}
	if cfg.WireGuard() && cfg.TrafficMode != Encap {
		// The reference's agent refuses to start with this combination.
		return nil, nil, fmt.Errorf("WireGuard is not applicable to the %s mode (only to encap)", cfg.TrafficMode)
	}
	if cfg.BridgingMode && cfg.TrafficMode != NoEncap {
		// As the reference's agent, which refuses to start.
		return nil, nil, fmt.Errorf("bridging mode requires the noEncap traffic mode, not %s", cfg.TrafficMode)
	}
	m := &Model{Config: cfg, State: st, Nodes: map[string]*NodeModel{}, Rules: map[uint32]RuleRef{}}
	var probs cluster.Problems
	if !cfg.TrafficMode.Encapsulates() {
		for _, e := range st.Egresses {
			probs = append(probs, cluster.Problem{Severity: cluster.Warning, Object: "Egress " + e.Name,
				Message: fmt.Sprintf("Egress works only in encap or hybrid mode; ignored in %s mode", cfg.TrafficMode)})
		}
	}
	probs = append(probs, flexibleIPAMWarnings(st, cfg)...)
	for _, n := range st.Nodes {
		nm := &NodeModel{Node: n, Bridge: datapath.NewBridge(n.Name, cfg.tables()), GatewayMAC: gatewayMAC(n.Name),
			PodPort: map[string]uint32{}, PortPod: map[uint32]*cluster.Pod{}, MarkIP: map[uint32]netip.Addr{}}
		for _, c := range n.PodCIDRs {
			nm.GatewayIPs = append(nm.GatewayIPs, c.Addr().Next())
		}
		port := firstPod
		for _, p := range st.PodsOnNode(n.Name) {
			nm.PodPort[p.Key()], nm.PortPod[port] = port, p
			port++
		}
		m.Nodes[n.Name] = nm
	}
	// Marks: one per local Egress IP, in address order.
	for _, nm := range m.Nodes {
		var ips []netip.Addr
		seen := map[netip.Addr]bool{}
		for _, e := range st.Egresses {
			if ip, node, ok := cluster.EgressAssignment(e); ok && node == nm.Node.Name && !seen[ip] {
				seen[ip] = true
				ips = append(ips, ip)
			}
		}
		sort.Slice(ips, func(i, j int) bool { return ips[i].Less(ips[j]) })
		for i, ip := range ips {
			if i == 255 {
				probs = append(probs, cluster.Problem{Severity: cluster.Warning, Object: "Node " + nm.Node.Name,
					Message: "more than 255 Egress IPs; the rest get no mark"})
				break
			}
			nm.MarkIP[uint32(i+1)] = ip
		}
	}
	pol, err := compilePolicies(st, m.Rules)
	if err != nil {
		return nil, probs, err
	}
	m.isolation = pol.isolation
	for _, name := range sortedNodeNames(m) {
		if err := ctx.Err(); err != nil {
			return nil, probs, err
		}
		g := &gen{m: m, nm: m.Nodes[name], pol: pol}
		if err := g.build(); err != nil {
			return nil, probs, fmt.Errorf("node %s: %w", name, err)
		}
	}
	return m, probs, nil
}

// flexibleIPAMWarnings flags Pods whose IPv4 address lies outside their
// Node's PodCIDRs and that the model does not trace as AntreaIPAM Pods
// (BridgingMode off, or no known IPPool holds the address): they get the
// per-Node IPAM path instead. With BridgingMode the reference, too, takes
// any such Pod for an AntreaIPAM one; without it, it has no FlexibleIPAM
// flows at all.
func flexibleIPAMWarnings(st *cluster.State, cfg Config) cluster.Problems {
	var probs cluster.Problems
	for _, p := range st.Pods {
		n := st.Node(p.Node)
		if p.HostNetwork || n == nil || len(n.PodCIDRs) == 0 {
			continue
		}
		for _, ip := range p.IPs {
			if inPodCIDRs(n, ip) {
				continue
			}
			var msg string
			switch {
			case cfg.BridgingMode && p.IPPool != nil:
				continue // modelled
			case cfg.BridgingMode:
				msg = fmt.Sprintf("IP %s is outside Node %s's PodCIDRs and in no known IPPool the Pod or its Namespace names: "+
					"not modelled as a FlexibleIPAM Pod; traced as a per-Node IPAM Pod", ip, n.Name)
			case p.IPPool != nil:
				msg = fmt.Sprintf("IP %s is from IPPool %s, outside Node %s's PodCIDRs: without --enable-bridging-mode "+
					"(the agents' enableBridgingMode) not a FlexibleIPAM Pod; traced as a per-Node IPAM Pod", ip, p.IPPool.Name, n.Name)
			default:
				msg = fmt.Sprintf("IP %s is outside Node %s's PodCIDRs (an AntreaIPAM/FlexibleIPAM Pod?): "+
					"without --enable-bridging-mode and its IPPool traced as a per-Node IPAM Pod", ip, n.Name)
			}
			probs = append(probs, cluster.Problem{Severity: cluster.Warning, Object: "Pod " + p.Key(), Message: msg})
			break
		}
	}
	return probs
}

func inPodCIDRs(n *cluster.Node, ip netip.Addr) bool {
	for _, c := range n.PodCIDRs {
		if c.Contains(ip) {
			return true
		}
	}
	return false
}

// AntreaIPAM reports whether p is traced as an AntreaIPAM Pod: with
// BridgingMode, a Pod whose IPv4 address is from a known IPPool and
// outside its Node's PodCIDRs (the reference decides on the PodCIDR
// alone, and only for IPv4).
func (m *Model) AntreaIPAM(p *cluster.Pod) bool {
	if !m.Config.BridgingMode || p == nil || p.IPPool == nil || p.HostNetwork {
		return false
	}
	n := m.State.Node(p.Node)
	ip, ok := p.IP(false)
	return n != nil && ok && !inPodCIDRs(n, ip)
}

// VLAN is the VLAN ID of an AntreaIPAM Pod's IPPool, 0 for other Pods.
func (m *Model) VLAN(p *cluster.Pod) uint16 {
	if m.AntreaIPAM(p) {
		return p.IPPool.VLAN
	}
	return 0
}

// UplinkMAC is the deterministic MAC of a Node's uplink (with
// BridgingMode, also the host interface's).
func UplinkMAC(node string) datapath.MAC {
	h := sha256.Sum256([]byte("uplink/" + node))
	return datapath.MAC{0x02, h[0], h[1], h[2], h[3], h[4]}
}

func sortedNodeNames(m *Model) []string {
	names := make([]string, 0, len(m.Nodes))
	for n := range m.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// MarkOf returns the mark of a local Egress IP on a Node (0 if none).
func (n *NodeModel) MarkOf(ip netip.Addr) uint32 {
	for mark, e := range n.MarkIP {
		if e == ip {
			return mark
		}
	}
	return 0
}

// OwnerOfTunnelIP returns the Node a tunnel to ip reaches: the Node
// holding it as an Egress IP, else the Node with that transport address.
func (m *Model) OwnerOfTunnelIP(ip netip.Addr) *NodeModel {
	for _, nm := range m.Nodes {
		if nm.MarkOf(ip) != 0 {
			return nm
		}
	}
	if n := m.State.NodeByTransportIP(ip); n != nil {
		return m.Nodes[n.Name]
	}
	return nil
}

// PeerNodeIPForPodIP is the transport address, of ip's family, of the
// Node other than nm whose PodCIDR holds ip: what the reference's agent
// reports as tunnelDstIP for WireGuard traffic. ok is false when ip is in
// no other Node's PodCIDR or that Node has no address of ip's family.
func (m *Model) PeerNodeIPForPodIP(nm *NodeModel, ip netip.Addr) (netip.Addr, bool) {
	n := m.State.NodeForPodIP(ip)
	if n == nil || n.Name == nm.Node.Name {
		return netip.Addr{}, false
	}
	if ip.Is6() {
		return n.TransportV6, n.TransportV6.IsValid()
	}
	return n.TransportIP, n.TransportIP.Is4()
}

// InAnyPodCIDR reports whether ip is inside some Node's PodCIDR.
func (m *Model) InAnyPodCIDR(ip netip.Addr) bool { return m.State.NodeForPodIP(ip) != nil }
