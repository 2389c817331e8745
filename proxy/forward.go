package proxy

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/mode"
	"sluice/ring"
)

// Forwarding is Proxy mode's fast path. Most received records are exported
// as their own fields plus the few Proxy mode adds, so a record whose
// template allows it is forwarded by copying runs of its octets into an
// export record and writing only what the proxy decides (the other side's
// Pod names, labels, cluster ID, flow direction, the original exporter),
// without a flow record in between. The result is the same, octet for
// octet, as normalizing the record, enriching it with Process and
// writing it with the Exporter, which is what records of other templates
// still do (see TestForwardMatchesProcess).
//
// A Forwarding is shared by the collector's sessions; each session has its
// own forwarder (NewForwarder), which keeps its plans per template.
type Forwarding struct {
	p *Proxy
	// sample, when set (Sample), takes a sample of the records for a view.
	sample *sampler
	// The enrichment settings, read once: lookups when there is a store
	// to look in, labels when they are asked for.
	lookups, labels bool
	table           *ipfixmap.Table
	// base are the export templates by family index (4 → 0, 6 → 1).
	base        [2]*ipfix.Template
	passThrough bool
	// cluster is the clusterId value encoded, nil when none is set.
	cluster []byte
	// ex and enc write the records the forwarders leave to Run; Run's
	// goroutine owns them.
	ex  *ipfixmap.Exporter
	enc *ipfix.Encoder
	// arenas hold the octets of the records Run writes (the fast path's
	// buffer has one consumer, the IPFIX sink, which releases them), so
	// that records are written into reused memory rather than into a
	// fresh allocation per batch grown record by record. arena is the one
	// being filled, over as many batches as fit (Run holds a share of it
	// until it moves on); recLen is the longest record written yet. recs
	// is Run's list of a batch's records, reused (the buffer copies them).
	arenas ipfix.ArenaPool
	arena  *ipfix.Arena
	recLen int
	recs   []ipfix.EncodedRecord
	// encoders are the gRPC streams' forwarders' encoders (ForwardFlow),
	// given back when a stream ends: an encoder's buffer is two messages
	// (128 KiB), too much to make for every stream an agent opens.
	encoders sync.Pool
}

// forwardArena is the size of the arenas Run writes records into: a few
// hundred records, and so few arenas for the records a buffer holds.
const forwardArena = 256 << 10

// arenaFor returns the arena to write n records into: the current one
// while they fit, else a new one.
func (fw *Forwarding) arenaFor(n int) *ipfix.Arena {
	need := n * max(fw.recLen, 256)
	if a := fw.arena; a != nil {
		if cap(a.Buf)-len(a.Buf) >= need {
			return a
		}
		a.Release(1) // Run's share: the arena goes back once its records are sent
	}
	fw.arena = fw.arenas.Get(max(need, forwardArena))
	fw.arena.Hold(1)
	return fw.arena
}

// Encoded is NewForwarding as Proxy mode's side of mode.Encoder.
func (p *Proxy) Encoded(table *ipfixmap.Table, ex *ipfixmap.Exporter) (mode.Encoded, error) {
	fw, err := NewForwarding(p, table, ex)
	if fw == nil {
		return nil, err // a nil interface, not a nil *Forwarding
	}
	return fw, nil
}

// NewForwarding prepares the fast path for p's records exported through
// ex. It returns nil when no record could take it: with UIDs on, which
// the fast path does not fill, or a cluster ID too long for a record.
func NewForwarding(p *Proxy, table *ipfixmap.Table, ex *ipfixmap.Exporter) (*Forwarding, error) {
	o := p.enr.Options()
	if o.UIDs {
		return nil, nil
	}
	// An encoder that never sends: it only builds records (EncodeRecord).
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	fw := &Forwarding{p: p, lookups: o.Store != nil, labels: o.PodLabels, table: table, passThrough: ex.PassThrough(), ex: ex, enc: enc}
	for fi, family := range []int{4, 6} {
		if fw.base[fi] = ex.Base(family); fw.base[fi] == nil {
			return nil, fmt.Errorf("proxy: the exporter has no IPv%d template", family)
		}
	}
	if c := o.ClusterID; c != "" {
		if len(c) > 0xffff {
			return nil, nil // more than a record can carry: the normal path reports it
		}
		fw.cluster = ipfix.AppendVariable(nil, c)
	}
	return fw, nil
}

