package tracer

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
	"sluice/traceflow/pipeline"
)

// Connection is the first packet of a connection as a conntrack table
// records it: the original source and the destination after DNAT (the
// endpoint that answered, or would have), the protocol and the ports (for
// ICMP, none).
type Connection struct {
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// Decision is the policy rule that decided one direction of a connection.
type Decision struct {
	// Node is the Node whose bridge applied the rule.
	Node string
	// Rule is the rule; its Action is Allow, Drop or Reject. For the
	// isolation drop of a Kubernetes NetworkPolicy (no rule allowed the
	// packet), Rule names the isolating policy (Model.Isolation) with an
	// empty rule name, and Isolation is set.
	Rule      pipeline.RuleRef
	Isolation bool
}

// Verdict is what the modelled datapath does with a connection's first
// packet: the rules that decided it on the way out of the source Pod and
// on the way into the destination Pod, and the Egress it left through.
type Verdict struct {
	// Egress and Ingress are nil when no policy rule applied in that
	// direction (the Pod is not isolated, or the end is no Pod).
	Egress, Ingress *Decision
	// Denied says a policy dropped or rejected the packet: the Decision
	// of that direction has the action Drop or Reject.
	Denied bool
	// EgressName, EgressIP and EgressNode name the Egress the connection
	// leaves the cluster through; empty when none.
	EgressName string
	EgressIP   netip.Addr
	EgressNode string
	// Note says why the model lost the packet other than by a policy,
	// empty when it did not.
	Note string
}

// ErrNotModelled is returned for a connection neither of whose ends is a
// Pod of the model: no bridge of the model sees it.
var ErrNotModelled = errors.New("tracer: neither end of the connection is a modelled Pod")

// Decide runs a connection's first packet through the model, as a
// Traceflow would (same packet building, same bridges, same packet-ins),
// and reads the policy decisions and the Egress off the run. A Pod source
// injects at the Pod's port; any other source (external, host network)
// enters the destination Pod's Node through its gateway. The model must
// carry a Traceflow tag. Decide only reads m: concurrent calls are safe.
func Decide(ctx context.Context, m *pipeline.Model, c Connection) (*Verdict, error) {
	if m.Config.Tag == 0 {
		return nil, errors.New("tracer: the model was built without a Traceflow tag")
	}
	src, dst := m.State.PodByIP(c.Src.Unmap()), m.State.PodByIP(c.Dst.Unmap())
	p := datapath.Packet{Src: c.Src.Unmap(), Dst: c.Dst.Unmap(), TTL: crd.DefaultTraceflowHopLimit, DSCP: m.Config.Tag}
	var nm *pipeline.NodeModel
	var entry datapath.Entry
	switch {
	case src != nil && m.Nodes[src.Node] != nil:
		nm = m.Nodes[src.Node]
		entry = datapath.Entry{InPort: nm.PodPort[src.Key()]}
		p.EthSrc, p.EthDst = pipeline.PodMAC(src), nm.GatewayMAC
		if dst != nil && dst.Node == src.Node {
			p.EthDst = pipeline.PodMAC(dst)
		}
	case dst != nil && m.Nodes[dst.Node] != nil:
		src = nil
		nm = m.Nodes[dst.Node]
		entry = datapath.Entry{InPort: pipeline.GatewayPort}
		p.EthSrc, p.EthDst = nm.GatewayMAC, pipeline.PodMAC(dst)
	default:
		return nil, ErrNotModelled
	}
	p.Proto, p.SrcPort, p.DstPort = c.Proto, c.SrcPort, c.DstPort
	switch c.Proto {
	case datapath.ProtoTCP:
		p.TCPFlags = 2
	case datapath.ProtoICMP:
		if p.Dst.Is6() {
			p.Proto = datapath.ProtoICMPv6
			p.ICMPType = 128
		} else {
			p.ICMPType = 8
		}
		p.SrcPort, p.DstPort = 0, 0
	case datapath.ProtoICMPv6:
		p.ICMPType = 128
		p.SrcPort, p.DstPort = 0, 0
	}
	frame, err := p.Serialize()
	if err != nil {
		return nil, fmt.Errorf("tracer: %w", err)
	}
	t := &Trace{Traceflow: &crd.Traceflow{}}
	now := func() time.Time { return time.Time{} }
	if err := walkFrom(ctx, m, src, nm, entry, frame, src != nil, now, t); err != nil {
		return nil, err
	}
	return readVerdict(m, t), nil
}

// readVerdict reads the decisions off each Node's packet-in, as observe
// reads the observations.
func readVerdict(m *pipeline.Model, t *Trace) *Verdict {
	v := &Verdict{}
	for _, h := range t.Hops {
		if h.Note != "" && !h.PacketIn {
			v.Note = h.Note
		}
		if h.Result == nil {
			continue
		}
		var pin *datapath.PacketIn
		for i := range h.Result.PacketIns {
			if h.Result.PacketIns[i].Category == pipeline.CategoryTraceflow {
				pin = &h.Result.PacketIns[i]
				break
			}
		}
		if pin == nil {
			continue
		}
		nm := m.Nodes[h.Node]
		md := &pin.Meta
		allow := func(conj uint32) *Decision {
			if r, ok := m.Rules[conj]; ok && conj != 0 {
				return &Decision{Node: h.Node, Rule: r}
			}
			return nil
		}
		if d := allow(md.Regs[5]); d != nil && v.Egress == nil {
			v.Egress = d
		}
		if d := allow(md.Regs[6]); d != nil {
			v.Ingress = d
		}
		switch pin.Table {
		case pipeline.TEgressMetric, pipeline.TIngressMetric:
			d := &Decision{Node: h.Node, Rule: pipeline.RuleRef{Action: crd.RuleActionDrop}}
			if md.Regs[0]&(1<<pipeline.APDenyBit) != 0 {
				if r, ok := m.Rules[md.Regs[3]]; ok {
					d.Rule = r
				}
			}
			v.Denied = true
			if pin.Table == pipeline.TEgressMetric {
				v.Egress = d
			} else {
				v.Ingress = d
			}
		case pipeline.TEgressDefaultRule:
			v.Denied = true
			v.Egress = isolation(m, nm.PortPod[md.InPort], h.Node, false)
		case pipeline.TIngressDefaultRule:
			v.Denied = true
			v.Ingress = isolation(m, nm.PortPod[md.Regs[1]], h.Node, true)
		}
	}
	for _, r := range t.Traceflow.Status.Results {
		for _, o := range r.Observations {
			if o.Component == crd.ComponentEgress && o.Egress != "" && v.EgressName == "" {
				v.EgressName, v.EgressNode = o.Egress, o.EgressNode
				v.EgressIP, _ = netip.ParseAddr(o.EgressIP)
			}
		}
	}
	return v
}

func isolation(m *pipeline.Model, p *cluster.Pod, node string, ingress bool) *Decision {
	d := &Decision{Node: node, Rule: pipeline.RuleRef{PolicyType: crd.K8sNetworkPolicyType, Action: crd.RuleActionDrop}, Isolation: true}
	if p != nil {
		if r, ok := m.Isolation(p, ingress); ok {
			d.Rule = r
		}
	}
	return d
}
