package pipeline

import (
	"net/netip"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
)

// gen builds one Node's flows.
type gen struct {
	m   *Model
	nm  *NodeModel
	pol *compiledPolicies
	err error
}

type (
	M = datapath.Match
	A = datapath.Action
)

func (g *gen) add(table string, prio int, m M, acts ...A) {
	if g.err != nil {
		return
	}
	g.err = g.nm.Bridge.Add(&datapath.Flow{Table: table, Priority: prio, Match: m, Actions: acts})
}

func reg0(lo, hi uint, v uint32) datapath.LoadReg {
	return datapath.LoadReg{Reg: 0, Lo: lo, Hi: hi, Value: v}
}

func reg0Match(lo, hi uint, v uint32) datapath.RegMatch {
	mask := uint32((uint64(1)<<(hi-lo+1) - 1) << lo)
	return datapath.RegMatch{Reg: 0, Masked: datapath.Masked{Value: v << lo, Mask: mask}}
}

func goTo(t string) A { return datapath.GotoTable{Table: t} }

var families = []uint16{datapath.EthIPv4, datapath.EthIPv6}

func host(ip netip.Addr) netip.Prefix { return netip.PrefixFrom(ip, ip.BitLen()) }

func ethOf(ip netip.Addr) uint16 {
	if ip.Is6() {
		return datapath.EthIPv6
	}
	return datapath.EthIPv4
}

func ctZone(eth uint16) uint16 {
	if eth == datapath.EthIPv6 {
		return CtZoneV6
	}
	return CtZone
}

func snatZone(eth uint16) uint16 {
	if eth == datapath.EthIPv6 {
		return SNATCtZone6
	}
	return SNATCtZone
}

// tagged adds a flow matching the Traceflow tag in both IP families.
func (g *gen) tagged(table string, prio int, m M, acts ...A) {
	if g.m.Config.Tag == 0 {
		return
	}
	for _, eth := range families {
		mm := m
		mm.EthType, mm.HasDSCP, mm.DSCP = eth, true, g.m.Config.Tag
		if mm.NwDst.IsValid() && ethOf(mm.NwDst.Addr()) != eth {
			continue
		}
		g.add(table, prio, mm, acts...)
	}
}

func (g *gen) build() error {
	g.classify()
	g.conntrack()
	g.serviceLB()
	g.policies()
	g.l3Forwarding()
	g.egressMark()
	g.postRouting()
	g.l2AndIngress()
	g.output()
	return g.err
}

func (g *gen) localPods() []*cluster.Pod { return g.m.State.PodsOnNode(g.nm.Node.Name) }

func (g *gen) port(p *cluster.Pod) uint32 { return g.nm.PodPort[p.Key()] }