// Run is Proxy.Run for an export that is IPFIX only: batches carry records
// the collectors' forwarders encoded already, and flow records, which are
// enriched here and written with the Forwarding's exporter; out receives
// export records only. encodeErr hears of a flow record that cannot be
// written (it is dropped). Run only once at a time.
func (fw *Forwarding) Run(ctx context.Context, in <-chan flow.Batch, out *ring.Buffer[ipfix.EncodedRecord], encodeErr func(error)) {
	p, ex := fw.p, fw.ex
	if fw.sample != nil {
		stop := make(chan struct{})
		defer close(stop)
		go fw.sample.Run(stop)
	}
	receive(ctx, in, func(b flow.Batch) {
		recs := b.Encoded
		var arena *ipfix.Arena
		if len(b.Flows) > 0 {
			recs = append(fw.recs[:0], b.Encoded...)
			arena = fw.arenaFor(len(b.Flows))
		}
		written := 0
		for i, f := range b.Flows {
			p.Process(f)
			if fw.sample != nil && fw.sample.Want() {
				// Not kept by the encoding below: the view may keep it.
				fw.sample.produce(f)
				b.Flows[i] = nil // the view's now, not the pool's
			}
			t, _, err := ex.Template(f)
			if err != nil {
				encodeErr(err)
				continue
			}
			data, err := fw.enc.EncodeRecord(t, func(rb ipfix.RecordBuilder) error { return ex.Write(rb, t, f) })
			if err != nil {
				encodeErr(err)
				continue
			}
			fw.recLen = max(fw.recLen, len(data))
			start := len(arena.Buf)
			arena.Buf = append(arena.Buf, data...)
			recs = append(recs, ipfix.EncodedRecord{Template: t, Data: arena.Buf[start:len(arena.Buf):len(arena.Buf)], Arena: arena})
			written++
		}
		if written > 0 {
			arena.Add(written) // before handing on: the sink releases them
		}
		for _, err := range b.EncodeErrs {
			encodeErr(err)
		}
		p.copied.Add(float64(len(b.Encoded) - b.Rebuilt))
		// As Run: those that fail to encode too.
		p.rebuilt.Add(float64(len(b.Flows) + b.Rebuilt + len(b.EncodeErrs)))
		if b.Pool != nil {
			// Written out as octets: the collectors may decode into
			// them again.
			b.Pool.PutAll(b.Flows)
		}
		out.Produce(recs...)
		if arena != nil {
			clear(recs) // the buffer has copied them; nor pin their arenas here
			fw.recs = recs[:0]
		}
		if b.Written != nil {
			pos := out.Produced()
			b.Resolve(func(ctx context.Context) error { return out.WaitWritten(ctx, pos) })
		}
	})
}

// NewForwarder returns a forwarder for one collector session.
func (fw *Forwarding) NewForwarder() flow.Forwarder {
	return &forwarder{fw: fw, plans: map[*ipfix.Template]*fplan{}, egress: map[string][]byte{}}
}

// What an export field's value comes from.
const (
	opCopy      = iota // octets of received fields a..b-1
	opZero             // a zero octets: a fixed-length value the record lacks
	opEmpty            // an empty variable-length value the record lacks
	opPod              // a Pod's namespace, name or Node (side a, which b), received field c
	opLabels           // side a's Pod labels, received field c
	opCluster          // the cluster ID, received field c
	opEgressIP         // egressIP as the exporter writes it, received field c
	opDomain           // originalObservationDomainId
	opExporter4        // originalExporterIPv4Address
	opExporter6        // originalExporterIPv6Address
	opDirection        // flowDirection
)

