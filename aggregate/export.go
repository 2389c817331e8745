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
	for c := range e.stats {
		e.stats[c].PacketDeltaCount, e.stats[c].OctetDeltaCount = 0, 0
	}
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
	f.SourceIP, f.DestinationIP = e.key.srcAddr(), e.key.dstAddr()
	f.SourcePort, f.DestinationPort = e.key.sport(), e.key.dport()
	if e.flags&fSrcIP != 0 {
		f.SourceIP, f.SourcePort = t.addr(e.str[sSrcIP]), e.srcPort
	}
	f.Protocol = e.key.proto()
	f.TCPState = t.str(e.str[sTCPState])
	f.Stats, f.ReverseStats = e.stats[cCommon], e.stats[cCommonRev]
	f.FlowType = e.flowType

	f.SourcePodNamespace = t.str(e.str[sSrcPodNamespace])
	f.SourcePodName = t.str(e.str[sSrcPodName])
	f.SourcePodUID = t.uid(e.str[sSrcPodUID])
	f.SourceNodeName = t.str(e.str[sSrcNodeName])
	f.SourceNodeUID = t.uid(e.str[sSrcNodeUID])
	f.DestinationPodNamespace = t.str(e.str[sDstPodNamespace])
	f.DestinationPodName = t.str(e.str[sDstPodName])
	f.DestinationPodUID = t.uid(e.str[sDstPodUID])
	f.DestinationNodeName = t.str(e.str[sDstNodeName])
	f.DestinationNodeUID = t.uid(e.str[sDstNodeUID])
	f.DestinationClusterIP = t.addr(e.str[sClusterIP])
	f.DestinationServiceIP = t.addr(e.str[sServiceIP])
	f.DestinationServicePort = e.servicePort
	f.DestinationServicePortName = t.str(e.str[sServicePortName])
	f.DestinationServiceUID = t.uid(e.str[sServiceUID])
	f.Ingress = flow.Policy{
		Type:       e.ingType,
		Namespace:  t.str(e.str[sIngNamespace]),
		Name:       t.str(e.str[sIngName]),
		UID:        t.uid(e.str[sIngUID]),
		RuleName:   t.str(e.str[sIngRule]),
		RuleAction: e.ingAc,
	}
	f.Egress = flow.Policy{
		Type:       e.egType,
		Namespace:  t.str(e.str[sEgNamespace]),
		Name:       t.str(e.str[sEgName]),
		UID:        t.uid(e.str[sEgUID]),
		RuleName:   t.str(e.str[sEgRule]),
		RuleAction: e.egAc,
	}
	f.EgressName = t.str(e.str[sEgressName])
	f.EgressIP = t.addr(e.str[sEgressIP])
	f.EgressNodeName = t.str(e.str[sEgressNodeName])
	f.EgressNodeUID = t.uid(e.str[sEgressNodeUID])
	f.EgressUID = t.uid(e.str[sEgressUID])
	f.AppProtocolName = t.str(e.str[sAppProtocol])
	f.HTTPVals = t.str(e.str[sHTTPVals])
	f.ProxySnatIP = t.addr(e.str[sSnatIP])
	f.ProxySnatPort = e.snatPort

	a.EndFromSource, a.EndFromDestination = unixTime(e.endSrc), unixTime(e.endDst)
	a.StatsFromSource, a.ReverseStatsFromSource = e.stats[cSrc], e.stats[cSrcRev]
	a.StatsFromDestination, a.ReverseStatsFromDestination = e.stats[cDst], e.stats[cDstRev]
	a.Throughput, a.ReverseThroughput = e.tput[cCommon], e.tput[cCommonRev]
	a.ThroughputFromSource, a.ReverseThroughputFromSource = e.tput[cSrc], e.tput[cSrcRev]
	a.ThroughputFromDestination, a.ReverseThroughputFromDestination = e.tput[cDst], e.tput[cDstRev]
	return f
}

// enrich completes an exported record from the Kubernetes store; lookup
// names the Pods of a flow that skipped correlation.
func (s *Store) enrich(f *flow.Flow, lookup bool) {
	if s.o.Enricher != nil {
		s.o.Enricher.Enrich(f, lookup)
	}
}
