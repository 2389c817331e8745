package aggregate

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"sluice/flow"
)

// model is a naive implementation of the same rules: a map of full
// records, a linear scan for expiry and eviction. The randomized test runs
// it side by side with the Store to check the compact machinery (index,
// wheel, idle order, interning), not the reading of the rules.
type model struct {
	active, inactive int64 // seconds
	maxFlows         int
	oneSided         bool
	flows            map[mkey]*mflow
	seq              int64
	st               Stats
}

type mkey struct {
	src, dst     netip.Addr
	sport, dport uint16
	proto        uint8
}

type mflow struct {
	f                          flow.Flow
	a                          flow.Aggregation
	ready, updated, corrFilled bool
	side                       side
	retries                    int
	active, inactive           int64
	seen                       int64
}

func (m *model) add(now int64, f *flow.Flow, out *[]*flow.Flow) {
	m.st.RecordsIn++
	if !f.Present.Has(flow.StartTime) || !f.Present.Has(flow.EndTime) {
		m.st.RecordsInvalid++
		return
	}
	ingressHalf := f.FlowType == flow.FlowTypeFromExternal && f.DestinationPodName == "" && f.ProxySnatIP.IsValid()
	denied := f.Egress.RuleAction == flow.ActionDrop || f.Egress.RuleAction == flow.ActionReject || f.Ingress.RuleAction == flow.ActionReject
	corr := !denied && (f.FlowType == flow.FlowTypeInterNode || ingressHalf)
	sd := sideUnknown
	if f.SourcePodName != "" && f.DestinationPodName == "" || ingressHalf {
		sd = sideSrc
	} else if f.DestinationPodName != "" && f.SourcePodName == "" {
		sd = sideDst
	}
	k := mkey{f.SourceIP, f.DestinationIP, f.SourcePort, f.DestinationPort, f.Protocol}
	if ingressHalf {
		k.src, k.sport = f.ProxySnatIP, f.ProxySnatPort
	}
	m.seq++
	fillSrc, fillDst := true, true
	if corr {
		fillSrc, fillDst = sd == sideSrc, sd != sideSrc
	}
	e := m.flows[k]
	if e == nil {
		if len(m.flows) >= m.maxFlows {
			var old mkey
			var oe *mflow
			for k, e := range m.flows {
				if oe == nil || e.seen < oe.seen {
					old, oe = k, e
				}
			}
			m.finish(oe, out)
			m.st.Evicted++
			delete(m.flows, old)
		}
		e = &mflow{f: *f, side: sd, updated: true, seen: m.seq, inactive: now + m.inactive}
		e.f.Present = flow.Fields{}
		var tp, rtp uint64
		if d := f.EndTime.Unix() - f.StartTime.Unix(); d > 0 {
			tp, rtp = f.Stats.OctetTotalCount*8/uint64(d), f.ReverseStats.OctetTotalCount*8/uint64(d)
		}
		e.a.Throughput, e.a.ReverseThroughput = tp, rtp
		if fillSrc {
			e.a.StatsFromSource, e.a.ReverseStatsFromSource, e.a.EndFromSource = f.Stats, f.ReverseStats, f.EndTime
			e.a.ThroughputFromSource, e.a.ReverseThroughputFromSource = tp, rtp
		}
		if fillDst {
			e.a.StatsFromDestination, e.a.ReverseStatsFromDestination, e.a.EndFromDestination = f.Stats, f.ReverseStats, f.EndTime
			e.a.ThroughputFromDestination, e.a.ReverseThroughputFromDestination = tp, rtp
		}
		e.ready = !corr
		e.corrFilled = !corr && f.FlowType != flow.FlowTypeInterNode
		e.active = now + m.active
		if e.ready {
			e.active = now
		}
		m.flows[k] = e
		return
	}
	if corr && !e.ready && !(sd != sideUnknown && sd == e.side) {
		g := &e.f
		cp := func(dst *string, v string) {
			if v != "" {
				*dst = v
			}
		}
		cpu := func(dst *flow.UID, v flow.UID) {
			if v != (flow.UID{}) {
				*dst = v
			}
		}
		cpa := func(dst *netip.Addr, v netip.Addr) {
			if v.IsValid() {
				*dst = v
			}
		}
		cp8 := func(dst *uint8, v uint8) {
			if v != 0 {
				*dst = v
			}
		}
		cp(&g.SourcePodNamespace, f.SourcePodNamespace)
		cp(&g.SourcePodName, f.SourcePodName)
		cpu(&g.SourcePodUID, f.SourcePodUID)
		cp(&g.SourceNodeName, f.SourceNodeName)
		cpu(&g.SourceNodeUID, f.SourceNodeUID)
		cp(&g.DestinationPodNamespace, f.DestinationPodNamespace)
		cp(&g.DestinationPodName, f.DestinationPodName)
		cpu(&g.DestinationPodUID, f.DestinationPodUID)
		cp(&g.DestinationNodeName, f.DestinationNodeName)
		cpu(&g.DestinationNodeUID, f.DestinationNodeUID)
		cpa(&g.DestinationClusterIP, f.DestinationClusterIP)
		cpa(&g.DestinationServiceIP, f.DestinationServiceIP)
		if f.DestinationServicePort != 0 {
			g.DestinationServicePort = f.DestinationServicePort
		}
		cp(&g.DestinationServicePortName, f.DestinationServicePortName)
		cpu(&g.DestinationServiceUID, f.DestinationServiceUID)
		for _, p := range [][2]*flow.Policy{{&g.Ingress, &f.Ingress}, {&g.Egress, &f.Egress}} {
			cp8(&p[0].Type, p[1].Type)
			cp(&p[0].Namespace, p[1].Namespace)
			cp(&p[0].Name, p[1].Name)
			cpu(&p[0].UID, p[1].UID)
			cp(&p[0].RuleName, p[1].RuleName)
			cp8(&p[0].RuleAction, p[1].RuleAction)
		}
		cp(&g.EgressName, f.EgressName)
		cpa(&g.EgressIP, f.EgressIP)
		cp(&g.EgressNodeName, f.EgressNodeName)
		cpu(&g.EgressNodeUID, f.EgressNodeUID)
		cpu(&g.EgressUID, f.EgressUID)
		if ingressHalf {
			g.SourceIP, g.SourcePort = f.SourceIP, f.SourcePort
			g.ProxySnatIP, g.ProxySnatPort = f.ProxySnatIP, f.ProxySnatPort
			g.FlowType = flow.FlowTypeFromExternal
		}
		e.ready, e.corrFilled, e.active = true, true, now
		m.st.Correlated++
	}
	m.aggregate(e, f, fillSrc, fillDst)
	e.updated, e.inactive, e.seen = true, now+m.inactive, m.seq
}

