// Package tracer runs a Traceflow against the modelled datapath: it builds
// the packet as the agent would, injects it at the source Pod's port, runs
// each Node's bridge, follows tunnels and direct routes to the next Node,
// and turns each Node's packet-in into observations the way Antrea's agent
// does. Verdicts come only from running the flows.
package tracer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
	"sluice/traceflow/pipeline"
)

// Options tune a run.
type Options struct {
	// Now gives the start time and the results' timestamps; time.Now if nil.
	Now func() time.Time
}

// Hop is what happened on one Node, for debugging the model.
type Hop struct {
	Node     string
	Trail    []datapath.Step
	PacketIn bool
	Note     string // why the trace stopped here, when it did
	// Entry, Frame and Result are the packet as it entered the Node's
	// bridge and everything the bridge did with it, so that the same
	// packet can be replayed elsewhere (package ovscheck does, in OVS).
	Entry  datapath.Entry
	Frame  []byte
	Result *datapath.Result
}

// Trace is a finished run: the Traceflow with its status, and the hops.
type Trace struct {
	Traceflow *crd.Traceflow
	Hops      []Hop
}

// AdmissionError is a Traceflow the API server would refuse: the input is
// unusable and no trace runs.
type AdmissionError struct{ Msg string }

func (e *AdmissionError) Error() string {
	return `admission webhook "traceflowvalidator.antrea.io" denied the request: ` + e.Msg
}

// UntraceableError is a Traceflow the reference accepts but cannot trace:
// its packet takes a path with no Traceflow flow, so no agent reports and
// the trace times out. Sluice refuses it, saying why, rather than report
// a path the reference would not.
type UntraceableError struct{ Msg string }

func (e *UntraceableError) Error() string {
	return "the reference cannot trace this (its trace would time out): " + e.Msg
}

// untraceable refuses destinations the reference's pipeline hands to
// flows without a Traceflow packet-in.
func untraceable(m *pipeline.Model, tf *crd.Traceflow) error {
	ip, err := netip.ParseAddr(tf.Spec.Destination.IP)
	if err != nil {
		return nil
	}
	if src := m.State.Pod(tf.Spec.Source.Namespace, tf.Spec.Source.Pod); m.AntreaIPAM(src) && m.VLAN(src) == 0 {
		if n := m.State.Node(src.Node); n != nil && (ip.Unmap() == n.TransportIP || ip == n.TransportV6) {
			return &UntraceableError{fmt.Sprintf("%s is the address of Node %s, which its AntreaIPAM Pod %s reaches "+
				"through the host interface, output by a flow above the Output table's Traceflow flows", ip, n.Name, src.Key())}
		}
	}
	if !ip.IsMulticast() {
		return nil
	}
	if ip.Is6() {
		return &UntraceableError{fmt.Sprintf("%s is an IPv6 multicast address, which the agent's IPv6 table "+
			"switches with OVS's normal action, before any table with Traceflow flows", ip)}
	}
	if m.Config.Multicast {
		return &UntraceableError{fmt.Sprintf("%s is a multicast address, which, with the agents' multicast.enable, "+
			"goes through the multicast tables, which have no Traceflow flows", ip)}
	}
	return nil
}

// agentError is a check the sender's agent fails; it ends the trace as
// Failed with "Node: <node>, error: <msg>".
type agentError struct{ msg string }

func (e *agentError) Error() string { return e.msg }

func agentErrorf(format string, a ...any) error { return &agentError{fmt.Sprintf(format, a...)} }

// Run traces tf (which is not modified) over the model and returns a copy
// with its status filled in. The model must carry a Traceflow tag.
func Run(ctx context.Context, m *pipeline.Model, tf *crd.Traceflow, opts Options) (*Trace, error) {
	if m.Config.Tag == 0 {
		return nil, errors.New("tracer: the model was built without a Traceflow tag")
	}
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	out := tf.Clone()
	// Keep the request's group (Antrea's, or Sluice's traceflows.sluice.io).
	if out.APIVersion == "" {
		out.APIVersion = crd.GroupVersion
	}
	out.Kind = crd.KindTraceflow
	start := metav1.NewTime(now().Truncate(time.Second))
	out.Status = crd.TraceflowStatus{StartTime: &start}
	src, err := admit(m.State, tf)
	if err != nil {
		return nil, err
	}
	if err := untraceable(m, tf); err != nil {
		return nil, err
	}
	t := &Trace{Traceflow: out}
	pkt, err := buildPacket(m, src, tf)
	if err != nil {
		var ae *agentError
		if errors.As(err, &ae) {
			out.Status.Phase = crd.PhaseFailed
			out.Status.Reason = fmt.Sprintf("Node: %s, error: %s", src.Node, ae.msg)
			return t, nil
		}
		return nil, err
	}
	if err := walk(ctx, m, src, pkt, now, t); err != nil {
		return nil, err
	}
	complete(m.State, out)
	return t, nil
}