// Which Pod string an opPod writes.
const (
	podNamespace = iota
	podName
	podNode
)

// fixedLen is the length of the value an op writes itself, for the ops
// whose value has one.
func fixedLen(kind uint8) (uint16, bool) {
	switch kind {
	case opDomain, opExporter4:
		return 4, true
	case opExporter6:
		return 16, true
	case opDirection:
		return 1, true
	}
	return 0, false
}

type fop struct {
	kind    uint8
	a, b, c int
}

// fplan is how records of one received template are forwarded; ok false
// sends them the normal way.
type fplan struct {
	ok  bool
	out *ipfix.Template
	ops []fop
	// Received fields the proxy reads, -1 when absent.
	srcIP, dstIP, start, flowType int
	pod                           [2][3]int // side (source, destination) × podNamespace..podNode
	// v6 are the received IPv6 address fields the export carries: an
	// IPv4-mapped address in one makes the normal path write another
	// family's template or zeros, so such a record takes that path.
	v6 []int
}

type forwarder struct {
	fw *Forwarding
	// enc builds the flow records ForwardFlow writes (made at its first).
	enc      *ipfix.Encoder
	plans    map[*ipfix.Template]*fplan
	last     *ipfix.Template
	lastPlan *fplan
	// egress caches egressIP values as received → as exported: a cluster
	// has few Egress IPs, and parsing one allocates.
	egress map[string][]byte
}

// ForwardFlow implements flow.FlowForwarder: what Run does for a flow
// record, on the collector's goroutine, for the records written with a
// base template (all but those with elements to pass through, which may
// need a template of their own: the Exporter makes those on Run's
// goroutine only).
func (f *forwarder) ForwardFlow(r *flow.Flow, arena []byte, out []ipfix.EncodedRecord) ([]byte, []ipfix.EncodedRecord, bool, error) {
	ex := f.fw.ex
	t, ok := ex.BaseTemplate(r)
	if !ok {
		return arena, out, false, nil
	}
	if f.enc == nil {
		if f.enc, _ = f.fw.encoders.Get().(*ipfix.Encoder); f.enc == nil {
			enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
			if err != nil {
				return arena, out, false, nil // cannot happen with the defaults; Run writes it
			}
			f.enc = enc
		}
	}
	f.fw.p.Process(r)
	data, err := f.enc.EncodeRecord(t, func(rb ipfix.RecordBuilder) error { return ex.WriteBase(rb, t, r) })
	if err != nil {
		return arena, out, true, err
	}
	start := len(arena)
	arena = append(arena, data...)
	return arena, append(out, ipfix.EncodedRecord{Template: t, Data: arena[start:len(arena):len(arena)]}), true, nil
}

// Takes implements flow.FlowForwarder.
func (f *forwarder) Takes(r *flow.Flow) bool {
	_, ok := f.fw.ex.BaseTemplate(r)
	return ok
}

// Release implements flow.FlowForwarder: the encoder goes back to the
// Forwarding's pool.
func (f *forwarder) Release() {
	if f.enc != nil {
		f.fw.encoders.Put(f.enc)
		f.enc = nil
	}
}

// maxPlans bounds a session's plans; templates replaced over a long
// session leave stale ones behind, and the cache is cleared when full.
const maxPlans = 1024

func (f *forwarder) plan(t *ipfix.Template) *fplan {
	if t == f.last {
		return f.lastPlan
	}
	p, ok := f.plans[t]
	if !ok {
		if len(f.plans) >= maxPlans {
			clear(f.plans)
		}
		p = f.fw.plan(t)
		f.plans[t] = p
	}
	f.last, f.lastPlan = t, p
	return p
}