func (g *gen) classify() {
	for _, eth := range families {
		g.add(TPipelineRootClassifier, 200, M{EthType: eth}, goTo(TClassifier))
	}
	g.add(TPipelineRootClassifier, 0, M{}, datapath.Drop{})

	if g.m.Config.TrafficMode.Encapsulates() {
		g.add(TClassifier, 200, M{InPort: TunnelPort},
			reg0(0, 3, SourceTunnel), reg0(RewriteMACBit, RewriteMACBit, 1), goTo(TUnSNAT))
	}
	g.add(TClassifier, 200, M{InPort: GatewayPort}, reg0(0, 3, SourceGateway), goTo(TSpoofGuard))
	if g.m.Config.BridgingMode {
		// The host's own traffic crosses the bridge between the uplink
		// and the host interface that took over the uplink's address.
		g.add(TClassifier, 200, M{InPort: UplinkPort}, datapath.OutputPort{Port: HostPort})
		g.add(TClassifier, 200, M{InPort: HostPort}, datapath.OutputPort{Port: UplinkPort})
		// What the underlay sends an AntreaIPAM Pod comes in by the uplink
		// with its pool's tag (none for VLAN 0), or, untagged, from the
		// host; it joins the pipeline at conntrack.
		for _, p := range g.localPods() {
			if !g.m.AntreaIPAM(p) {
				continue
			}
			vid := g.m.VLAN(p)
			tci := datapath.Masked{Value: 0, Mask: 0x1fff}
			if vid != 0 {
				tci.Value = 0x1000 | uint32(vid)
			}
			for _, eth := range families {
				g.add(TClassifier, 210, M{EthType: eth, InPort: UplinkPort, EthDst: PodMAC(p), VLANTCI: tci},
					reg0(0, 3, SourceUplink), datapath.LoadReg{Reg: VLANReg, Lo: 0, Hi: 11, Value: uint32(vid)}, goTo(TUnSNAT))
				if vid == 0 {
					g.add(TClassifier, 210, M{EthType: eth, InPort: HostPort, EthDst: PodMAC(p), VLANTCI: tci},
						reg0(0, 3, SourceBridge), goTo(TUnSNAT))
				}
			}
		}
	}
	for _, p := range g.localPods() {
		acts := []A{reg0(0, 3, SourcePod)}
		if g.m.AntreaIPAM(p) {
			// An AntreaIPAM Pod's gateway is the IPPool's, beyond the
			// uplink: its packets are marked, and MACs rewritten when routed.
			acts = append(acts, datapath.LoadReg{Reg: 4, Lo: FlexibleIPAMBit, Hi: FlexibleIPAMBit, Value: 1},
				reg0(RewriteMACBit, RewriteMACBit, 1))
		}
		g.add(TClassifier, 190, M{InPort: g.port(p)}, append(acts, goTo(TSpoofGuard))...)
	}
	g.add(TClassifier, 0, M{}, datapath.Drop{})

	g.add(TSpoofGuard, 200, M{InPort: GatewayPort}, goTo(TUnSNAT))
	for _, p := range g.localPods() {
		for _, ip := range p.IPs {
			var acts []A
			if g.m.Config.BridgingMode {
				// Every Pod's packets carry their VLAN ID (0: untagged).
				acts = append(acts, datapath.LoadReg{Reg: VLANReg, Lo: 0, Hi: 11, Value: uint32(g.m.VLAN(p))})
			}
			g.add(TSpoofGuard, 200, M{EthType: ethOf(ip), InPort: g.port(p), EthSrc: PodMAC(p), NwSrc: host(ip)}, append(acts, goTo(TUnSNAT))...)
		}
	}
	g.add(TSpoofGuard, 0, M{}, datapath.Drop{})
}

func (g *gen) conntrack() {
	hairpin := []netip.Addr{netip.MustParseAddr(crd.HairpinVirtualIPv4), netip.MustParseAddr(crd.HairpinVirtualIPv6)}
	for _, ip := range append(hairpin, g.nm.GatewayIPs...) {
		g.add(TUnSNAT, 200, M{EthType: ethOf(ip), NwDst: host(ip)},
			datapath.Ct{Zone: snatZone(ethOf(ip)), Table: TConntrackZone, NAT: true})
	}
	g.add(TUnSNAT, 0, M{}, goTo(TConntrackZone))

	for _, eth := range families {
		g.add(TConntrackZone, 200, M{EthType: eth}, datapath.Ct{Zone: ctZone(eth), Table: TConntrackState, NAT: true})
	}
	// A traced packet must run the whole pipeline, Service LB included,
	// and is never a reply.
	g.tagged(TConntrackState, 192, M{CtState: datapath.CtStateMatch{Set: datapath.CtRpl | datapath.CtTrk}}, datapath.Drop{})
	g.tagged(TConntrackState, 191, M{}, goTo(TPreRoutingClassifier))
	g.add(TConntrackState, 190, M{CtState: datapath.CtStateMatch{Set: datapath.CtInv | datapath.CtTrk}}, datapath.Drop{})
	g.add(TConntrackState, 190, M{CtState: datapath.CtStateMatch{Set: datapath.CtTrk, Clear: datapath.CtNew}}, goTo(TEgressMetric))
	g.add(TConntrackState, 0, M{}, goTo(TPreRoutingClassifier))
	// PreRoutingClassifier runs the three preRouting tables in turn with
	// resubmits: the flows SessionAffinity learns can only load
	// registers, so the pipeline must come back from that table.
	var pre []A
	if g.m.Config.ProxyAll {
		pre = append(pre, datapath.Resubmit{Table: TNodePortMark})
		for _, ip := range []netip.Addr{g.nm.Node.TransportIP, g.nm.Node.TransportV6} {
			if ip.IsValid() {
				g.add(TNodePortMark, 200, M{EthType: ethOf(ip), NwDst: host(ip)},
					datapath.LoadReg{Reg: 4, Lo: NodePortAddressBit, Hi: NodePortAddressBit, Value: 1})
			}
		}
	}
	g.add(TPreRoutingClassifier, 0, M{}, append(pre, datapath.Resubmit{Table: TSessionAffinity}, datapath.Resubmit{Table: TServiceLB})...)
	// Without a learned affinity the endpoint is still to be selected.
	g.add(TSessionAffinity, 0, M{}, datapath.LoadReg{Reg: 4, Lo: 16, Hi: 18, Value: datapath.EndpointToSelect})
}