// admit applies the admission webhook's checks for injected traces.
func admit(st *cluster.State, tf *crd.Traceflow) (*cluster.Pod, error) {
	s, d := tf.Spec.Source, tf.Spec.Destination
	if tf.Spec.LiveTraffic {
		return nil, &AdmissionError{"live-traffic Traceflow cannot run against a modelled cluster (no real traffic)"}
	}
	if s.Pod == "" && d.Pod == "" {
		return nil, &AdmissionError{fmt.Sprintf("Traceflow %s has neither source nor destination Pod specified", tf.Name)}
	}
	if s.Namespace == "" || s.Pod == "" {
		return nil, &AdmissionError{"source Pod must be specified in non-live-traffic Traceflow"}
	}
	p := st.Pod(s.Namespace, s.Pod)
	if p == nil {
		return nil, &AdmissionError{fmt.Sprintf("requested source Pod %s/%s not found", s.Namespace, s.Pod)}
	}
	if p.HostNetwork {
		return nil, &AdmissionError{"using hostNetwork Pod as source in non-live-traffic Traceflow is not supported"}
	}
	return p, nil
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// buildPacket makes the packet the sender's agent injects (§4.3).
func buildPacket(m *pipeline.Model, src *cluster.Pod, tf *crd.Traceflow) (datapath.Packet, error) {
	spec := tf.Spec
	v6 := spec.Packet.IPv6Header != nil
	var p datapath.Packet
	srcIP, ok := src.IP(v6)
	if !ok {
		return p, agentErrorf("source Pod does not have an %s address", family(v6))
	}
	nm := m.Nodes[src.Node]
	if nm == nil {
		return p, fmt.Errorf("tracer: source Pod %s is on Node %s, which has no bridge", src.Key(), src.Node)
	}
	p.Src, p.EthSrc, p.EthDst = srcIP, pipeline.PodMAC(src), nm.GatewayMAC
	svcPort, err := setDestination(m, src, tf.Spec.Destination, v6, &p)
	if err != nil {
		return p, err
	}
	p.TTL = crd.DefaultTraceflowHopLimit
	if v6 && spec.Packet.IPv6Header.HopLimit > 0 {
		p.TTL = uint8(min(spec.Packet.IPv6Header.HopLimit, 255))
	}
	if !v6 && spec.Packet.IPHeader != nil {
		if spec.Packet.IPHeader.TTL > 0 {
			p.TTL = uint8(min(spec.Packet.IPHeader.TTL, 255))
		}
		p.IPFlags = uint8(spec.Packet.IPHeader.Flags & 7)
	}
	p.DSCP = m.Config.Tag
	setTransport(&p, spec, svcPort, tf.Name)
	return p, nil
}

// setDestination addresses p to the Traceflow's destination (a Pod, a
// Service's ClusterIP or an IP), with the Pod's MAC when it is local, and
// returns the Service port the packet is for, if any.
func setDestination(m *pipeline.Model, src *cluster.Pod, d crd.Destination, v6 bool, p *datapath.Packet) (*cluster.ServicePort, error) {
	var svcPort *cluster.ServicePort
	dstNS := d.Namespace
	if dstNS == "" {
		dstNS = "default"
	}
	switch {
	case d.Pod != "":
		dp := m.State.Pod(dstNS, d.Pod)
		if dp == nil {
			return nil, agentErrorf("failed to get the destination Pod: pods %q not found", d.Pod)
		}
		ip, ok := dp.IP(v6)
		if !ok {
			return nil, agentErrorf("destination Pod does not have an %s address", family(v6))
		}
		p.Dst = ip
		if dp.Node == src.Node && !dp.HostNetwork {
			p.EthDst = pipeline.PodMAC(dp)
		}
	case d.Service != "":
		svc := m.State.Service(dstNS, d.Service)
		if svc == nil {
			return nil, agentErrorf("failed to get the destination Service: services %q not found", d.Service)
		}
		if len(svc.ClusterIPs) == 0 {
			return nil, agentErrorf("destination Service does not have a ClusterIP")
		}
		found := false
		for _, ip := range svc.ClusterIPs {
			if ip.Is6() == v6 {
				p.Dst, found = ip, true
				break
			}
		}
		if !found {
			return nil, agentErrorf("destination Service does not have an %s ClusterIP", family(v6))
		}
		if len(svc.Ports) == 0 {
			return nil, agentErrorf("destination Service does not have any ports")
		}
		svcPort = &svc.Ports[0]
	case d.IP != "":
		ip, err := netip.ParseAddr(d.IP)
		if err != nil {
			return nil, agentErrorf("invalid destination IP address")
		}
		if ip.Is6() != v6 {
			return nil, agentErrorf("destination IP does not match the IP header family")
		}
		p.Dst = ip.Unmap()
		if dp := m.State.PodByIP(p.Dst); dp != nil && dp.Node == src.Node {
			p.EthDst = pipeline.PodMAC(dp)
		}
	default:
		return nil, agentErrorf("destination is not specified")
	}
	return svcPort, nil
}

// setTransport fills in the transport header from the spec: given ports
// and flags, the Service's port and protocol, or ICMP echo by default.
func setTransport(p *datapath.Packet, spec crd.TraceflowSpec, svcPort *cluster.ServicePort, name string) {
	v6 := p.IsV6()
	th := spec.Packet.TransportHeader
	randomPort := func() uint16 {
		// Upstream picks a random port at injection; a hash of the name
		// keeps our output reproducible while still varying per trace.
		h := fnv.New32a()
		h.Write([]byte(name))
		return uint16(32768 + h.Sum32()%28232)
	}
	port := func(v int32) uint16 {
		if v <= 0 || v > 65535 {
			return 0
		}
		return uint16(v)
	}
	switch {
	case th.TCP != nil:
		p.Proto, p.SrcPort, p.DstPort, p.TCPFlags = datapath.ProtoTCP, port(th.TCP.SrcPort), port(th.TCP.DstPort), 2
		if th.TCP.Flags != nil {
			p.TCPFlags = uint8(*th.TCP.Flags)
		}
	case th.UDP != nil:
		p.Proto, p.SrcPort, p.DstPort = datapath.ProtoUDP, port(th.UDP.SrcPort), port(th.UDP.DstPort)
	case th.ICMP != nil:
		p.Proto, p.ICMPID, p.ICMPSeq = datapath.ProtoICMP, uint16(th.ICMP.ID), uint16(th.ICMP.Sequence)
	case svcPort != nil:
		p.Proto = datapath.ProtoTCP
		switch svcPort.Protocol {
		case "UDP":
			p.Proto = datapath.ProtoUDP
		case "SCTP":
			p.Proto = datapath.ProtoSCTP
		}
	case !v6 && spec.Packet.IPHeader != nil && spec.Packet.IPHeader.Protocol != 0:
		p.Proto = uint8(spec.Packet.IPHeader.Protocol)
	case v6 && spec.Packet.IPv6Header.NextHeader != nil:
		p.Proto = uint8(*spec.Packet.IPv6Header.NextHeader)
	default:
		p.Proto = datapath.ProtoICMP
	}
	if p.Proto == datapath.ProtoICMP && v6 {
		p.Proto = datapath.ProtoICMPv6
	}
	switch p.Proto {
	case datapath.ProtoICMP:
		p.ICMPType = 8
	case datapath.ProtoICMPv6:
		p.ICMPType = 128
	case datapath.ProtoTCP, datapath.ProtoUDP, datapath.ProtoSCTP:
		if svcPort != nil && p.DstPort == 0 {
			p.DstPort = svcPort.Port
		}
		if p.Proto == datapath.ProtoTCP && th.TCP == nil {
			p.TCPFlags = 2
		}
		if p.SrcPort == 0 {
			p.SrcPort = randomPort()
		}
	}
}

// maxHops bounds the Nodes one trace may cross; a well-formed trace needs
// at most three (source, Egress or destination Node, and one direct route).
const maxHops = 8

// walk runs the packet Node by Node.
func walk(ctx context.Context, m *pipeline.Model, src *cluster.Pod, pkt datapath.Packet, now func() time.Time, t *Trace) error {
	frame, err := pkt.Serialize()
	if err != nil {
		return fmt.Errorf("tracer: %w", err)
	}
	nm := m.Nodes[src.Node]
	return walkFrom(ctx, m, src, nm, datapath.Entry{InPort: nm.PodPort[src.Key()]}, frame, true, now, t)
}

// walkFrom runs frame from entry on Node nm, then Node by Node; sender
// says nm is the source Pod's Node.
func walkFrom(ctx context.Context, m *pipeline.Model, src *cluster.Pod, nm *pipeline.NodeModel, entry datapath.Entry,
	frame []byte, sender bool, now func() time.Time, t *Trace) error {
	for hop := 0; hop < maxHops; hop++ {
		res, err := nm.Bridge.Run(ctx, frame, entry, datapath.NewConntrack())
		if err != nil {
			return fmt.Errorf("tracer: %w", err)
		}
		h := Hop{Node: nm.Node.Name, Trail: res.Trail, Entry: entry, Frame: frame, Result: res}
		var pin *datapath.PacketIn
		for i := range res.PacketIns {
			if res.PacketIns[i].Category == pipeline.CategoryTraceflow {
				pin = &res.PacketIns[i]
				break
			}
		}
		if pin == nil {
			h.Note = "no Traceflow packet-in: the packet was lost without an observation"
			if res.Dropped {
				h.Note = "dropped in " + res.DropTable + " without a Traceflow packet-in"
			}
			t.Hops = append(t.Hops, h)
			return nil
		}
		h.PacketIn = true
		obs, err := observe(m, nm, src, sender, pin)
		if err != nil {
			// Upstream posts no result for that Node; the trace times out.
			h.Note = err.Error()
			t.Hops = append(t.Hops, h)
			return nil
		}
		t.Traceflow.Status.Results = append(t.Traceflow.Status.Results,
			crd.NodeResult{Node: nm.Node.Name, Timestamp: now().Unix(), Observations: obs})
		next, nextFrame, nextEntry, note, err := forward(m, nm, res)
		if err != nil {
			return err
		}
		if next == nil {
			h.Note = note
			t.Hops = append(t.Hops, h)
			return nil
		}
		t.Hops = append(t.Hops, h)
		nm, frame, entry, sender = next, nextFrame, nextEntry, false
	}
	t.Hops = append(t.Hops, Hop{Node: nm.Node.Name, Note: fmt.Sprintf("stopped after %d Nodes (a forwarding loop in the model)", maxHops)})
	return nil
}

// forward carries the packet out of one Node to the next: through the
// tunnel to the Node owning tun_dst, or, in direct-routing modes, through
// the host to the Node owning the destination's PodCIDR.
func forward(m *pipeline.Model, nm *pipeline.NodeModel, res *datapath.Result) (*pipeline.NodeModel, []byte, datapath.Entry, string, error) {
	for _, o := range res.Outputs {
		switch o.Port {
		case pipeline.TunnelPort:
			tunDst := o.Meta.TunDst
			next := m.OwnerOfTunnelIP(tunDst)
			if next == nil {
				return nil, nil, datapath.Entry{}, fmt.Sprintf("tunnel destination %s is no Node of the cluster", tunDst), nil
			}
			inner, err := o.Packet.Serialize()
			if err != nil {
				return nil, nil, datapath.Entry{}, "", fmt.Errorf("tracer: %w", err)
			}
			local := nm.Node.TransportIP
			if tunDst.Is6() && nm.Node.TransportV6.IsValid() {
				local = nm.Node.TransportV6
			}
			outer, err := datapath.Encapsulate(m.Config.TunnelType, inner, local, tunDst)
			if err != nil {
				return nil, nil, datapath.Entry{}, fmt.Sprintf("cannot tunnel: %v", err), nil
			}
			dst, frame, err := datapath.Decapsulate(m.Config.TunnelType, outer)
			if err != nil {
				return nil, nil, datapath.Entry{}, "", fmt.Errorf("tracer: %w", err)
			}
			return next, frame, datapath.Entry{InPort: pipeline.TunnelPort, TunDst: dst}, "", nil
		case pipeline.GatewayPort:
			owner := m.State.NodeForPodIP(o.Packet.Dst)
			if owner == nil || owner.Name == nm.Node.Name {
				return nil, nil, datapath.Entry{}, "left the Node through the gateway", nil
			}
			next := m.Nodes[owner.Name]
			p := o.Packet
			p.EthSrc, p.EthDst = nm.GatewayMAC, next.GatewayMAC
			frame, err := p.Serialize()
			if err != nil {
				return nil, nil, datapath.Entry{}, "", fmt.Errorf("tracer: %w", err)
			}
			return next, frame, datapath.Entry{InPort: pipeline.GatewayPort}, "", nil
		}
	}
	return nil, nil, datapath.Entry{}, "", nil
}

// complete applies the controller's completion rules (§2.7) and, on
// success, names the Pod behind every translated destination.
func complete(st *cluster.State, tf *crd.Traceflow) {
	senderSeen, receiverSeen := false, false
	for _, r := range tf.Status.Results {
		for _, o := range r.Observations {
			if o.Component == crd.ComponentSpoofGuard {
				senderSeen = true
			}
			switch o.Action {
			case crd.ActionDelivered, crd.ActionDropped, crd.ActionRejected, crd.ActionForwardedOutOfNetwork:
				receiverSeen = true
			}
		}
	}
	if receiverSeen && (senderSeen || tf.Spec.Source.Pod == "") {
		tf.Status.Phase = crd.PhaseSucceeded
		for i := range tf.Status.Results {
			for j := range tf.Status.Results[i].Observations {
				o := &tf.Status.Results[i].Observations[j]
				if ip, err := netip.ParseAddr(o.TranslatedDstIP); err == nil {
					if p := st.PodByIP(ip); p != nil {
						o.Pod = p.Key()
					}
				}
			}
		}
		return
	}
	tf.Status.Phase = crd.PhaseFailed
	tf.Status.Reason = "Traceflow timeout"
}
