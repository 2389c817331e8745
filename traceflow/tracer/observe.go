package tracer

import (
	"fmt"
	"net/netip"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
	"sluice/traceflow/pipeline"
)

// validCtIP reports whether a conntrack address is usable: OVS leaves it
// empty for ICMPv6, which shows up as an address in 0000::/8.
func validCtIP(ip netip.Addr) bool {
	if !ip.IsValid() || ip.IsUnspecified() {
		return false
	}
	if ip.Is6() {
		return ip.As16()[0] != 0
	}
	return true
}

// observe rebuilds a Node's observation list from its one packet-in, in
// the agent's fixed order (§2.2): not a log of the tables visited, but a
// reading of the headers and the metadata snapshot.
func observe(m *pipeline.Model, nm *pipeline.NodeModel, src *cluster.Pod, sender bool, pin *datapath.PacketIn) ([]crd.Observation, error) {
	md, pkt, table := &pin.Meta, &pin.Packet, pin.Table
	var obs []crd.Observation
	if sender {
		ip := pkt.Src
		if validCtIP(md.CtNwSrc) {
			ip = md.CtNwSrc
		}
		obs = append(obs, crd.Observation{Component: crd.ComponentSpoofGuard, Action: crd.ActionForwarded, SrcPodIP: ip.String()})
	} else {
		obs = append(obs, crd.Observation{Component: crd.ComponentForwarding, Action: crd.ActionReceived})
	}
	dnat := validCtIP(md.CtNwDst) && md.CtNwDst != pkt.Dst
	snat := validCtIP(md.CtNwSrc) && md.CtNwSrc != pkt.Src
	if dnat || snat {
		o := crd.Observation{Component: crd.ComponentLB, Action: crd.ActionForwarded, TranslatedDstIP: pkt.Dst.String()}
		if snat {
			o.TranslatedSrcIP = pkt.Src.String()
		}
		obs = append(obs, o)
	}
	policyObs := func(conj uint32, info string, dropTables ...string) {
		if conj == 0 {
			return
		}
		o := crd.Observation{Component: crd.ComponentNetworkPolicy, ComponentInfo: info, Action: crd.ActionForwarded}
		if r, ok := m.Rules[conj]; ok {
			o.NetworkPolicy, o.NetworkPolicyRule = r.PolicyString(), r.Rule
		}
		for _, t := range dropTables {
			if table == t {
				o.ComponentInfo, o.Action = table, crd.ActionDropped
			}
		}
		obs = append(obs, o)
	}
	policyObs(md.Regs[5], "EgressRule", pipeline.TEgressMetric, pipeline.TEgressDefaultRule)
	policyObs(md.Regs[6], "IngressRule", pipeline.TIngressMetric, pipeline.TIngressDefaultRule)

	switch table {
	case pipeline.TEgressMetric, pipeline.TIngressMetric:
		o := crd.Observation{Component: crd.ComponentNetworkPolicy, ComponentInfo: table, Action: crd.ActionDropped}
		if md.Regs[0]&(1<<pipeline.APDenyBit) != 0 && md.Regs[3] != 0 {
			if r, ok := m.Rules[md.Regs[3]]; ok {
				o.NetworkPolicy, o.NetworkPolicyRule = r.PolicyString(), r.Rule
				if r.Action == crd.RuleActionReject {
					o.Action = crd.ActionRejected
				}
			}
		}
		obs = append(obs, o)
	case pipeline.TEgressDefaultRule, pipeline.TIngressDefaultRule:
		obs = append(obs, crd.Observation{Component: crd.ComponentNetworkPolicy, ComponentInfo: table, Action: crd.ActionDropped})
	case pipeline.TOutput:
		out, err := outputObservations(m, nm, src, md, pkt)
		if err != nil {
			return nil, err
		}
		obs = append(obs, out...)
	}
	return obs, nil
}