func protoOf(s string) uint8 {
	n, _ := protoNumber(s)
	return n
}

// serviceLB load-balances every Service address (ClusterIPs, externalIPs,
// LoadBalancer ingress IPs) and port through a select group whose buckets
// pick an endpoint for EndpointDNAT.
func (g *gen) serviceLB() {
	lb := &serviceFlows{g: g, nextGroup: 1, dnat: map[string]bool{}}
	for _, svc := range g.m.State.Services {
		for _, ip := range svc.ClusterIPs {
			// internalTrafficPolicy governs the ClusterIPs only.
			lb.frontend(svc, ip.Is6(), svc.InternalLocal, addressMatch(ip))
		}
		// A traced packet comes from a Pod: externalTrafficPolicy, which
		// governs traffic from outside the cluster, does not apply to it.
		for _, ip := range append(append([]netip.Addr(nil), svc.ExternalIPs...), svc.LoadBalancerIPs...) {
			lb.frontend(svc, ip.Is6(), false, addressMatch(ip))
		}
		if g.m.Config.ProxyAll {
			for _, v6 := range []bool{false, true} {
				lb.frontend(svc, v6, false, nodePortMatch(v6))
			}
		}
	}
	g.add(TServiceLB, 0, M{}, goTo(TEndpointDNAT))
	g.add(TEndpointDNAT, 190, M{Regs: []datapath.RegMatch{{Reg: 4, Masked: datapath.Masked{Value: 1 << SvcNoEndpointBit, Mask: 1 << SvcNoEndpointBit}}}},
		datapath.Controller{Category: CategorySvcReject})
	g.add(TEndpointDNAT, 0, M{}, goTo(TAntreaPolicyEgressRule))
}

// serviceFlows numbers the groups and shares EndpointDNAT flows.
type serviceFlows struct {
	g         *gen
	nextGroup uint32
	dnat      map[string]bool // endpoint|proto|port with a DNAT flow
}

// endpointState matches reg4[16..18] (the endpoint selection state),
// and with nodePort also the NodePortMark bit.
func endpointState(state uint32, nodePort bool) datapath.RegMatch {
	m := datapath.Masked{Value: state << 16, Mask: 0x70000}
	if nodePort {
		m.Value |= 1 << NodePortAddressBit
		m.Mask |= 1 << NodePortAddressBit
	}
	return datapath.RegMatch{Reg: 4, Masked: m}
}

// A frontend's match with the selection state it requires.
type frontendMatch func(sp cluster.ServicePort, state uint32) (M, bool)

// addressMatch matches a Service address and port.
func addressMatch(ip netip.Addr) frontendMatch {
	return func(sp cluster.ServicePort, state uint32) (M, bool) {
		return M{EthType: ethOf(ip), Regs: []datapath.RegMatch{endpointState(state, false)}, NwDst: host(ip),
			TpDst: datapath.Masked{Value: uint32(sp.Port), Mask: 0xffff}}, true
	}
}

// nodePortMatch matches a nodePort on an address NodePortMark marked.
func nodePortMatch(v6 bool) frontendMatch {
	eth := datapath.EthIPv4
	if v6 {
		eth = datapath.EthIPv6
	}
	return func(sp cluster.ServicePort, state uint32) (M, bool) {
		return M{EthType: eth, Regs: []datapath.RegMatch{endpointState(state, true)},
			TpDst: datapath.Masked{Value: uint32(sp.NodePort), Mask: 0xffff}}, sp.NodePort != 0
	}
}