// plan works out how records of t are forwarded.
func (fw *Forwarding) plan(t *ipfix.Template) *fplan {
	p := &fplan{srcIP: -1, dstIP: -1, start: -1, flowType: -1}
	for s := range p.pod {
		p.pod[s] = [3]int{-1, -1, -1}
	}
	if t.IsOptions() {
		return p
	}
	// What the proxy reads, and the record's family: that of its address
	// elements, as for flow.Flow.IsIPv6. A template that mixes families,
	// or whose IPv6 elements may all be unset (no source nor destination),
	// can make the normal path choose either template: such records take
	// that path.
	family := 4
	var fams [7]bool
	for i := range t.Fields {
		el, ok := fw.table.Lookup(t.Fields[i].Key())
		if !ok || t.Fields[i].Type != el.IE.Type {
			continue
		}
		if el.Family != 0 {
			fams[el.Family] = true
			family = el.Family
		}
		switch el.Field {
		case flow.SourceIP:
			p.srcIP = i
		case flow.DestinationIP:
			p.dstIP = i
		case flow.FlowType:
			p.flowType = i
		case flow.StartTime:
			p.start = i
		case flow.SourcePodNamespace, flow.SourcePodName, flow.SourceNodeName,
			flow.DestinationPodNamespace, flow.DestinationPodName, flow.DestinationNodeName:
			s, w := podSide(el.Field)
			p.pod[s][w] = i
		}
	}
	if fams[4] && fams[6] || family == 6 && p.srcIP < 0 && p.dstIP < 0 {
		return p
	}
	out := fw.base[0]
	if family == 6 {
		out = fw.base[1]
	}
	src, ok := fw.table.CopyPlan(t, out, fw.passThrough)
	if !ok {
		return p
	}
	p.out = out
	for j := range out.Fields {
		if src[j] >= 0 && t.Fields[src[j]].Type == ipfix.IPv6Address {
			p.v6 = append(p.v6, src[j])
		}
	}
	for j := range out.Fields {
		of := &out.Fields[j]
		op := fop{kind: opCopy, a: src[j], b: src[j] + 1, c: src[j]}
		k := of.Key()
		el, _ := fw.table.Lookup(k)
		switch {
		case k == ipfix.ElementKey{ID: 405}:
			op.kind = opDomain
		case k == ipfix.ElementKey{ID: 403}:
			op.kind = opExporter4
		case k == ipfix.ElementKey{ID: 404}:
			op.kind = opExporter6
		case el == nil:
			return p // the export has an element the table does not map
		case el.Field == flow.FlowDirection:
			op.kind = opDirection
		case el.Field == flow.SourcePodLabels:
			op.kind, op.a = opLabels, 0
		case el.Field == flow.DestinationPodLabels:
			op.kind, op.a = opLabels, 1
		case el.Field == flow.ClusterID:
			op.kind = opCluster
		case el.Field == flow.EgressIP:
			op.kind = opEgressIP
		case isPodField(el.Field):
			op.kind = opPod
			op.a, op.b = podSide(el.Field)
		case src[j] < 0 && of.Variable():
			op.kind = opEmpty
		case src[j] < 0:
			op.kind, op.a = opZero, int(of.Length)
		}
		if want, fixed := fixedLen(op.kind); fixed && of.Length != want {
			return p // cannot happen with Sluice's registry; the normal path would say why
		}
		// Runs of fields received in export order are one copy.
		if n := len(p.ops); n > 0 && op.kind == opCopy && p.ops[n-1].kind == opCopy && p.ops[n-1].b == op.a {
			p.ops[n-1].b = op.b
			continue
		}
		if n := len(p.ops); n > 0 && op.kind == opZero && p.ops[n-1].kind == opZero {
			p.ops[n-1].a += op.a
			continue
		}
		p.ops = append(p.ops, op)
	}
	p.ok = true
	return p
}

// isPodField reports whether f is one of the Pod strings FillPods fills.
func isPodField(f flow.Field) bool {
	switch f {
	case flow.SourcePodNamespace, flow.SourcePodName, flow.SourceNodeName,
		flow.DestinationPodNamespace, flow.DestinationPodName, flow.DestinationNodeName:
		return true
	}
	return false
}