func outputObservations(m *pipeline.Model, nm *pipeline.NodeModel, src *cluster.Pod, md *datapath.Metadata, pkt *datapath.Packet) ([]crd.Observation, error) {
	mode := m.Config.TrafficMode
	outPort := md.Regs[1]
	fwd := func(a crd.Action) crd.Observation {
		return crd.Observation{Component: crd.ComponentForwarding, ComponentInfo: "Output", Action: a}
	}
	gwIP, _ := nm.GatewayIP(pkt.IsV6())
	switch {
	case mode.Encapsulates() && outPort == pipeline.TunnelPort:
		var obs []crd.Observation
		if md.Regs[0]&(1<<pipeline.RemoteSNATBit) != 0 {
			e, err := effectiveEgress(m, src)
			if err != nil {
				return nil, err
			}
			ip, node, _ := cluster.EgressAssignment(e)
			obs = append(obs, crd.Observation{Component: crd.ComponentEgress, Action: crd.ActionForwardedToEgressNode,
				Egress: e.Name, EgressIP: ip.String(), EgressNode: node})
		}
		o := fwd(crd.ActionForwarded)
		o.TunnelDstIP = md.TunDst.String()
		return append(obs, o), nil
	case outPort == pipeline.GatewayPort && pkt.Dst == gwIP:
		return []crd.Observation{fwd(crd.ActionDelivered)}, nil
	case mode.Encapsulates() && outPort == pipeline.GatewayPort:
		var obs []crd.Observation
		mark := md.PktMark & 0xff
		if mark != 0 {
			o := crd.Observation{Component: crd.ComponentEgress, Action: crd.ActionMarkedForSNAT}
			if !md.TunDst.IsValid() {
				e, err := effectiveEgress(m, src)
				if err != nil {
					return nil, err
				}
				ip, node, _ := cluster.EgressAssignment(e)
				o.Egress, o.EgressIP, o.EgressNode = e.Name, ip.String(), node
			} else {
				ip, ok := nm.MarkIP[mark]
				if !ok {
					return nil, fmt.Errorf("no Egress IP for SNAT mark %d on Node %s", mark, nm.Node.Name)
				}
				o.EgressIP = ip.String() // upstream names only the IP here
			}
			obs = append(obs, o)
		}
		o := fwd(crd.ActionForwardedOutOfNetwork)
		switch {
		case mark != 0:
		case m.Config.WireGuard():
			// WireGuard routes Pod traffic to other Nodes through the
			// gateway: the agent tells it from traffic leaving the
			// cluster by the peer Node whose PodCIDR holds ip_dst.
			if peer, ok := m.PeerNodeIPForPodIP(nm, pkt.Dst); ok {
				o.Action, o.TunnelDstIP = crd.ActionForwarded, peer.String()
			}
		case mode == pipeline.Hybrid && m.InAnyPodCIDR(pkt.Dst):
			o.Action = crd.ActionForwarded
		}
		return append(obs, o), nil
	case m.Config.BridgingMode && outPort == pipeline.UplinkPort:
		// An AntreaIPAM Pod's packet bridged out of the uplink: the
		// reference's agent has no case for that port and reports it as
		// it does a Pod's, and the trace goes no further.
		return []crd.Observation{fwd(crd.ActionDelivered)}, nil
	case (mode == pipeline.NetworkPolicyOnly || mode == pipeline.NoEncap) && outPort == pipeline.GatewayPort:
		if m.InAnyPodCIDR(pkt.Dst) {
			return []crd.Observation{fwd(crd.ActionForwarded)}, nil
		}
		return []crd.Observation{fwd(crd.ActionForwardedOutOfNetwork)}, nil
	default:
		return []crd.Observation{fwd(crd.ActionDelivered)}, nil
	}
}

func effectiveEgress(m *pipeline.Model, src *cluster.Pod) (*crd.Egress, error) {
	if src == nil {
		return nil, fmt.Errorf("no source Pod for an Egress")
	}
	e := m.State.EffectiveEgress(src)
	if e == nil {
		return nil, fmt.Errorf("no effective Egress for Pod %s", src.Key())
	}
	if _, _, ok := cluster.EgressAssignment(e); !ok {
		return nil, fmt.Errorf("no effective IP for Egress %s", e.Name)
	}
	return e, nil
}