// frontend adds the ServiceLB flows of one Service frontend (an address,
// or the nodePorts), one per port that match gives; localOnly keeps only
// endpoints on this Node.
//
// A Service with ClientIP session affinity selects through buckets that
// come back to ServiceLB in the EndpointToLearn state, where a flow
// learns the client's choice into SessionAffinity before DNAT; the next
// packet of that client (for the affinity's timeout) finds the learned
// flow in SessionAffinity and skips the group.
func (lb *serviceFlows) frontend(svc *cluster.Service, v6, localOnly bool, match frontendMatch) {
	g := lb.g
	affinity := svc.AffinityTimeout > 0
	for _, sp := range svc.Ports {
		proto := protoOf(string(sp.Protocol))
		m, ok := match(sp, datapath.EndpointToSelect)
		if proto == 0 || !ok {
			continue
		}
		m.IPProto = proto
		var buckets [][]A
		for _, ep := range svc.Endpoints {
			if ep.IP.Is6() != v6 || (localOnly && ep.Node != g.nm.Node.Name) {
				continue
			}
			tport, ok := ep.Ports[sp.Name]
			if !ok {
				continue
			}
			next := TEndpointDNAT
			if affinity {
				next = TServiceLB
			}
			buckets = append(buckets, []A{datapath.SetEndpoint{IP: ep.IP, Port: tport, Learn: affinity}, datapath.Resubmit{Table: next}})
			key := ep.IP.String() + "|" + string(rune(proto)) + "|" + string(rune(tport))
			if !lb.dnat[key] {
				lb.dnat[key] = true
				em := M{EthType: ethOf(ep.IP), IPProto: proto}
				datapath.EndpointMatch(&em, ep.IP, tport)
				g.add(TEndpointDNAT, 200, em, datapath.Ct{Commit: true, Zone: ctZone(ethOf(ep.IP)), Table: TAntreaPolicyEgressRule,
					Xlate: &datapath.NAT{IP: ep.IP, Port: tport}, Mark: datapath.Masked{Value: ServiceCTMark, Mask: ServiceCTMark}})
			}
		}
		if len(buckets) == 0 {
			// No endpoint: the agent answers with a reject, which is
			// not a Traceflow packet-in.
			g.add(TServiceLB, 200, m, datapath.LoadReg{Reg: 4, Lo: SvcNoEndpointBit, Hi: SvcNoEndpointBit, Value: 1}, goTo(TEndpointDNAT))
			continue
		}
		if g.err == nil {
			g.err = g.nm.Bridge.AddGroup(&datapath.Group{ID: lb.nextGroup, Buckets: buckets})
		}
		g.add(TServiceLB, 200, m, datapath.GroupAction{ID: lb.nextGroup})
		lb.nextGroup++
		if affinity {
			lm, _ := match(sp, datapath.EndpointToLearn)
			lm.IPProto = proto
			g.add(TServiceLB, 190, lm,
				datapath.Learn{Table: TSessionAffinity, Priority: AffinityPriority, HardTimeout: svc.AffinityTimeout, EthType: m.EthType, Proto: proto},
				datapath.LoadReg{Reg: 4, Lo: 16, Hi: 18, Value: datapath.EndpointSelected}, goTo(TEndpointDNAT))
		}
	}
}

