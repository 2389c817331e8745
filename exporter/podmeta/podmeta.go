// Package podmeta gives the exporter's connections their Kubernetes side:
// which connections concern this Node's Pods, the Pods at either end, and
// the flow type.
//
// As in the reference agent, only this Node's Pods are named in a record
// (with this Node's name): the aggregator tells the source Node's record of
// an inter-Node flow from the destination Node's by which Pod name is
// present, and fills in the other side when it correlates them. Remote Pods
// still count as Pods for the flow type.
package podmeta

import (
	"errors"
	"net/netip"
	"sync"
	"time"

	"sluice/enrich"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/flow"
)

// Options configures a Resolver.
type Options struct {
	// Node is this Node's name.
	Node string
	// PodCIDRs are this Node's Pod CIDRs. Required.
	PodCIDRs []netip.Prefix
	// ClusterCIDRs are the Pod CIDRs of the whole cluster (every Node's);
	// an address in them is a Pod even when the metadata source does not
	// know it. Optional.
	ClusterCIDRs []netip.Prefix
	// Store resolves Pods by IP; nil names no Pods.
	Store enrich.Store
}

// Meta is what is resolved once per connection.
type Meta struct {
	// Rec is what the connection's records refer to: the local Pods at
	// either end (nil for remote or unknown addresses), this Node's name,
	// the Service port a DNAT'ed connection reached (empty when it did
	// not go through a known Service port, as the reference leaves it),
	// and the SNAT address and port the reply went to. Connections with
	// the same values share one (read-only) unless they have SNAT.
	Rec *record.Meta
	// SrcLocal and DstLocal say the address at either end is in this
	// Node's Pod CIDRs.
	SrcLocal, DstLocal bool
	FlowType           uint8
	// Unnamed says which local ends (UnnamedSrc, UnnamedDst) the metadata
	// source could not name: most likely a Pod that has just started,
	// whose IP the kubelet posts a moment after its containers start.
	// Rename may name them later. A Pod CIDR's first address (the Node's
	// gateway, never a Pod) and any address without a metadata source
	// are not counted: waiting would never name them.
	Unnamed uint8
}

// Unnamed's bits.
const (
	UnnamedSrc uint8 = 1 << iota
	UnnamedDst
)

// maxShared bounds the table of shared record.Metas; when it is full it
// is emptied (the Metas in use stay with their connections, and new
// connections make new ones).
const maxShared = 1 << 14

// shareKey is what a shared record.Meta is made of (the Node is the
// Resolver's).
type shareKey struct {
	src, dst    *enrich.Pod
	svcIP       netip.Addr
	svcPort     uint16
	svcPortName string
}

// Resolver resolves connections' metadata. Safe for concurrent use.
type Resolver struct {
	o      Options
	mu     sync.Mutex
	shared map[shareKey]*record.Meta
}

// New checks o.
func New(o Options) (*Resolver, error) {
	if len(o.PodCIDRs) == 0 {
		return nil, errors.New("podmeta: the Node's Pod CIDR is needed")
	}
	if o.Node == "" {
		return nil, errors.New("podmeta: the Node name is needed")
	}
	return &Resolver{o: o, shared: map[shareKey]*record.Meta{}}, nil
}