func (m *model) aggregate(e *mflow, f *flow.Flow, fillSrc, fillDst bool) {
	g, a := &e.f, &e.a
	in := f.EndTime.Unix()
	latest := in >= g.EndTime.Unix()
	if latest {
		g.EndTime = f.EndTime
	}
	type sideRef struct {
		end      *time.Time
		st, rst  *flow.Stats
		tp, rtp  *uint64
		fill     bool
		dt, prev int64
	}
	sides := []*sideRef{
		{end: &a.EndFromSource, st: &a.StatsFromSource, rst: &a.ReverseStatsFromSource, tp: &a.ThroughputFromSource, rtp: &a.ReverseThroughputFromSource, fill: fillSrc},
		{end: &a.EndFromDestination, st: &a.StatsFromDestination, rst: &a.ReverseStatsFromDestination, tp: &a.ThroughputFromDestination, rtp: &a.ReverseThroughputFromDestination, fill: fillDst},
	}
	for _, s := range sides {
		if !s.fill {
			continue
		}
		// A side's first record is never stale (see Store.aggregate).
		first := s.end.IsZero()
		s.prev = f.StartTime.Unix()
		if !first {
			s.prev = s.end.Unix()
		}
		*s.end = f.EndTime
		if in <= s.prev && !first {
			m.st.RecordsStale++
			return
		}
		s.dt = in - s.prev
	}
	if g.EndReason != 3 {
		g.EndReason = f.EndReason
	}
	if latest {
		g.TCPState = f.TCPState
	}
	for _, s := range sides {
		if !s.fill {
			continue
		}
		var tp, rtp uint64
		if s.dt > 0 {
			tp = sub(f.Stats.OctetTotalCount, s.st.OctetTotalCount) * 8 / uint64(s.dt)
			rtp = sub(f.ReverseStats.OctetTotalCount, s.rst.OctetTotalCount) * 8 / uint64(s.dt)
		}
		s.st.PacketTotalCount, s.st.OctetTotalCount = f.Stats.PacketTotalCount, f.Stats.OctetTotalCount
		s.st.PacketDeltaCount += f.Stats.PacketDeltaCount
		s.st.OctetDeltaCount += f.Stats.OctetDeltaCount
		s.rst.PacketTotalCount, s.rst.OctetTotalCount = f.ReverseStats.PacketTotalCount, f.ReverseStats.OctetTotalCount
		s.rst.PacketDeltaCount += f.ReverseStats.PacketDeltaCount
		s.rst.OctetDeltaCount += f.ReverseStats.OctetDeltaCount
		*s.tp, *s.rtp = tp, rtp
		if latest {
			g.Stats.PacketTotalCount = max(g.Stats.PacketTotalCount, s.st.PacketTotalCount)
			g.Stats.OctetTotalCount = max(g.Stats.OctetTotalCount, s.st.OctetTotalCount)
			g.Stats.PacketDeltaCount, g.Stats.OctetDeltaCount = s.st.PacketDeltaCount, s.st.OctetDeltaCount
			g.ReverseStats.PacketTotalCount = max(g.ReverseStats.PacketTotalCount, s.rst.PacketTotalCount)
			g.ReverseStats.OctetTotalCount = max(g.ReverseStats.OctetTotalCount, s.rst.OctetTotalCount)
			g.ReverseStats.PacketDeltaCount, g.ReverseStats.OctetDeltaCount = s.rst.PacketDeltaCount, s.rst.OctetDeltaCount
			a.Throughput, a.ReverseThroughput = tp, rtp
		}
	}
}