// podSide says which side (0 source, 1 destination) and which string
// (podNamespace, podName, podNode) a Pod field is.
func podSide(f flow.Field) (side, which int) {
	switch f {
	case flow.SourcePodNamespace:
		return 0, podNamespace
	case flow.SourcePodName:
		return 0, podName
	case flow.SourceNodeName:
		return 0, podNode
	case flow.DestinationPodNamespace:
		return 1, podNamespace
	case flow.DestinationPodName:
		return 1, podName
	}
	return 1, podNode
}

// Forward implements flow.Forwarder.
func (f *forwarder) Forward(r *ipfix.Record, o *flow.Origin, arena []byte, out []ipfix.EncodedRecord) ([]byte, []ipfix.EncodedRecord, bool) {
	p := f.plan(r.Template)
	if !p.ok {
		return arena, out, false
	}
	// Copied runs keep the received length prefixes: the encoder's, one
	// octet below 255, unless the exporter wrote a short value's length
	// in three (RFC 7011 §7 allows it); such a record goes the normal way.
	if !r.MinimalLengths() {
		return arena, out, false
	}
	for _, i := range p.v6 {
		if b := r.Bytes(i); len(b) == 16 && netip.AddrFrom16([16]byte(b)).Is4In6() {
			return arena, out, false
		}
	}
	var d decisions
	f.decide(r, p, &d)
	start := len(arena)
	arena, ok := f.write(arena, r, o, p, &d)
	if !ok {
		return arena[:start], out, false
	}
	rec := arena[start:len(arena):len(arena)]
	return arena, append(out, ipfix.EncodedRecord{Template: p.out, Data: rec}), true
}

// decisions are what Process would decide for a record, read off its
// octets: its flow type, its Pod strings, the Pods at its addresses, and
// for each side whether FillPods names it (fill) and whether, after that,
// it names a Pod (has).
type decisions struct {
	flowType  uint8
	strs      [2][3][]byte
	pods      [2]*enrich.Pod
	fill, has [2]bool
}

// decide fills d for r: the record's Pod strings, then Process's decisions
// on them: FillPods for an inter-Node record, and the labels of the
// result (the direction is decided on the strings as received).
func (f *forwarder) decide(r *ipfix.Record, p *fplan, d *decisions) {
	if p.flowType >= 0 {
		v, _ := r.Uint(p.flowType)
		d.flowType = uint8(v)
	}
	for s := range p.pod {
		for w, i := range p.pod[s] {
			if i >= 0 {
				d.strs[s][w] = r.Bytes(i)
			}
		}
	}
	if f.fw.lookups && (f.fw.labels || d.flowType == flow.FlowTypeInterNode) {
		var start time.Time
		if p.start >= 0 {
			start, _ = r.Time(p.start)
		}
		for s, i := range [2]int{p.srcIP, p.dstIP} {
			if i >= 0 {
				a, _ := r.Addr(i)
				d.pods[s] = f.fw.p.enr.Pod(a, start)
			}
		}
		if d.flowType == flow.FlowTypeInterNode {
			d.fill[0] = len(d.strs[0][podName]) == 0 && d.pods[0] != nil
			d.fill[1] = len(d.strs[1][podName]) == 0 && d.pods[1] != nil
		}
	}
	// The Pod names after FillPods.
	for s := range d.has {
		d.has[s] = len(d.strs[s][podName]) > 0
		if d.fill[s] {
			d.has[s] = d.pods[s].Name != ""
		}
	}
}