func (g *gen) l3Forwarding() {
	gw := g.nm.GatewayMAC
	for _, ip := range g.nm.GatewayIPs {
		g.add(TL3Forwarding, 210, M{EthType: ethOf(ip), NwDst: host(ip)},
			datapath.SetEthDst{MAC: gw}, reg0(4, 7, DestGateway), goTo(TL3DecTTL))
	}
	bridging := g.m.Config.BridgingMode
	vlan := func(id uint16) []datapath.RegMatch {
		return []datapath.RegMatch{{Reg: VLANReg, Masked: datapath.Masked{Value: uint32(id), Mask: 0xfff}}}
	}
	for _, p := range g.localPods() {
		for _, ip := range p.IPs {
			m := M{EthType: ethOf(ip), NwDst: host(ip)}
			if g.m.AntreaIPAM(p) {
				// Reached only from its own VLAN, and bridged: the
				// source MAC is left alone.
				m.Regs = vlan(g.m.VLAN(p))
				g.add(TL3Forwarding, 200, m, datapath.SetEthDst{MAC: PodMAC(p)}, goTo(TL3DecTTL))
				continue
			}
			if bridging {
				m.Regs = vlan(0) // untagged traffic only
			}
			g.add(TL3Forwarding, 200, m, datapath.SetEthSrc{MAC: gw}, datapath.SetEthDst{MAC: PodMAC(p)}, goTo(TL3DecTTL))
		}
	}
	flexible := datapath.RegMatch{Reg: 4, Masked: datapath.Masked{Value: 1 << FlexibleIPAMBit, Mask: 1 << FlexibleIPAMBit}}
	notFlexible := datapath.RegMatch{Reg: 4, Masked: datapath.Masked{Value: 0, Mask: 1 << FlexibleIPAMBit}}
	if bridging {
		// An untagged AntreaIPAM Pod reaches its own Node through the
		// host interface, which took over the uplink's MAC.
		for _, ip := range []netip.Addr{g.nm.Node.TransportIP, g.nm.Node.TransportV6} {
			if ip.IsValid() {
				g.add(TL3Forwarding, 210, M{EthType: ethOf(ip), NwDst: host(ip), Regs: append(vlan(0), flexible)},
					datapath.SetEthDst{MAC: UplinkMAC(g.nm.Node.Name)}, goTo(TL2ForwardingCalc))
			}
		}
	}
	mode := g.m.Config.TrafficMode
	for _, peer := range g.m.State.Nodes {
		if peer.Name == g.nm.Node.Name {
			continue
		}
		for _, cidr := range peer.PodCIDRs {
			m := M{EthType: ethOf(cidr.Addr()), NwDst: cidr}
			if g.m.Config.tunnelsToPeer(g.nm.Node.TransportIP, peer.TransportIP) {
				dst := peer.TransportIP
				if cidr.Addr().Is6() && peer.TransportV6.IsValid() {
					dst = peer.TransportV6
				}
				g.add(TL3Forwarding, 200, m, datapath.SetEthSrc{MAC: gw}, datapath.SetEthDst{MAC: GlobalVirtualMAC},
					datapath.SetTunDst{IP: dst}, reg0(4, 7, DestTunnel), goTo(TL3DecTTL))
			} else {
				// Direct routing: the host routes it to the peer.
				if bridging {
					// AntreaIPAM Pods' traffic is bridged instead: out of
					// the uplink, to the peer's gateway MAC.
					fm := m
					fm.Regs = append(vlan(0), flexible)
					g.add(TL3Forwarding, 200, fm, datapath.SetEthDst{MAC: gatewayMAC(peer.Name)}, reg0(4, 7, DestUplink), goTo(TL3DecTTL))
					m.Regs = []datapath.RegMatch{notFlexible}
				}
				g.add(TL3Forwarding, 200, m, datapath.SetEthDst{MAC: gw}, reg0(4, 7, DestGateway), goTo(TL3DecTTL))
			}
		}
	}
	if mode.Encapsulates() {
		for _, eth := range families {
			g.add(TL3Forwarding, 190, M{CtState: datapath.CtStateMatch{Set: datapath.CtTrk, Clear: datapath.CtRpl}, EthType: eth,
				Regs: []datapath.RegMatch{reg0Match(0, 3, SourcePod)}}, goTo(TEgressMark))
			g.add(TL3Forwarding, 190, M{CtState: datapath.CtStateMatch{Set: datapath.CtTrk, Clear: datapath.CtRpl}, EthType: eth,
				Regs: []datapath.RegMatch{reg0Match(0, 3, SourceTunnel)}}, datapath.SetEthDst{MAC: gw}, goTo(TEgressMark))
		}
	}
	if bridging {
		// As the reference's miss flow: the destination MAC is left as
		// it is, so that a packet to a local Pod that no flow above
		// routes (from an AntreaIPAM Pod of another VLAN, say) is still
		// switched to it; the rest goes to the gateway.
		g.add(TL3Forwarding, 0, M{}, reg0(4, 7, DestGateway), goTo(TL2ForwardingCalc))
		return
	}
	g.add(TL3Forwarding, 0, M{}, datapath.SetEthDst{MAC: gw}, reg0(4, 7, DestGateway), goTo(TL3DecTTL))
}