func in(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Local reports whether a is one of this Node's Pod addresses.
func (r *Resolver) Local(a netip.Addr) bool { return in(r.o.PodCIDRs, a.Unmap()) }

// Keep selects the connections this Node exports: those with a local Pod
// at either end (the destination being the reply's source, after DNAT).
func (r *Resolver) Keep(c *source.Conn) bool {
	return r.Local(c.OrigSrc.Addr()) || r.Local(c.ReplySrc.Addr())
}

// Describe resolves c's metadata; start is the connection's start time
// (Pod IPs are reused, so the Pod is the one that held the IP then).
func (r *Resolver) Describe(c *source.Conn, start time.Time) Meta {
	src, dst := c.OrigSrc.Addr().Unmap(), c.ReplySrc.Addr().Unmap()
	var m Meta
	var k shareKey
	srcLocal, dstLocal := r.Local(src), r.Local(dst)
	m.SrcLocal, m.DstLocal = srcLocal, dstLocal
	srcIsPod, dstIsPod := srcLocal, dstLocal
	if srcLocal {
		k.src = r.localPod(src, start)
		if k.src == nil && r.nameable(src) {
			m.Unnamed |= UnnamedSrc
		}
	} else {
		srcIsPod = r.isPod(src, start)
	}
	if dstLocal {
		k.dst = r.localPod(dst, start)
		if k.dst == nil && r.nameable(dst) {
			m.Unnamed |= UnnamedDst
		}
	} else {
		dstIsPod = r.isPod(dst, start)
	}
	r.service(c, &k)
	// SNAT on this hop: the reply goes to another address than the
	// client's. The address and port are the connection's own: its Meta
	// is not shared.
	if c.ReplyDst.IsValid() && c.ReplyDst != c.OrigSrc {
		m.Rec = &record.Meta{SrcPod: k.src, DstPod: k.dst, Node: r.o.Node, ServiceIP: k.svcIP, ServicePort: k.svcPort,
			ServicePortName: k.svcPortName, SnatIP: c.ReplyDst.Addr(), SnatPort: c.ReplyDst.Port()}
	} else {
		m.Rec = r.share(&k)
	}
	switch {
	case srcLocal && dstLocal:
		m.FlowType = flow.FlowTypeIntraNode
	case srcIsPod && dstIsPod:
		m.FlowType = flow.FlowTypeInterNode
	case srcIsPod:
		m.FlowType = flow.FlowTypeToExternal
	default:
		m.FlowType = flow.FlowTypeFromExternal
	}
	return m
}

// service names the Service port of a connection the Node load-balanced:
// the original destination is a ClusterIP, translated (DNAT) to the
// endpoint that answered.
func (r *Resolver) service(c *source.Conn, k *shareKey) {
	vip := c.OrigDst.Addr().Unmap()
	if r.o.Store == nil || vip == c.ReplySrc.Addr().Unmap() {
		return
	}
	svc, ok := r.o.Store.ServiceByClusterIP(vip)
	if !ok {
		return
	}
	if name, ok := svc.PortName(c.Proto, c.OrigDst.Port()); ok {
		k.svcIP, k.svcPort, k.svcPortName = vip, c.OrigDst.Port(), name
	}
}

func (r *Resolver) localPod(a netip.Addr, at time.Time) *enrich.Pod {
	if r.o.Store == nil {
		return nil
	}
	p, ok := r.o.Store.PodByIP(a, at)
	if !ok || (p.NodeName != "" && p.NodeName != r.o.Node) {
		return nil
	}
	return p
}

// nameable reports whether the local address a, which the metadata
// source does not know, may be a Pod it learns later: not without a
// source, nor a Pod CIDR's first address, the Node's gateway (as the
// datapath model takes it, see traceflow/pipeline).
func (r *Resolver) nameable(a netip.Addr) bool {
	if r.o.Store == nil {
		return false
	}
	for _, p := range r.o.PodCIDRs {
		if p.Masked().Addr().Next() == a {
			return false
		}
	}
	return true
}

// Rename looks up again the local ends a connection's metadata left
// unnamed (rec and unnamed, as Describe made them; src and dst are the
// connection's addresses, start its start time). When it names one, it
// returns a new record.Meta, the old one's Service and SNAT values with
// the Pods added (rec is shared, and never changed), and the ends still
// unnamed; otherwise rec and unnamed as they were.
func (r *Resolver) Rename(rec *record.Meta, unnamed uint8, src, dst netip.Addr, start time.Time) (*record.Meta, uint8) {
	if rec == nil || unnamed == 0 {
		return rec, unnamed
	}
	srcPod, dstPod := rec.SrcPod, rec.DstPod
	if unnamed&UnnamedSrc != 0 {
		if srcPod = r.localPod(src.Unmap(), start); srcPod != nil {
			unnamed &^= UnnamedSrc
		}
	}
	if unnamed&UnnamedDst != 0 {
		if dstPod = r.localPod(dst.Unmap(), start); dstPod != nil {
			unnamed &^= UnnamedDst
		}
	}
	if srcPod == rec.SrcPod && dstPod == rec.DstPod {
		return rec, unnamed
	}
	if rec.SnatIP.IsValid() {
		// The connection's own Meta (see Describe): copied, not shared.
		m := *rec
		m.SrcPod, m.DstPod = srcPod, dstPod
		return &m, unnamed
	}
	return r.share(&shareKey{src: srcPod, dst: dstPod, svcIP: rec.ServiceIP, svcPort: rec.ServicePort,
		svcPortName: rec.ServicePortName}), unnamed
}

func (r *Resolver) isPod(a netip.Addr, at time.Time) bool {
	if in(r.o.ClusterCIDRs, a) {
		return true
	}
	if r.o.Store == nil {
		return false
	}
	_, ok := r.o.Store.PodByIP(a, at)
	return ok
}

// share returns the shared record.Meta of k's values.
func (r *Resolver) share(k *shareKey) *record.Meta {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.shared[*k]; ok {
		return m
	}
	if len(r.shared) >= maxShared {
		clear(r.shared)
	}
	m := &record.Meta{SrcPod: k.src, DstPod: k.dst, Node: r.o.Node, ServiceIP: k.svcIP, ServicePort: k.svcPort,
		ServicePortName: k.svcPortName}
	r.shared[*k] = m
	return m
}

// Fill writes m into r: its metadata (local Pods, named with this Node's
// name, the Service port and SNAT) and the flow type.
func (r *Resolver) Fill(rec *record.Record, m *Meta) {
	rec.Meta, rec.FlowType = m.Rec, m.FlowType
}