func (m *model) export(e *mflow, out *[]*flow.Flow) {
	f := e.f
	a := e.a
	f.Aggregation = &a
	*out = append(*out, &f)
	m.st.Exported++
	e.updated = false
	for _, s := range []*flow.Stats{&e.f.Stats, &e.f.ReverseStats, &e.a.StatsFromSource, &e.a.ReverseStatsFromSource,
		&e.a.StatsFromDestination, &e.a.ReverseStatsFromDestination} {
		s.PacketDeltaCount, s.OctetDeltaCount = 0, 0
	}
	e.a.Throughput, e.a.ReverseThroughput = 0, 0
	e.a.ThroughputFromSource, e.a.ReverseThroughputFromSource = 0, 0
	e.a.ThroughputFromDestination, e.a.ReverseThroughputFromDestination = 0, 0
}

func (m *model) finish(e *mflow, out *[]*flow.Flow) {
	switch {
	case !e.ready && m.oneSided:
		m.export(e, out)
		m.st.OneSidedExported++
	case !e.ready:
		m.st.OneSidedDropped++
	case e.updated:
		m.export(e, out)
	}
}

func (m *model) tick(now int64, out *[]*flow.Flow) {
	for k, e := range m.flows {
		if min(e.active, e.inactive) > now {
			continue
		}
		if !e.ready {
			e.retries++
			if e.retries > MaxRetries {
				m.finish(e, out)
				delete(m.flows, k)
				continue
			}
			e.active, e.inactive = now+m.active, now+m.inactive
			continue
		}
		if e.updated {
			m.export(e, out)
		}
		if e.inactive <= now {
			m.st.Expired++
			delete(m.flows, k)
		} else if e.active <= now {
			e.active = now + m.active
		}
	}
}

// conn is one generated connection and what each Node reported so far.
type conn struct {
	id     int
	kind   int
	start  int
	totals [2]counts
}

