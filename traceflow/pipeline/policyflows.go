package pipeline

import (
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
)

// APDisposition values in reg0[11..12].
const (
	dispositionDrop   = 1
	dispositionReject = 2
)

// policies installs every rule's conjunctive match for the Pods of this
// Node, the deny drops of the Metric tables and the K8s isolation drops.
func (g *gen) policies() {
	for _, r := range g.pol.rules {
		g.rule(r)
	}
	for _, p := range g.localPods() {
		port := g.port(p)
		if g.pol.isolatedEgress[p] {
			g.add(TEgressDefaultRule, 200, M{InPort: port}, datapath.Drop{})
			g.tagged(TEgressDefaultRule, 202, M{InPort: port}, datapath.Controller{Category: CategoryTraceflow})
		}
		if g.pol.isolatedIngress[p] {
			reg1 := []datapath.RegMatch{{Reg: 1, Masked: datapath.Exact(port)}}
			g.add(TIngressDefaultRule, 200, M{Regs: reg1}, datapath.Drop{})
			g.tagged(TIngressDefaultRule, 202, M{Regs: reg1}, datapath.Controller{Category: CategoryTraceflow})
		}
	}
	g.add(TAntreaPolicyEgressRule, 0, M{}, goTo(TEgressRule))
	g.add(TEgressRule, 0, M{}, goTo(TEgressDefaultRule))
	g.add(TEgressDefaultRule, 0, M{}, goTo(TEgressMetric))
	g.add(TEgressMetric, 0, M{}, goTo(TL3Forwarding))
	g.add(TAntreaPolicyIngressRule, 0, M{}, goTo(TIngressRule))
	g.add(TIngressRule, 0, M{}, goTo(TIngressDefaultRule))
	g.add(TIngressDefaultRule, 0, M{}, goTo(TIngressMetric))
	g.add(TIngressMetric, 0, M{}, goTo(TConntrackCommit))
}

func (g *gen) rule(r *compiledRule) {
	var local []uint32
	for _, p := range r.appliedTo {
		if port, ok := g.nm.PodPort[p.Key()]; ok {
			local = append(local, port)
		}
	}
	if len(local) == 0 {
		return // no Pod of this Node is subject to the rule
	}
	metric, tfReg, k8sTable := TEgressMetric, 5, TEgressRule
	if r.ingress {
		metric, tfReg, k8sTable = TIngressMetric, 6, TIngressRule
	}
	var acts []A
	switch r.action {
	case crd.RuleActionAllow:
		acts = []A{datapath.LoadReg{Reg: tfReg, Lo: 0, Hi: 31, Value: r.id}, goTo(metric)}
	case crd.RuleActionDrop, crd.RuleActionReject:
		disp := uint32(dispositionDrop)
		if r.action == crd.RuleActionReject {
			disp = dispositionReject
		}
		acts = []A{reg0(APDenyBit, APDenyBit, 1), reg0(11, 12, disp), datapath.LoadReg{Reg: 3, Lo: 0, Hi: 31, Value: r.id}, goTo(metric)}
		deny := M{Regs: []datapath.RegMatch{reg0Match(APDenyBit, APDenyBit, 1), {Reg: 3, Masked: datapath.Exact(r.id)}}}
		final := A(datapath.Drop{})
		if r.action == crd.RuleActionReject {
			final = datapath.Controller{Category: CategoryReject} // the agent answers with a reject
		}
		g.add(metric, 200, deny, final)
		g.tagged(metric, 202, deny, datapath.Controller{Category: CategoryTraceflow})
	case crd.RuleActionPass:
		if r.table == k8sTable || r.table == TEgressDefaultRule || r.table == TIngressDefaultRule {
			acts = []A{goTo(metric)}
		} else {
			acts = []A{goTo(k8sTable)}
		}
	}
	// Clauses: the Pods it applies to, the peers (or just the IP family,
	// so that every conjunction has at least two clauses), the ports.
	n := uint8(2)
	if !r.anyPort {
		n = 3
	}
	conj := func(k uint8) A { return datapath.Conjunction{ID: r.id, K: k, N: n} }
	for _, port := range local {
		m := M{InPort: port}
		if r.ingress {
			m = M{Regs: []datapath.RegMatch{{Reg: 1, Masked: datapath.Exact(port)}}}
		}
		g.add(r.table, r.priority, m, conj(1))
	}
	if r.anyPeer {
		for _, eth := range families {
			g.add(r.table, r.priority, M{EthType: eth}, conj(2))
		}
	} else {
		for _, p := range r.peers {
			m := M{EthType: ethOf(p.Addr())}
			if r.ingress {
				m.NwSrc = p
			} else {
				m.NwDst = p
			}
			g.add(r.table, r.priority, m, conj(2))
		}
	}
	if !r.anyPort {
		for _, pm := range r.ports {
			if pm.name != "" {
				continue // resolved per Pod below
			}
			for _, eth := range families {
				m := M{EthType: eth, IPProto: pm.proto, TpDst: pm.port}
				if pm.proto == datapath.ProtoICMP {
					// The same type and code numbers, in ICMPv6 for IPv6.
					if eth == datapath.EthIPv6 {
						m.IPProto = datapath.ProtoICMPv6
					}
					m.ICMPType, m.ICMPCode = pm.icmpType, pm.icmpCode
				}
				g.add(r.table, r.priority, m, conj(3))
			}
		}
		// A named port matches the resolved port at the destination
		// Pod's address (of an ingress rule, only this Node's Pods).
		for _, nm := range r.named {
			if _, local := g.nm.PodPort[nm.pod.Key()]; r.ingress && !local {
				continue
			}
			m := M{EthType: ethOf(nm.ip), IPProto: nm.proto, NwDst: host(nm.ip), TpDst: datapath.Masked{Value: uint32(nm.port), Mask: 0xffff}}
			g.add(r.table, r.priority, m, conj(3))
		}
	}
	g.add(r.table, r.priority, M{ConjID: r.id}, acts...)
}