// write appends r's export record to arena by p's operations, with d's
// decisions; false when the record must take the normal path after all.
func (f *forwarder) write(arena []byte, r *ipfix.Record, o *flow.Origin, p *fplan, d *decisions) ([]byte, bool) {
	for _, op := range p.ops {
		switch op.kind {
		case opCopy:
			arena = append(arena, r.Encoded(op.a, op.b)...)
		case opZero:
			arena = append(arena, make([]byte, op.a)...)
		case opEmpty:
			arena = append(arena, 0)
		case opPod:
			if !d.fill[op.a] {
				arena = ipfix.AppendVariable(arena, d.strs[op.a][op.b])
				break
			}
			pod := d.pods[op.a]
			switch op.b {
			case podNamespace:
				arena = ipfix.AppendVariable(arena, pod.Namespace)
			case podName:
				arena = ipfix.AppendVariable(arena, pod.Name)
			default:
				if node := d.strs[op.a][podNode]; len(node) == 0 && pod.NodeName != "" {
					arena = ipfix.AppendVariable(arena, pod.NodeName)
				} else {
					arena = ipfix.AppendVariable(arena, node)
				}
			}
		case opLabels:
			if !f.fw.labels {
				arena = appendReceived(arena, r, op.c)
				break
			}
			// As enrich.Labels: only for the Pod the record names (after
			// FillPods, which names it after the Pod itself).
			s, pod := op.a, d.pods[op.a]
			if pod == nil || !d.has[s] || !d.fill[s] &&
				(string(d.strs[s][podName]) != pod.Name || string(d.strs[s][podNamespace]) != pod.Namespace) {
				arena = append(arena, 0)
				break
			}
			l := pod.LabelsJSON()
			if len(l) > 0xffff {
				return arena, false // the normal path reports it
			}
			arena = ipfix.AppendVariable(arena, l)
		case opCluster:
			if f.fw.cluster != nil {
				arena = append(arena, f.fw.cluster...)
			} else {
				arena = appendReceived(arena, r, op.c)
			}
		case opEgressIP:
			arena = f.appendEgressIP(arena, r, op.c)
		case opDomain:
			arena = binary.BigEndian.AppendUint32(arena, o.ObservationDomainID)
		case opExporter4:
			a := o.Exporter.Unmap()
			if a.Is4() {
				b := a.As4()
				arena = append(arena, b[:]...)
			} else {
				arena = append(arena, 0, 0, 0, 0)
			}
		case opExporter6:
			a := o.Exporter.Unmap()
			var b [16]byte
			if a.Is6() {
				b = a.As16()
			}
			arena = append(arena, b[:]...)
		case opDirection:
			// On the Pods the exporter named, before any fill (as Process).
			arena = append(arena, direction(d.flowType, len(d.strs[0][podName]) > 0, len(d.strs[1][podName]) > 0))
		}
	}
	return arena, true
}

// appendReceived appends received variable-length field i as the encoder
// would write it, or an empty value when the record lacks it.
func appendReceived(b []byte, r *ipfix.Record, i int) []byte {
	if i < 0 {
		return append(b, 0)
	}
	return ipfix.AppendVariable(b, r.Bytes(i))
}

// maxEgress bounds a forwarder's cache of egressIP values.
const maxEgress = 256

// appendEgressIP appends egressIP as the exporter writes it: the address
// in its canonical form, empty when the record lacks one or it does not
// parse.
func (f *forwarder) appendEgressIP(b []byte, r *ipfix.Record, i int) []byte {
	if i < 0 {
		return append(b, 0)
	}
	v := r.Bytes(i)
	if len(v) == 0 {
		return append(b, 0)
	}
	if enc, ok := f.egress[string(v)]; ok {
		return append(b, enc...)
	}
	var enc []byte
	if a, err := netip.ParseAddr(string(v)); err != nil {
		enc = []byte{0}
	} else {
		enc = ipfix.AppendVariable(nil, a.String())
	}
	if len(v) > 64 {
		return append(b, enc...) // not an address anyway: not worth a cache entry
	}
	if len(f.egress) >= maxEgress {
		clear(f.egress)
	}
	f.egress[string(v)] = enc
	return append(b, enc...)
}
