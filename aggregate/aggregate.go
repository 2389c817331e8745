// Package aggregate is the aggregator's Aggregate mode: it correlates the
// records that the source Node and the destination Node of a connection
// export about it into one record carrying both sides' Kubernetes metadata
// and per-Node counters, with the semantics of Antrea's Flow Aggregator
// (classification, correlation, stats merging, throughput, expiry and
// export), and exports each flow as soon as it is complete, then at most
// once per active timeout.
//
// A [Store] is single-goroutine: Add, Tick and Flush must not run
// concurrently (Run does all three from one goroutine). Stats may be read
// from any goroutine.
//
// The per-flow state is compact (352 bytes plus about 17 of index, no
// pointers): fixed-size keys, values interned into a per-Store table of
// reference-counted ids and grouped into interned tuples (a Pod's five
// values are one id), packet counters in 32 bits unless they outgrow them, an open-addressing index, a timing wheel of
// one-second buckets and an idle list, both linked through slab indexes.
package aggregate

import (
	"context"
	"net/netip"
	"runtime"
	"sync/atomic"
	"time"

	"sluice/enrich"
	"sluice/flow"
	"sluice/internal/bigmem"
	"sluice/ring"
)

// MaxRetries is how many times a flow still waiting for the other Node's
// record is given another active timeout before it is exported one-sided
// (or dropped).
const MaxRetries = 2

// Defaults of Options.
const (
	DefaultActiveTimeout   = 60 * time.Second
	DefaultInactiveTimeout = 90 * time.Second
	DefaultMaxFlows        = 1_000_000
	DefaultTick            = time.Second
)

// Options configures a Store.
type Options struct {
	// ActiveTimeout is activeFlowRecordTimeout: a flow that keeps
	// receiving records is exported at most once per ActiveTimeout (after
	// its first export, which happens on the first tick after it is
	// complete). Default 60 s; values under 1 s are raised to 1 s.
	ActiveTimeout time.Duration
	// InactiveTimeout is inactiveFlowRecordTimeout: a flow is forgotten
	// this long after its last record. Default 90 s; at least 1 s.
	InactiveTimeout time.Duration
	// MaxFlows bounds the number of flows held (sluice.aggregate.maxFlows).
	// Past it, the flows idle the longest are exported early and evicted.
	// Default 1,000,000.
	MaxFlows int
	// ExportOneSided exports an inter-Node flow that only one Node
	// reported once its retries are spent, instead of dropping it
	// (sluice.aggregate.exportOneSided, true in the default configuration).
	ExportOneSided bool

	// Enricher completes exported records: the Pods of flows that skipped
	// correlation (denied inter-Node flows, one-sided flows), labels, UIDs
	// and the cluster ID, by the rules Proxy mode uses too; nil adds
	// nothing.
	Enricher *enrich.Enricher

	// Clock is what Run reads the time from; default time.Now.
	Clock func() time.Time
}

// Stats are a Store's counters.
type Stats struct {
	// RecordsIn counts records given to Add.
	RecordsIn uint64
	// RecordsInvalid counts records dropped for lacking a start or end
	// time.
	RecordsInvalid uint64
	// RecordsStale counts records whose end time was not newer than the
	// last one from the same Node: they changed no counter.
	RecordsStale uint64
	// Flows is the number of flows held now.
	Flows uint64
	// Correlated counts flows whose two sides were matched.
	Correlated uint64
	// Exported counts exported records (one-sided and evicted included).
	Exported uint64
	// OneSidedExported and OneSidedDropped count inter-Node flows only
	// one Node reported, exported as such or dropped (ExportOneSided),
	// after their retries or on eviction or Flush.
	OneSidedExported uint64
	OneSidedDropped  uint64
	// Evicted counts flows exported early and forgotten because MaxFlows
	// was reached.
	Evicted uint64
	// Expired counts flows forgotten InactiveTimeout after their last
	// record.
	Expired uint64
	// TableBytes is the address space the flow table (entries and index)
	// holds outside the Go heap; it is committed as it is first written,
	// and kept for reuse. 0 where the table is on the heap (see package
	// bigmem).
	TableBytes uint64
	// TableHeapFallbacks counts parts of the flow table (slab pages, index
	// arrays) that were to be mapped outside the heap and came from the
	// Go heap instead, because the kernel refused the mapping.
	TableHeapFallbacks uint64
}

type counters struct {
	recordsIn, recordsInvalid, recordsStale, correlated  atomic.Uint64
	exported, oneSidedExported, oneSidedDropped, evicted atomic.Uint64
	expired                                              atomic.Uint64
	flows                                                atomic.Int64
}