const (
	kInter = iota
	kEgressDeny
	kIngressReject
	kIngressDrop
	kIntra
	kToExternal
	kFromExternal2
	kFromExternal1
	nKinds
)

func (c *conn) record(r *rand.Rand, now int) *flow.Flow {
	node := r.IntN(2)
	end := max(c.start, now-r.IntN(4))
	if r.IntN(50) == 0 {
		end = c.start // a record with no duration
	}
	t := &c.totals[node]
	dp, do := uint64(r.IntN(5)), uint64(r.IntN(500))
	rdp, rdo := uint64(r.IntN(5)), uint64(r.IntN(500))
	if c.id%5 == 0 {
		// Packet counts past 32 bits, in totals and in deltas summed
		// over records (the store keeps 32 bits unless they outgrow it).
		dp, rdp = dp<<31, rdp<<30
	}
	t.pkts, t.octets, t.dpkts, t.doctets = t.pkts+dp, t.octets+do, dp, do
	t.rpkts, t.roctets, t.rdpkts, t.rdoctets = t.rpkts+rdp, t.roctets+rdo, rdp, rdo
	f := &flow.Flow{
		StartTime: at(c.start), EndTime: at(end), EndReason: uint8(1 + r.IntN(3)),
		SourceIP: netip.AddrFrom4([4]byte{10, 0, 1, byte(c.id)}), DestinationIP: netip.AddrFrom4([4]byte{10, 0, 2, byte(c.id)}),
		Protocol: 6, SourcePort: uint16(10000 + c.id), DestinationPort: 80,
		TCPState: []string{"ESTABLISHED", "SYN_SENT", "TIME_WAIT", ""}[r.IntN(4)],
		FlowType: flow.FlowTypeInterNode,
	}
	t.apply(f)
	pod := func(i int) string { return fmt.Sprintf("pod-%d", (c.id+i)%7) }
	if r.IntN(20) == 0 {
		pod = func(i int) string { return fmt.Sprintf("renamed-%d", r.IntN(3)) }
	}
	srcSide := func() {
		f.SourcePodNamespace, f.SourcePodName, f.SourceNodeName = "ns-a", pod(0), "node-1"
		f.DestinationServicePort, f.DestinationServicePortName = 80, "ns-b/web:http"
		f.DestinationClusterIP = clusterIP
		f.Egress = flow.Policy{Type: 2, Namespace: "ns-a", Name: "out", RuleAction: flow.ActionAllow}
		f.SourcePodUID[0] = byte(c.id)
	}
	dstSide := func() {
		f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName = "ns-b", pod(1), "node-2"
		f.Ingress = flow.Policy{Type: 3, Name: "in", RuleName: "r", RuleAction: flow.ActionAllow}
	}
	switch c.kind {
	case kInter, kIngressDrop:
		if node == 0 {
			srcSide()
		} else {
			dstSide()
			if c.kind == kIngressDrop {
				f.Ingress.RuleAction = flow.ActionDrop
			}
		}
	case kEgressDeny:
		srcSide()
		f.Egress.RuleAction = flow.ActionReject
	case kIngressReject:
		dstSide()
		f.Ingress.RuleAction = flow.ActionReject
	case kIntra:
		srcSide()
		dstSide()
		f.FlowType = flow.FlowTypeIntraNode
	case kToExternal:
		srcSide()
		f.FlowType = flow.FlowTypeToExternal
		f.EgressName, f.EgressIP = "eg", netip.MustParseAddr("192.0.2.1")
	case kFromExternal2:
		snat, sport := netip.AddrFrom4([4]byte{10, 0, 0, 1}), uint16(61000+c.id)
		if node == 0 {
			f.FlowType = flow.FlowTypeFromExternal
			f.SourceIP = netip.AddrFrom4([4]byte{203, 0, 113, byte(c.id)})
			f.ProxySnatIP, f.ProxySnatPort = snat, sport
		} else {
			f.SourceIP, f.SourcePort = snat, sport
			dstSide()
		}
	case kFromExternal1:
		f.FlowType = flow.FlowTypeFromExternal
		f.SourceIP = netip.AddrFrom4([4]byte{203, 0, 113, byte(c.id)})
		dstSide()
	}
	mark(f)
	if f.SourcePodUID != (flow.UID{}) {
		f.Present.Set(flow.SourcePodUID)
	}
	if r.IntN(100) == 0 {
		f.Present.Clear(flow.EndTime)
	}
	return f
}

