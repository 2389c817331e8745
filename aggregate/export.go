package aggregate

import (
	"time"

	"sluice/flow"
)

// exported is an exported record and its Aggregation in one allocation.
type exported struct {
	f flow.Flow
	a flow.Aggregation
}

// export hands a snapshot of e to emit (nil discards it), then resets its
// deltas and throughputs (the totals stay, for the next throughput).
func (s *Store) export(e *entry, emit func(*flow.Flow)) {
	if emit != nil {
		var f *flow.Flow
		if x := s.scratch; x != nil {
			*x = exported{}
			f = s.snapshotInto(e, x)
		} else if r, a := s.reuse(); r != nil {
			f = s.snapshotTo(e, r, a)
		} else {
			f = s.snapshotInto(e, &exported{})
		}
		s.enrich(f, e.flags&fCorrFilled == 0)
		emit(f)
	}
	s.c.exported.Add(1)
	e.flags &^= fUpdated
	s.clearDeltas(e)
	e.tput = [nCounters]uint64{}
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// snapshot builds a fresh record from e.
func (s *Store) snapshot(e *entry) *flow.Flow { return s.snapshotInto(e, &exported{}) }

// reuse takes a record the buffer recycled (see Run) and its
// Aggregation, both zeroed, or nil when there is none.
func (s *Store) reuse() (*flow.Flow, *flow.Aggregation) {
	n := len(s.free)
	if n == 0 {
		return nil, nil
	}
	f := s.free[n-1]
	s.free[n-1] = nil
	s.free = s.free[:n-1]
	a := f.Aggregation
	*f, *a = flow.Flow{}, flow.Aggregation{}
	return f, a
}

// snapshotInto builds e's record in x, which is zero.
func (s *Store) snapshotInto(e *entry, x *exported) *flow.Flow {
	return s.snapshotTo(e, &x.f, &x.a)
}

// snapshotTo builds e's record in f and a, which are zero.
func (s *Store) snapshotTo(e *entry, f *flow.Flow, a *flow.Aggregation) *flow.Flow {
	t := &s.strs
	f.Aggregation = a
	f.Present = e.present
	f.Present.Set(flow.StartTime)
	f.Present.Set(flow.EndTime)
	f.Present[0] |= statsFields[0]
	f.Present[1] |= statsFields[1]

	f.StartTime, f.EndTime = unixTime(e.start), unixTime(e.end)
	f.EndReason = e.endReason
	misc := &s.tups.vals[e.grp[gMisc]]
	f.SourceIP, f.DestinationIP = e.key.srcAddr(), e.key.dstAddr()
	f.SourcePort, f.DestinationPort = e.key.sport(), e.key.dport()
	if e.flags&fSrcIP != 0 {
		f.SourceIP, f.SourcePort = t.addr(misc.s[pSrcIP]), uint16(misc.w>>16)
	}
	f.Protocol = e.key.proto()
	f.TCPState = t.str(e.tcp)
	f.Stats, f.ReverseStats = s.stat(e, cCommon), s.stat(e, cCommonRev)
	f.FlowType = e.flowType

	g := &s.tups.vals[e.grp[gSrcPod]]
	f.SourcePodNamespace = t.str(g.s[pNamespace])
	f.SourcePodName = t.str(g.s[pName])
	f.SourcePodUID = t.uid(g.s[pUID])
	f.SourceNodeName = t.str(g.s[pNode])
	f.SourceNodeUID = t.uid(g.s[pNodeUID])
	g = &s.tups.vals[e.grp[gDstPod]]
	f.DestinationPodNamespace = t.str(g.s[pNamespace])
	f.DestinationPodName = t.str(g.s[pName])
	f.DestinationPodUID = t.uid(g.s[pUID])
	f.DestinationNodeName = t.str(g.s[pNode])
	f.DestinationNodeUID = t.uid(g.s[pNodeUID])
	g = &s.tups.vals[e.grp[gService]]
	f.DestinationClusterIP = t.addr(g.s[pClusterIP])
	f.DestinationServiceIP = t.addr(g.s[pServiceIP])
	f.DestinationServicePort = uint16(g.w)
	f.DestinationServicePortName = t.str(g.s[pPortName])
	f.DestinationServiceUID = t.uid(g.s[pServiceUID])
	f.Ingress = s.policy(e.grp[gIngress])
	f.Egress = s.policy(e.grp[gEgress])
	g = &s.tups.vals[e.grp[gEgressGW]]
	f.EgressName = t.str(g.s[pEgressName])
	f.EgressIP = t.addr(g.s[pEgressIP])
	f.EgressNodeName = t.str(g.s[pEgressNode])
	f.EgressNodeUID = t.uid(g.s[pEgressNodeUID])
	f.EgressUID = t.uid(g.s[pEgressUID])
	f.AppProtocolName = t.str(misc.s[pAppProtocol])
	f.HTTPVals = t.str(misc.s[pHTTPVals])
	f.ProxySnatIP = t.addr(misc.s[pSnatIP])
	f.ProxySnatPort = uint16(misc.w)

	a.EndFromSource, a.EndFromDestination = unixTime(e.endSrc), unixTime(e.endDst)
	a.StatsFromSource, a.ReverseStatsFromSource = s.stat(e, cSrc), s.stat(e, cSrcRev)
	a.StatsFromDestination, a.ReverseStatsFromDestination = s.stat(e, cDst), s.stat(e, cDstRev)
	a.Throughput, a.ReverseThroughput = e.tput[cCommon], e.tput[cCommonRev]
	a.ThroughputFromSource, a.ReverseThroughputFromSource = e.tput[cSrc], e.tput[cSrcRev]
	a.ThroughputFromDestination, a.ReverseThroughputFromDestination = e.tput[cDst], e.tput[cDstRev]
	return f
}

// policy is the policy of tuple id.
func (s *Store) policy(id uint32) flow.Policy {
	t, g := &s.strs, &s.tups.vals[id]
	return flow.Policy{
		Type:       uint8(g.w),
		Namespace:  t.str(g.s[pNamespace]),
		Name:       t.str(g.s[pName]),
		UID:        t.uid(g.s[pUID]),
		RuleName:   t.str(g.s[pRule]),
		RuleAction: uint8(g.w >> 8),
	}
}

// enrich completes an exported record from the Kubernetes store; lookup
// names the Pods of a flow that skipped correlation.
func (s *Store) enrich(f *flow.Flow, lookup bool) {
	if s.o.Enricher != nil {
		s.o.Enricher.Enrich(f, lookup)
	}
}