// sameSubnet approximates "on the same Node subnet" for hybrid mode: Node
// objects carry no prefix length, so a /24 (IPv4) or /64 (IPv6) is assumed.
func sameSubnet(a, b netip.Addr) bool {
	bits := 24
	if a.Is6() {
		bits = 64
	}
	pa, err1 := a.Prefix(bits)
	pb, err2 := b.Prefix(bits)
	return err1 == nil && err2 == nil && pa == pb
}

func (g *gen) egressMark() {
	gw := g.nm.GatewayMAC
	toGW := []A{datapath.SetEthDst{MAC: gw}, reg0(4, 7, DestGateway), goTo(TL2ForwardingCalc)}
	if g.m.Config.TrafficMode.Encapsulates() {
		var skip []netip.Prefix
		for _, n := range g.m.State.Nodes {
			for _, ip := range []netip.Addr{n.TransportIP, n.TransportV6} {
				if ip.IsValid() {
					skip = append(skip, host(ip))
				}
			}
		}
		skip = append(skip, g.m.Config.ServiceCIDRs...)
		skip = append(skip, g.m.Config.EgressExceptCIDRs...)
		for _, p := range skip {
			g.add(TEgressMark, 210, M{EthType: ethOf(p.Addr()), NwDst: p}, toGW...)
		}
		for _, p := range g.localPods() {
			e := g.m.State.EffectiveEgress(p)
			if e == nil {
				continue
			}
			eip, node, ok := cluster.EgressAssignment(e)
			if !ok {
				continue // no effective IP: the packet takes the miss path
			}
			if _, ok := p.IP(eip.Is6()); !ok {
				continue
			}
			eth := ethOf(eip)
			if node == g.nm.Node.Name {
				mark := g.nm.MarkOf(eip)
				g.add(TEgressMark, 200, M{CtState: datapath.CtStateMatch{Set: datapath.CtTrk}, EthType: eth, InPort: g.port(p)},
					datapath.SetPktMark{Masked: datapath.Masked{Value: mark, Mask: 0xff}}, datapath.SetEthDst{MAC: gw},
					reg0(4, 7, DestGateway), goTo(TL2ForwardingCalc))
				continue
			}
			g.add(TEgressMark, 200, M{EthType: eth, InPort: g.port(p)},
				datapath.SetEthSrc{MAC: gw}, datapath.SetEthDst{MAC: GlobalVirtualMAC}, datapath.SetTunDst{IP: eip},
				reg0(4, 7, DestTunnel), reg0(RemoteSNATBit, RemoteSNATBit, 1), goTo(TL2ForwardingCalc))
		}
		for mark := uint32(1); mark <= uint32(len(g.nm.MarkIP)); mark++ {
			eip := g.nm.MarkIP[mark]
			g.add(TEgressMark, 200, M{CtState: datapath.CtStateMatch{Set: datapath.CtTrk}, EthType: ethOf(eip), TunDst: eip},
				datapath.SetPktMark{Masked: datapath.Masked{Value: mark, Mask: 0xff}}, datapath.SetEthDst{MAC: gw},
				reg0(4, 7, DestGateway), goTo(TL2ForwardingCalc))
		}
		for _, eth := range families {
			// New tunnel traffic that no Egress IP here accounts for.
			g.add(TEgressMark, 190, M{CtState: datapath.CtStateMatch{Set: datapath.CtNew | datapath.CtTrk}, EthType: eth,
				Regs: []datapath.RegMatch{reg0Match(0, 3, SourceTunnel)}}, datapath.Drop{})
		}
	}
	g.add(TEgressMark, 0, M{}, toGW...)
}