// normalize makes exported records comparable: presence and the
// allocation of the Aggregation aside.
func normalize(fs []*flow.Flow) []flow.Flow {
	out := make([]flow.Flow, len(fs))
	for i, f := range fs {
		g := *f
		g.Present = flow.Fields{}
		g.Aggregation = nil
		out[i] = g
		if f.Aggregation != nil {
			a := *f.Aggregation
			out[i].Aggregation = &a
		}
	}
	slices.SortFunc(out, func(a, b flow.Flow) int {
		return cmp.Or(a.SourceIP.Compare(b.SourceIP), cmp.Compare(a.SourcePort, b.SourcePort), a.DestinationIP.Compare(b.DestinationIP))
	})
	return out
}

func TestAgainstModel(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			o := Options{ActiveTimeout: time.Duration(2+r.IntN(6)) * time.Second, InactiveTimeout: time.Duration(4+r.IntN(15)) * time.Second,
				MaxFlows: 5 + r.IntN(40), ExportOneSided: seed%2 == 0}
			s := New(o)
			m := &model{active: int64(o.ActiveTimeout / time.Second), inactive: int64(o.InactiveTimeout / time.Second),
				maxFlows: o.MaxFlows, oneSided: o.ExportOneSided, flows: map[mkey]*mflow{}}
			conns := make([]*conn, 60)
			for i := range conns {
				conns[i] = &conn{id: i + 1, kind: r.IntN(nKinds)}
			}
			var got, want []*flow.Flow
			emit := func(f *flow.Flow) { got = append(got, f) }
			check := func(what string) {
				t.Helper()
				g, w := normalize(got), normalize(want)
				if !reflect.DeepEqual(g, w) {
					t.Fatalf("%s: store exported %d records, model %d\nstore %+v\nmodel %+v", what, len(g), len(w), g, w)
				}
				got, want = got[:0], want[:0]
				if s.Len() != len(m.flows) {
					t.Fatalf("%s: store holds %d flows, model %d", what, s.Len(), len(m.flows))
				}
			}
			for now := 1; now < 600; now++ {
				for range r.IntN(8) {
					c := conns[r.IntN(len(conns))]
					if c.start == 0 || r.IntN(40) == 0 {
						// A new connection on the same tuple.
						c.start, c.totals = now-r.IntN(3), [2]counts{}
					}
					f := c.record(r, now)
					s.Add(at(now), f, emit)
					m.add(int64(t0.Unix())+int64(now), f, &want)
				}
				check(fmt.Sprintf("adds at %d", now))
				s.Tick(at(now), emit)
				m.tick(int64(t0.Unix())+int64(now), &want)
				check(fmt.Sprintf("tick at %d", now))
				if r.IntN(25) == 0 {
					now += r.IntN(30) // a pause in the ticks
				}
			}
			s.Flush(emit)
			for _, e := range m.flows {
				m.finish(e, &want)
			}
			clear(m.flows)
			check("flush")
			m.st.Flows = 0
			st := s.Stats()
			if pageShift > 9 && st.TableBytes == 0 { // mapped outside the heap
				t.Errorf("no table bytes reported for a table of %d pages", len(s.slab.pages))
			}
			st.TableBytes = 0 // the model has no table
			if st != m.st {
				t.Errorf("stats\nstore %+v\nmodel %+v", st, m.st)
			}
			if n, g := s.strs.live(), s.tups.live(); n != 0 || g != 0 {
				t.Errorf("%d interned values and %d tuples left", n, g)
			}
			if len(s.wide) == 0 || len(s.wideFree) != len(s.wide) {
				t.Errorf("wide counters: %d slots, %d free after the flush; want some, all free", len(s.wide), len(s.wideFree))
			}
		})
	}
}