// Store holds the flows being aggregated.
type Store struct {
	o                Options
	active, inactive int64 // ns
	maxFlows         int
	seed             hashSeed

	slab slab
	idx  index
	strs strtab
	tups tuptab

	// wide holds the packet counters of the entries that outgrew 32 bits
	// (see counter); wideFree its unused slots.
	wide     []wideCounters
	wideFree []uint32

	// Timing wheel: flow i is in bucket e.bucket, whose second is at or
	// before min(active, inactive) (a later deadline moves it lazily, when
	// its bucket comes up). Buckets up to wheelDone have been processed.
	wheel     []uint32
	wheelMask int64
	wheelDone int64
	started   bool

	// Idle order: least recently updated first.
	lHead, lTail uint32
	n            int

	c counters

	// queries carries flow-record look-ups into Run's goroutine, which
	// alone touches the flows.
	queries chan *queryReq

	// scratch, under RunEach, is the one record every export is built
	// in (the caller consumes it before the next).
	scratch *exported
	// free, under Run, are records the buffer recycled once every reader
	// was done with them, each with its Aggregation: exports reuse them
	// rather than allocate.
	free []*flow.Flow
}

// New returns an empty Store.
func New(o Options) *Store {
	if o.ActiveTimeout == 0 {
		o.ActiveTimeout = DefaultActiveTimeout
	}
	if o.InactiveTimeout == 0 {
		o.InactiveTimeout = DefaultInactiveTimeout
	}
	o.ActiveTimeout = max(o.ActiveTimeout, time.Second)
	o.InactiveTimeout = max(o.InactiveTimeout, time.Second)
	if o.MaxFlows <= 0 {
		o.MaxFlows = DefaultMaxFlows
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	s := &Store{
		o:        o,
		active:   int64(o.ActiveTimeout),
		inactive: int64(o.InactiveTimeout),
		maxFlows: o.MaxFlows,
		seed:     newHashSeed(),
		strs:     newStrtab(),
		tups:     newTuptab(),
		lHead:    nilIdx,
		lTail:    nilIdx,
		queries:  make(chan *queryReq),
	}
	// The slab's pages and the index's slots are mapped outside the heap;
	// they go back to the system when the Store is collected. A pointer to
	// an entry does not keep the Store alive: the methods that touch
	// entries keep s alive to their end (runtime.KeepAlive), and Run's
	// goroutine, which serves the queries, holds s.
	mem := new(bigmem.Owner)
	s.slab.mem = mem
	s.idx.init(mem)
	runtime.AddCleanup(s, (*bigmem.Owner).FreeAll, mem)
	// One bucket per second of the longest timeout (and a little slack);
	// a deadline further out waits in its bucket for its round.
	horizon := int64(max(o.ActiveTimeout, o.InactiveTimeout)/time.Second) + 2
	n := int64(64)
	for n < horizon && n < 1<<16 {
		n <<= 1
	}
	s.wheel = make([]uint32, n)
	for i := range s.wheel {
		s.wheel[i] = nilIdx
	}
	s.wheelMask = n - 1
	return s
}

// Stats returns the counters. It is safe to call from any goroutine.
func (s *Store) Stats() Stats {
	return Stats{
		RecordsIn:        s.c.recordsIn.Load(),
		RecordsInvalid:   s.c.recordsInvalid.Load(),
		RecordsStale:     s.c.recordsStale.Load(),
		Flows:            uint64(max(s.c.flows.Load(), 0)),
		Correlated:       s.c.correlated.Load(),
		Exported:         s.c.exported.Load(),
		OneSidedExported: s.c.oneSidedExported.Load(),
		OneSidedDropped:  s.c.oneSidedDropped.Load(),
		Evicted:          s.c.evicted.Load(),
		Expired:          s.c.expired.Load(),
		TableBytes:       uint64(s.slab.mem.Mapped()),
		// The same Owner as the index's (New).
		TableHeapFallbacks: uint64(s.slab.mem.Failed()),
	}
}

// Len is the number of flows held. Call it from the Store's goroutine
// (Stats().Flows is the same count, readable from any goroutine).
func (s *Store) Len() int { return s.n }

// side is which Node a record comes from.
type side uint8

const (
	sideUnknown side = iota
	sideSrc
	sideDst
)

// Add takes one Node's record of a connection, received at now. The record
// is not retained. emit receives the records of flows evicted to make room
// (see Options.MaxFlows; nil discards them, still counted as exported); it
// must not call back into the Store.
func (s *Store) Add(now time.Time, f *flow.Flow, emit func(*flow.Flow)) {
	s.c.recordsIn.Add(1)
	if !f.Present.Has(flow.StartTime) || !f.Present.Has(flow.EndTime) || f.StartTime.IsZero() || f.EndTime.IsZero() {
		s.c.recordsInvalid.Add(1)
		return
	}
	nowNs := now.UnixNano()
	s.begin(nowNs)

	// §3.2 classification.
	srcPod, dstPod := f.SourcePodName != "", f.DestinationPodName != ""
	// The ingress-Node half of an inter-Node from-external flow is keyed
	// on the proxy's SNAT address and port, which is what the destination
	// Node sees as the source.
	ingressHalf := f.FlowType == flow.FlowTypeFromExternal && !dstPod &&
		f.ProxySnatIP.IsValid() && !f.ProxySnatIP.IsUnspecified()
	denied := f.Egress.RuleAction == flow.ActionDrop || f.Egress.RuleAction == flow.ActionReject ||
		f.Ingress.RuleAction == flow.ActionReject
	corr := !denied && (f.FlowType == flow.FlowTypeInterNode || ingressHalf)
	sd := sideUnknown
	switch {
	case srcPod && !dstPod, ingressHalf:
		sd = sideSrc
	case dstPod && !srcPod:
		sd = sideDst
	}
	var k key
	if ingressHalf {
		k.set(f.ProxySnatIP, f.DestinationIP, f.ProxySnatPort, f.DestinationPort, f.Protocol)
	} else {
		k.set(f.SourceIP, f.DestinationIP, f.SourcePort, f.DestinationPort, f.Protocol)
	}
	h := s.seed.hash(&k)

	i, slot, ok := s.lookup(h, &k)
	if !ok {
		s.create(&arrival{f: f, k: k, h: h, nowNs: nowNs, corr: corr, sd: sd, ingressHalf: ingressHalf}, slot, emit)
		runtime.KeepAlive(s) // see New
		return
	}
	e := s.slab.at(i)
	// §3.4: a record needing correlation fills its own side's counters;
	// one that does not fills both.
	fillSrc, fillDst := true, true
	if corr {
		fillSrc, fillDst = sd == sideSrc, sd != sideSrc
		if e.flags&fReady == 0 && !s.sameNode(e, sd) {
			s.correlate(i, e, f, ingressHalf, nowNs)
		}
	}
	s.aggregate(e, f, fillSrc, fillDst)
	e.flags |= fUpdated
	e.inactive = nowNs + s.inactive
	s.touch(i, e)
	runtime.KeepAlive(s)
}

// sameNode reports whether a record of side sd comes from the Node that
// sent the first record of e.
func (s *Store) sameNode(e *entry, sd side) bool {
	return sd == sideSrc && e.flags&fSideSrc != 0 || sd == sideDst && e.flags&fSideDst != 0
}

// lookup finds the flow of key k (hash h). When there is none, it returns
// the empty slot that ended the search, where the flow goes.
func (s *Store) lookup(h uint32, k *key) (i, slot uint32, ok bool) {
	x := &s.idx
	for p := h & x.mask; ; p = (p + 1) & x.mask {
		v := x.slots[p]
		if v == 0 {
			return 0, p, false
		}
		if uint32(v>>32) == h {
			i := uint32(v) - 1
			if s.slab.at(i).key.eq(k) {
				return i, 0, true
			}
		}
	}
}

// arrival is a record as Add classified it: its flow's key and the key's
// hash, when it came, whether it needs correlation, which Node's side it
// is, and whether it is the ingress-Node half of a from-external flow.
type arrival struct {
	f           *flow.Flow
	k           key
	h           uint32
	nowNs       int64
	corr        bool
	sd          side
	ingressHalf bool
}

// create stores the first record of a flow (§3.3); slot is the index slot
// lookup found for it.
func (s *Store) create(a *arrival, slot uint32, emit func(*flow.Flow)) {
	f, h, nowNs, corr, sd := a.f, a.h, a.nowNs, a.corr, a.sd
	if s.n >= s.maxFlows {
		s.evictOldest(emit)
		// Removal shifts slots back: look for the slot again.
		slot = s.idx.free(h)
	}
	i := s.slab.alloc()
	e := s.slab.at(i)
	e.key = a.k
	e.flags = fLive | fUpdated
	e.present = f.Present
	e.present.Clear(flow.FlowDirection)
	e.present.Clear(flow.SourcePodLabels)
	e.present.Clear(flow.DestinationPodLabels)
	e.present.Clear(flow.ClusterID)
	switch sd {
	case sideSrc:
		e.flags |= fSideSrc
	case sideDst:
		e.flags |= fSideDst
	}
	e.start, e.end = f.StartTime.UnixNano(), f.EndTime.UnixNano()
	e.endReason = f.EndReason
	e.flowType = f.FlowType
	if a.ingressHalf {
		e.flags |= fSrcIP
	}
	s.internStrings(e, f, a.ingressHalf)

	// Counters: the common ones and those of the record's side (both
	// sides when no correlation is needed).
	fillSrc, fillDst := true, true
	if corr {
		fillSrc, fillDst = sd == sideSrc, sd != sideSrc
	}
	s.setCounters(e, f, fillSrc, fillDst)

	e.inactive = nowNs + s.inactive
	if corr {
		e.active = nowNs + s.active
	} else {
		// Complete already: export on the next tick.
		e.flags |= fReady
		e.active = nowNs
		// An inter-Node flow that skips correlation (denied) lacks the
		// other side's Pod, which is looked up at export.
		if f.FlowType != flow.FlowTypeInterNode {
			e.flags |= fCorrFilled
		}
	}
	s.idx.insertAt(h, i, slot)
	s.schedule(i, e, min(e.active, e.inactive))
	s.pushIdle(i, e)
	s.n++
	s.c.flows.Add(1)
}

// internStrings stores f's strings, UIDs and addresses in e, interned as
// tuples (the inverse of snapshot's reads); the ingress-Node half of a
// from-external flow also keeps its source address and port.
func (s *Store) internStrings(e *entry, f *flow.Flow, ingressHalf bool) {
	t, g := &s.strs, &s.tups
	v := tuple{s: [5]uint32{t.idOf(f.SourcePodNamespace), t.idOf(f.SourcePodName), t.idOfUID(&f.SourcePodUID),
		t.idOf(f.SourceNodeName), t.idOfUID(&f.SourceNodeUID)}}
	e.grp[gSrcPod] = g.add(&v, t)
	v = tuple{s: [5]uint32{t.idOf(f.DestinationPodNamespace), t.idOf(f.DestinationPodName), t.idOfUID(&f.DestinationPodUID),
		t.idOf(f.DestinationNodeName), t.idOfUID(&f.DestinationNodeUID)}}
	e.grp[gDstPod] = g.add(&v, t)
	v = tuple{s: [5]uint32{t.idOfAddr(f.DestinationClusterIP), t.idOfAddr(f.DestinationServiceIP),
		t.idOf(f.DestinationServicePortName), t.idOfUID(&f.DestinationServiceUID)}, w: uint32(f.DestinationServicePort)}
	e.grp[gService] = g.add(&v, t)
	v = policyTuple(t, &f.Ingress)
	e.grp[gIngress] = g.add(&v, t)
	v = policyTuple(t, &f.Egress)
	e.grp[gEgress] = g.add(&v, t)
	v = tuple{s: [5]uint32{t.idOf(f.EgressName), t.idOfAddr(f.EgressIP), t.idOf(f.EgressNodeName),
		t.idOfUID(&f.EgressNodeUID), t.idOfUID(&f.EgressUID)}}
	e.grp[gEgressGW] = g.add(&v, t)
	v = tuple{s: [5]uint32{t.idOf(f.AppProtocolName), t.idOf(f.HTTPVals), t.idOfAddr(f.ProxySnatIP)}, w: uint32(f.ProxySnatPort)}
	if ingressHalf {
		v.s[pSrcIP] = t.idOfAddr(f.SourceIP)
		v.w |= uint32(f.SourcePort) << 16
	}
	e.grp[gMisc] = g.add(&v, t)
	e.tcp = t.add(f.TCPState)
}

func policyTuple(t *strtab, p *flow.Policy) tuple {
	return tuple{s: [5]uint32{t.idOf(p.Namespace), t.idOf(p.Name), t.idOfUID(&p.UID), t.idOf(p.RuleName)},
		w: uint32(p.Type) | uint32(p.RuleAction)<<8}
}

// setCounters stores f's counters and the throughputs they make over the
// flow's life: the common ones, and those of each side asked for.
func (s *Store) setCounters(e *entry, f *flow.Flow, fillSrc, fillDst bool) {
	var tp, rtp uint64
	if d := sec(e.end) - sec(e.start); d > 0 {
		tp = f.Stats.OctetTotalCount * 8 / uint64(d)
		rtp = f.ReverseStats.OctetTotalCount * 8 / uint64(d)
	}
	s.setStat(e, cCommon, f.Stats)
	s.setStat(e, cCommonRev, f.ReverseStats)
	e.tput[cCommon], e.tput[cCommonRev] = tp, rtp
	if fillSrc {
		s.setStat(e, cSrc, f.Stats)
		s.setStat(e, cSrcRev, f.ReverseStats)
		e.tput[cSrc], e.tput[cSrcRev] = tp, rtp
		e.endSrc = e.end
	}
	if fillDst {
		s.setStat(e, cDst, f.Stats)
		s.setStat(e, cDstRev, f.ReverseStats)
		e.tput[cDst], e.tput[cDstRev] = tp, rtp
		e.endDst = e.end
	}
}

// correlate merges the other Node's record into e (§3.4): every Kubernetes
// field the record carries (non-empty, non-zero) replaces the stored one,
// and the flow becomes ready to export on the next tick.
func (s *Store) correlate(i uint32, e *entry, f *flow.Flow, ingressHalf bool, nowNs int64) {
	t, g := &s.strs, &s.tups
	var v *tuple
	str := func(pos int, p flow.Field, x string) {
		if x != "" {
			v.s[pos] = t.idOf(x)
			e.present.Set(p)
		}
	}
	uid := func(pos int, p flow.Field, x *flow.UID) {
		if *x != (flow.UID{}) {
			v.s[pos] = t.idOfUID(x)
			e.present.Set(p)
		}
	}
	addr := func(pos int, p flow.Field, x netip.Addr) {
		if x.IsValid() {
			v.s[pos] = t.idOfAddr(x)
			e.present.Set(p)
		}
	}
	small := func(shift uint, p flow.Field, x uint32) {
		if x != 0 {
			v.w = v.w&^(0xff<<shift) | x<<shift
			e.present.Set(p)
		}
	}
	// Each tuple is built from the stored one and replaced before the next
	// is built (replace releases, and idOf's ids are held by nothing yet).
	nv := g.vals[e.grp[gSrcPod]]
	v = &nv
	str(pNamespace, flow.SourcePodNamespace, f.SourcePodNamespace)
	str(pName, flow.SourcePodName, f.SourcePodName)
	uid(pUID, flow.SourcePodUID, &f.SourcePodUID)
	str(pNode, flow.SourceNodeName, f.SourceNodeName)
	uid(pNodeUID, flow.SourceNodeUID, &f.SourceNodeUID)
	g.replace(&e.grp[gSrcPod], v, t)

	nv = g.vals[e.grp[gDstPod]]
	str(pNamespace, flow.DestinationPodNamespace, f.DestinationPodNamespace)
	str(pName, flow.DestinationPodName, f.DestinationPodName)
	uid(pUID, flow.DestinationPodUID, &f.DestinationPodUID)
	str(pNode, flow.DestinationNodeName, f.DestinationNodeName)
	uid(pNodeUID, flow.DestinationNodeUID, &f.DestinationNodeUID)
	g.replace(&e.grp[gDstPod], v, t)

	nv = g.vals[e.grp[gService]]
	addr(pClusterIP, flow.DestinationClusterIP, f.DestinationClusterIP)
	addr(pServiceIP, flow.DestinationServiceIP, f.DestinationServiceIP)
	if f.DestinationServicePort != 0 {
		v.w = uint32(f.DestinationServicePort)
		e.present.Set(flow.DestinationServicePort)
	}
	str(pPortName, flow.DestinationServicePortName, f.DestinationServicePortName)
	uid(pServiceUID, flow.DestinationServiceUID, &f.DestinationServiceUID)
	g.replace(&e.grp[gService], v, t)

	nv = g.vals[e.grp[gIngress]]
	small(0, flow.IngressPolicyType, uint32(f.Ingress.Type))
	str(pNamespace, flow.IngressPolicyNamespace, f.Ingress.Namespace)
	str(pName, flow.IngressPolicyName, f.Ingress.Name)
	uid(pUID, flow.IngressPolicyUID, &f.Ingress.UID)
	str(pRule, flow.IngressPolicyRuleName, f.Ingress.RuleName)
	small(8, flow.IngressPolicyRuleAction, uint32(f.Ingress.RuleAction))
	g.replace(&e.grp[gIngress], v, t)

	nv = g.vals[e.grp[gEgress]]
	small(0, flow.EgressPolicyType, uint32(f.Egress.Type))
	str(pNamespace, flow.EgressPolicyNamespace, f.Egress.Namespace)
	str(pName, flow.EgressPolicyName, f.Egress.Name)
	uid(pUID, flow.EgressPolicyUID, &f.Egress.UID)
	str(pRule, flow.EgressPolicyRuleName, f.Egress.RuleName)
	small(8, flow.EgressPolicyRuleAction, uint32(f.Egress.RuleAction))
	g.replace(&e.grp[gEgress], v, t)

	// Egress (SNAT gateway) information is the source Node's; it is copied
	// like the other Kubernetes fields in case that record came second.
	nv = g.vals[e.grp[gEgressGW]]
	str(pEgressName, flow.EgressName, f.EgressName)
	addr(pEgressIP, flow.EgressIP, f.EgressIP)
	str(pEgressNode, flow.EgressNodeName, f.EgressNodeName)
	uid(pEgressNodeUID, flow.EgressNodeUID, &f.EgressNodeUID)
	uid(pEgressUID, flow.EgressUID, &f.EgressUID)
	g.replace(&e.grp[gEgressGW], v, t)

	if ingressHalf {
		// The destination Node saw the proxy's SNAT address as the
		// source; the ingress Node knows the external client.
		nv = g.vals[e.grp[gMisc]]
		v.s[pSrcIP] = t.idOfAddr(f.SourceIP)
		v.s[pSnatIP] = t.idOfAddr(f.ProxySnatIP)
		v.w = uint32(f.ProxySnatPort) | uint32(f.SourcePort)<<16
		g.replace(&e.grp[gMisc], v, t)
		e.flags |= fSrcIP
		e.present.Set(flow.ProxySnatIP)
		e.present.Set(flow.ProxySnatPort)
		e.flowType = flow.FlowTypeFromExternal
		e.present.Set(flow.FlowType)
	}
	e.flags |= fReady | fCorrFilled
	s.c.correlated.Add(1)
	// Complete: export on the next tick.
	e.active = nowNs
	s.schedule(i, e, min(e.active, e.inactive))
}

// aggregate folds a subsequent record into e (§3.5).
func (s *Store) aggregate(e *entry, f *flow.Flow, fillSrc, fillDst bool) {
	inEnd := f.EndTime.UnixNano()
	inEndS, inStartS := sec(inEnd), sec(f.StartTime.UnixNano())
	latest := inEndS >= sec(e.end)
	if latest {
		e.end = inEnd
	}
	// Per side: the time since that Node's previous record; a record not
	// newer than it is stale and changes nothing more.
	var dtSrc, dtDst int64
	if fillSrc {
		// A Node's first record is never stale, even when it started
		// and ended within one second (the reference drops its counters).
		first := e.endSrc == 0
		prev := inStartS
		if !first {
			prev = sec(e.endSrc)
		}
		e.endSrc = inEnd
		if inEndS <= prev && !first {
			s.c.recordsStale.Add(1)
			return
		}
		dtSrc = inEndS - prev
	}
	if fillDst {
		// A Node's first record is never stale, even when it started
		// and ended within one second (the reference drops its counters).
		first := e.endDst == 0
		prev := inStartS
		if !first {
			prev = sec(e.endDst)
		}
		e.endDst = inEnd
		if inEndS <= prev && !first {
			s.c.recordsStale.Add(1)
			return
		}
		dtDst = inEndS - prev
	}
	// END_OF_FLOW sticks.
	if e.endReason != endOfFlow {
		e.endReason = f.EndReason
		if f.Present.Has(flow.EndReason) {
			e.present.Set(flow.EndReason)
		} else {
			e.present.Clear(flow.EndReason)
		}
	}
	// The state's id, not its octets, is compared: the identity cache
	// answers without reading them.
	if latest {
		if id := s.strs.idOf(f.TCPState); id != e.tcp {
			if id != 0 {
				s.strs.refs[id].n++
				e.present.Set(flow.TCPState)
			} else {
				e.present.Clear(flow.TCPState)
			}
			s.strs.release(e.tcp)
			e.tcp = id
		}
	}
	if fillSrc {
		s.fold(e, cSrc, f, dtSrc, latest)
	}
	if fillDst {
		s.fold(e, cDst, f, dtDst, latest)
	}
}

const endOfFlow = 3

// fold applies a record's counters to one side (c is cSrc or cDst): its
// totals replace the side's, its deltas add up; the throughput is the
// change of the octet total over dt seconds. The latest record of either
// side sets the common counters: totals to the larger, deltas to this
// side's.
func (s *Store) fold(e *entry, c int, f *flow.Flow, dt int64, latest bool) {
	st, rst := s.stat(e, c), s.stat(e, c+1)
	// A total that went backwards is a new connection reusing the tuple:
	// no throughput rather than a wrapped one.
	var tp, rtp uint64
	if dt > 0 { // 0 for a first record within one second: no rate to tell
		tp = sub(f.Stats.OctetTotalCount, st.OctetTotalCount) * 8 / uint64(dt)
		rtp = sub(f.ReverseStats.OctetTotalCount, rst.OctetTotalCount) * 8 / uint64(dt)
	}
	st.PacketTotalCount, st.OctetTotalCount = f.Stats.PacketTotalCount, f.Stats.OctetTotalCount
	st.PacketDeltaCount += f.Stats.PacketDeltaCount
	st.OctetDeltaCount += f.Stats.OctetDeltaCount
	rst.PacketTotalCount, rst.OctetTotalCount = f.ReverseStats.PacketTotalCount, f.ReverseStats.OctetTotalCount
	rst.PacketDeltaCount += f.ReverseStats.PacketDeltaCount
	rst.OctetDeltaCount += f.ReverseStats.OctetDeltaCount
	s.setStat(e, c, st)
	s.setStat(e, c+1, rst)
	e.tput[c], e.tput[c+1] = tp, rtp
	if latest {
		cs, crs := s.stat(e, cCommon), s.stat(e, cCommonRev)
		cs.PacketTotalCount = max(cs.PacketTotalCount, st.PacketTotalCount)
		cs.OctetTotalCount = max(cs.OctetTotalCount, st.OctetTotalCount)
		cs.PacketDeltaCount, cs.OctetDeltaCount = st.PacketDeltaCount, st.OctetDeltaCount
		crs.PacketTotalCount = max(crs.PacketTotalCount, rst.PacketTotalCount)
		crs.OctetTotalCount = max(crs.OctetTotalCount, rst.OctetTotalCount)
		crs.PacketDeltaCount, crs.OctetDeltaCount = rst.PacketDeltaCount, rst.OctetDeltaCount
		s.setStat(e, cCommon, cs)
		s.setStat(e, cCommonRev, crs)
		e.tput[cCommon], e.tput[cCommonRev] = tp, rtp
	}
	e.present[0] |= f.Present[0] & statsFields[0]
	e.present[1] |= f.Present[1] & statsFields[1]
}

var statsFields = func() flow.Fields {
	var s flow.Fields
	for _, f := range []flow.Field{flow.PacketTotalCount, flow.PacketDeltaCount, flow.OctetTotalCount,
		flow.OctetDeltaCount, flow.ReversePacketTotalCount, flow.ReversePacketDeltaCount,
		flow.ReverseOctetTotalCount, flow.ReverseOctetDeltaCount} {
		s.Set(f)
	}
	return s
}()

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// sec is the whole second of a Unix time in nanoseconds.
func sec(ns int64) int64 {
	if ns < 0 {
		return (ns - 999_999_999) / 1e9
	}
	return ns / 1e9
}

// Tick exports the flows that are due at now and forgets those that are
// done (§3.6). Call it every second (DefaultTick); emit receives fresh
// records (nil discards them) and must not call back into the Store.
func (s *Store) Tick(now time.Time, emit func(*flow.Flow)) {
	nowNs := now.UnixNano()
	s.begin(nowNs)
	cur := sec(nowNs)
	from := s.wheelDone + 1
	if n := s.wheelMask + 1; cur-from >= n {
		from = cur - n + 1 // each bucket once
	}
	for b := from; b <= cur; b++ {
		bi := b & s.wheelMask
		for i := s.wheel[bi]; i != nilIdx; {
			e := s.slab.at(i)
			next := e.wNext
			if due := min(e.active, e.inactive); due <= nowNs {
				s.expire(i, e, nowNs, emit)
			} else {
				// Its deadline moved later (a record arrived), or is
				// a later round of the wheel.
				s.schedule(i, e, due)
			}
			i = next
		}
	}
	// The current second's bucket may still hold deadlines later in it.
	s.wheelDone = max(s.wheelDone, cur-1)
	runtime.KeepAlive(s)
}

func (s *Store) expire(i uint32, e *entry, nowNs int64, emit func(*flow.Flow)) {
	if e.flags&fReady == 0 {
		// Still waiting for the other Node.
		e.retries++
		if e.retries > MaxRetries {
			s.oneSided(e, emit)
			s.remove(i, e)
			return
		}
		e.active, e.inactive = nowNs+s.active, nowNs+s.inactive
		s.schedule(i, e, min(e.active, e.inactive))
		return
	}
	if e.flags&fUpdated != 0 {
		s.export(e, emit)
	}
	if e.inactive <= nowNs {
		s.c.expired.Add(1)
		s.remove(i, e)
		return
	}
	if e.active <= nowNs {
		e.active = nowNs + s.active
	}
	s.schedule(i, e, min(e.active, e.inactive))
}

// oneSided exports a flow only one Node reported, or drops it.
func (s *Store) oneSided(e *entry, emit func(*flow.Flow)) {
	if s.o.ExportOneSided {
		s.export(e, emit)
		s.c.oneSidedExported.Add(1)
	} else {
		s.c.oneSidedDropped.Add(1)
	}
}

// evictOldest exports and forgets the flow idle the longest.
func (s *Store) evictOldest(emit func(*flow.Flow)) {
	i := s.lHead
	if i == nilIdx {
		return
	}
	e := s.slab.at(i)
	s.finish(e, emit)
	s.c.evicted.Add(1)
	s.remove(i, e)
}

// finish exports what a flow about to be forgotten has not exported yet.
func (s *Store) finish(e *entry, emit func(*flow.Flow)) {
	switch {
	case e.flags&fReady == 0:
		s.oneSided(e, emit)
	case e.flags&fUpdated != 0:
		s.export(e, emit)
	}
}

// Flush exports every flow that has something not exported yet (flows
// still waiting for their other side count as one-sided) and forgets all
// flows. It is the graceful-shutdown path. emit as for Tick.
func (s *Store) Flush(emit func(*flow.Flow)) {
	for s.lHead != nilIdx {
		i := s.lHead
		e := s.slab.at(i)
		s.finish(e, emit)
		s.remove(i, e)
	}
	runtime.KeepAlive(s)
}

// remove forgets flow i.
func (s *Store) remove(i uint32, e *entry) {
	// The hash is recomputed rather than kept: 4 bytes less per entry.
	s.idx.remove(s.seed.hash(&e.key), i)
	s.unschedule(i, e)
	s.unlinkIdle(i, e)
	for _, id := range e.grp {
		s.tups.release(id, &s.strs)
	}
	s.strs.release(e.tcp)
	s.narrowRelease(e)
	s.slab.release(i)
	s.n--
	s.c.flows.Add(-1)
}

// schedule puts flow i in the wheel bucket of deadline ns (or the next one
// to be processed, if that is later).
func (s *Store) schedule(i uint32, e *entry, ns int64) {
	b := uint16(max(sec(ns), s.wheelDone+1) & s.wheelMask)
	if e.flags&fScheduled != 0 {
		if e.bucket == b {
			return
		}
		s.unschedule(i, e)
	}
	e.bucket = b
	e.wPrev = nilIdx
	e.wNext = s.wheel[b]
	if e.wNext != nilIdx {
		s.slab.at(e.wNext).wPrev = i
	}
	s.wheel[b] = i
	e.flags |= fScheduled
}

// begin starts the wheel at the first time the Store sees.
func (s *Store) begin(nowNs int64) {
	if !s.started {
		s.started, s.wheelDone = true, sec(nowNs)-1
	}
}

func (s *Store) unschedule(i uint32, e *entry) {
	if e.flags&fScheduled == 0 {
		return
	}
	if e.wPrev != nilIdx {
		s.slab.at(e.wPrev).wNext = e.wNext
	} else {
		s.wheel[e.bucket] = e.wNext
	}
	if e.wNext != nilIdx {
		s.slab.at(e.wNext).wPrev = e.wPrev
	}
	e.flags &^= fScheduled
}

func (s *Store) pushIdle(i uint32, e *entry) {
	e.lPrev, e.lNext = s.lTail, nilIdx
	if s.lTail != nilIdx {
		s.slab.at(s.lTail).lNext = i
	} else {
		s.lHead = i
	}
	s.lTail = i
}

func (s *Store) unlinkIdle(i uint32, e *entry) {
	if e.lPrev != nilIdx {
		s.slab.at(e.lPrev).lNext = e.lNext
	} else {
		s.lHead = e.lNext
	}
	if e.lNext != nilIdx {
		s.slab.at(e.lNext).lPrev = e.lPrev
	} else {
		s.lTail = e.lPrev
	}
}

// touch moves flow i to the recent end of the idle order.
func (s *Store) touch(i uint32, e *entry) {
	if s.lTail == i {
		return
	}
	s.unlinkIdle(i, e)
	s.pushIdle(i, e)
}

// Run aggregates the batches from in and produces exported records to out,
// ticking every tick (DefaultTick if 0). When in is closed it flushes
// every flow (Flush) and returns; when ctx ends it returns at once.
//
// Records come back for reuse through out.Recycle once every reader of
// out has released them (ring.Consumer.Release): Run must be out's only
// producer, since Recycle hands them over on the producer's goroutine.
func (s *Store) Run(ctx context.Context, in <-chan flow.Batch, out *ring.Buffer[*flow.Flow], tick time.Duration) {
	pending := make([]*flow.Flow, 0, runChunk)
	// At most a buffer's worth is kept: the rest goes to the collector.
	keep := out.Cap()
	out.Recycle(func(f *flow.Flow) {
		if f.Aggregation != nil && len(s.free) < keep {
			s.free = append(s.free, f)
		}
	})
	defer out.Recycle(nil)
	s.run(ctx, in, tick, func(f *flow.Flow) { pending = append(pending, f) }, func(flushing bool) {
		// The final flush may hold far more flows than the buffer: it
		// waits for the sinks instead of lapping them (each sink's
		// consumer is closed when it stops, which ends the wait).
		out.Hand(ctx, flushing, pending...)
		clear(pending)
		pending = pending[:0]
	})
}

// RunEach is Run for a caller that consumes each exported record at once
// (encodes it, say): put gets every record, built in the same memory each
// time, which put must not keep nor use after it returns; produce is
// called after at most runChunk records, and after each batch and tick,
// to hand on what put took (flushing during the final flush, when it
// should wait for its readers rather than overwrite). No record is
// allocated per export.
func (s *Store) RunEach(ctx context.Context, in <-chan flow.Batch, tick time.Duration, put func(*flow.Flow), produce func(flushing bool)) {
	s.scratch = &exported{}
	defer func() { s.scratch = nil }()
	s.run(ctx, in, tick, put, produce)
}

// runChunk is the most records Run's emit gathers before handing them on.
const runChunk = 256

func (s *Store) run(ctx context.Context, in <-chan flow.Batch, tick time.Duration, put func(*flow.Flow), produce func(flushing bool)) {
	if tick <= 0 {
		tick = DefaultTick
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	flushing := false
	n := 0
	hand := func() {
		if n > 0 {
			produce(flushing)
			n = 0
		}
	}
	emit := func(f *flow.Flow) {
		put(f)
		if n++; n == runChunk {
			hand()
		}
	}
	for {
		select {
		case <-ctx.Done():
			hand()
			return
		case b, ok := <-in:
			if !ok {
				flushing = true
				s.Flush(emit)
				hand()
				return
			}
			now := s.o.Clock()
			for _, f := range b.Flows {
				s.Add(now, f, emit)
			}
			// Add copied what it keeps: the records can be reused.
			b.Release()
			hand()
			// Records are held for correlation by design: confirmed
			// once taken.
			b.Resolve(flow.Now)
		case <-t.C:
			s.Tick(s.o.Clock(), emit)
			hand()
		case r := <-s.queries:
			s.answer(r)
		}
	}
}