func (g *gen) postRouting() {
	for _, eth := range families {
		g.add(TL3DecTTL, 210, M{EthType: eth, Regs: []datapath.RegMatch{reg0Match(0, 3, SourceGateway)}}, goTo(TSNATMark))
		g.add(TL3DecTTL, 200, M{EthType: eth}, datapath.DecTTL{}, goTo(TSNATMark))
	}
	g.add(TL3DecTTL, 0, M{}, goTo(TSNATMark))
	// Hairpin: a Pod reaching itself through a Service.
	for _, p := range g.localPods() {
		for _, ip := range p.IPs {
			g.add(TSNATMark, 200, M{CtState: datapath.CtStateMatch{Set: datapath.CtNew | datapath.CtTrk},
				CtMark: datapath.Masked{Value: ServiceCTMark, Mask: ServiceCTMark}, EthType: ethOf(ip), NwSrc: host(ip), NwDst: host(ip)},
				datapath.Ct{Commit: true, Zone: ctZone(ethOf(ip)), Table: TSNAT,
					Mark: datapath.Masked{Value: ConnSNATCTMark | HairpinCTMark, Mask: ConnSNATCTMark | HairpinCTMark}})
		}
	}
	g.add(TSNATMark, 0, M{}, goTo(TSNAT))
	// Hairpin SNAT: a local Pod reaching itself through a Service gets
	// the Node's gateway IP as source; traffic that came in through the
	// gateway and goes back out of it gets the virtual Service IP.
	for _, eth := range families {
		virtual := netip.MustParseAddr(crd.HairpinVirtualIPv4)
		if eth == datapath.EthIPv6 {
			virtual = netip.MustParseAddr(crd.HairpinVirtualIPv6)
		}
		snat := func(source uint32, ip netip.Addr) {
			g.add(TSNAT, 200, M{CtState: datapath.CtStateMatch{Set: datapath.CtNew | datapath.CtTrk},
				CtMark: datapath.Masked{Value: HairpinCTMark, Mask: HairpinCTMark}, EthType: eth,
				Regs: []datapath.RegMatch{reg0Match(0, 3, source)}},
				datapath.Ct{Commit: true, Zone: snatZone(eth), Table: TL2ForwardingCalc, Xlate: &datapath.NAT{Src: true, IP: ip},
					Mark: datapath.Masked{Value: HairpinCTMark, Mask: HairpinCTMark}})
		}
		if gw, ok := g.nm.GatewayIP(eth == datapath.EthIPv6); ok {
			snat(SourcePod, gw)
		}
		snat(SourceGateway, virtual)
	}
	g.add(TSNAT, 0, M{}, goTo(TL2ForwardingCalc))
}

func (g *gen) l2AndIngress() {
	out := func(port uint32) []A {
		return []A{datapath.LoadReg{Reg: 1, Lo: 0, Hi: 31, Value: port}, reg0(21, 22, OutputToPortMode), goTo(TIngressSecurityClassifier)}
	}
	for _, p := range g.localPods() {
		g.add(TL2ForwardingCalc, 200, M{EthDst: PodMAC(p)}, out(g.port(p))...)
	}
	g.add(TL2ForwardingCalc, 200, M{EthDst: g.nm.GatewayMAC}, out(GatewayPort)...)
	if g.m.Config.TrafficMode.Encapsulates() {
		g.add(TL2ForwardingCalc, 200, M{EthDst: GlobalVirtualMAC}, out(TunnelPort)...)
	}
	if g.m.Config.BridgingMode {
		g.add(TL2ForwardingCalc, 200, M{EthDst: UplinkMAC(g.nm.Node.Name)},
			datapath.LoadReg{Reg: 1, Lo: 0, Hi: 31, Value: HostPort}, reg0(21, 22, OutputToPortMode), goTo(TConntrackCommit))
		// What an AntreaIPAM Pod sends to a MAC the bridge does not own
		// leaves through the uplink, past ingress policy.
		g.add(TL2ForwardingCalc, 190, M{Regs: []datapath.RegMatch{{Reg: 4, Masked: datapath.Masked{Value: 1 << FlexibleIPAMBit, Mask: 1 << FlexibleIPAMBit}}}},
			datapath.LoadReg{Reg: 1, Lo: 0, Hi: 31, Value: UplinkPort}, reg0(21, 22, OutputToPortMode), goTo(TConntrackCommit))
	}
	g.add(TL2ForwardingCalc, 0, M{}, goTo(TIngressSecurityClassifier))

	// Traffic leaving the Node (gateway, tunnel) skips ingress policy.
	g.add(TIngressSecurityClassifier, 210, M{CtMark: datapath.Masked{Value: HairpinCTMark, Mask: HairpinCTMark}}, goTo(TConntrackCommit))
	g.add(TIngressSecurityClassifier, 200, M{Regs: []datapath.RegMatch{reg0Match(4, 7, DestGateway)}}, goTo(TIngressMetric))
	g.add(TIngressSecurityClassifier, 200, M{Regs: []datapath.RegMatch{reg0Match(4, 7, DestTunnel)}}, goTo(TIngressMetric))
	if g.m.Config.BridgingMode {
		g.add(TIngressSecurityClassifier, 200, M{Regs: []datapath.RegMatch{reg0Match(4, 7, DestUplink)}}, goTo(TIngressMetric))
	}
	g.add(TIngressSecurityClassifier, 0, M{}, goTo(TAntreaPolicyIngressRule))

	for _, eth := range families {
		g.add(TConntrackCommit, 200, M{CtState: datapath.CtStateMatch{Set: datapath.CtNew | datapath.CtTrk},
			CtMark: datapath.Masked{Value: 0, Mask: ServiceCTMark}, EthType: eth},
			datapath.Ct{Commit: true, Zone: ctZone(eth), Table: g.m.Config.postCommit()})
	}
	g.add(TConntrackCommit, 0, M{}, goTo(g.m.Config.postCommit()))
	if g.m.Config.BridgingMode {
		// A VLAN Pod's packets leave by the uplink tagged with its pool's VLAN.
		for _, p := range g.localPods() {
			if vid := g.m.VLAN(p); vid != 0 {
				g.add(TVLAN, 50, M{InPort: g.port(p), Regs: []datapath.RegMatch{{Reg: 1, Masked: datapath.Exact(UplinkPort)}}},
					datapath.PushVLAN{VID: vid}, goTo(TOutput))
			}
		}
		// Tagged traffic from the uplink loses its tag on the way out.
		g.add(TVLAN, 50, M{InPort: UplinkPort, VLANTCI: datapath.Masked{Value: 0x1000, Mask: 0x1000}}, datapath.PopVLAN{}, goTo(TOutput))
		g.add(TVLAN, 0, M{}, goTo(TOutput))
	}
}

func (g *gen) output() {
	tf := datapath.Controller{Category: CategoryTraceflow}
	toPort := reg0Match(21, 22, OutputToPortMode)
	reg1 := func(p uint32) datapath.RegMatch { return datapath.RegMatch{Reg: 1, Masked: datapath.Exact(p)} }
	hairpin := datapath.Masked{Value: HairpinCTMark, Mask: HairpinCTMark}
	mode := g.m.Config.TrafficMode

	g.tagged(TOutput, 212, M{CtMark: hairpin}, tf)
	g.add(TOutput, 210, M{CtMark: hairpin}, datapath.OutputInPort{})
	if g.m.Config.BridgingMode {
		// Above the Traceflow flows, as upstream's (which has no Traceflow
		// flow for the host interface yet): a trace to the Node's own
		// address from an AntreaIPAM Pod gets no packet-in.
		g.add(TOutput, 210, M{EthType: datapath.EthIPv4, Regs: []datapath.RegMatch{toPort, reg1(HostPort)}}, datapath.OutputPort{Port: HostPort})
	}
	if mode.Encapsulates() {
		// The tunnel copy goes out too, tag kept, so the next Node traces it.
		g.tagged(TOutput, 203, M{Regs: []datapath.RegMatch{toPort, reg1(TunnelPort)}}, datapath.OutputReg{Reg: 1}, tf)
	}
	for _, ip := range g.nm.GatewayIPs {
		g.tagged(TOutput, 203, M{Regs: []datapath.RegMatch{toPort, reg1(GatewayPort)}, NwDst: host(ip)}, tf)
	}
	if mode == Encap && !g.m.Config.WireGuard() {
		g.tagged(TOutput, 202, M{Regs: []datapath.RegMatch{toPort, reg1(GatewayPort)}}, tf)
	} else {
		// Direct routing (WireGuard included): the host carries the packet
		// on to the peer Node.
		g.tagged(TOutput, 202, M{Regs: []datapath.RegMatch{toPort, reg1(GatewayPort)}}, datapath.OutputReg{Reg: 1}, tf)
	}
	// Below the gateway flow so the more specific one always wins.
	g.tagged(TOutput, 201, M{Regs: []datapath.RegMatch{toPort}}, tf)
	g.add(TOutput, 200, M{Regs: []datapath.RegMatch{toPort}}, datapath.OutputReg{Reg: 1})
	g.add(TOutput, 0, M{}, datapath.Drop{})
}
