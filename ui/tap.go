package ui

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
)

// Drop reasons of sluice_ui_flows_dropped_total.
const (
	// ReasonTapBehind: the tap fell a whole pipeline buffer behind, so the
	// UI never saw these records (the pipeline did not wait for it).
	ReasonTapBehind = "tap-behind"
	// ReasonClientBehind: a page read its stream too slowly and the UI's
	// own history overwrote records before they were sent to it.
	ReasonClientBehind = "client-behind"
	// ReasonSampled: a page was sent a sample because more records came
	// in than one event carries (MaxPerSecond).
	ReasonSampled = "sampled"
	// ReasonEdgeEvicted: the map held MaxEdges edges and forgot the one
	// seen least recently to make room.
	ReasonEdgeEvicted = "edge-evicted"
)

// Reasons of sluice_ui_requests_refused_total.
const (
	// RefusedHost: the request's Host header is not one the UI answers
	// (DNS rebinding protection; sluice.ui.allowedHosts adds names).
	RefusedHost = "host"
	// RefusedCrossOrigin: a POST (or other unsafe method) came from a
	// page of another origin.
	RefusedCrossOrigin = "cross-origin"
)

// Metrics are the UI's Prometheus series.
type Metrics struct {
	Seen    prometheus.Counter
	Sent    prometheus.Counter
	Dropped *prometheus.CounterVec // reason
	Streams prometheus.Gauge
	Traces  *prometheus.CounterVec // result
	Refused *prometheus.CounterVec // reason
}

// NewMetrics creates the series and registers them with reg when it is
// not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Seen: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_ui_flows_seen_total",
			Help: "Records the web UI's tap read from the pipeline's buffer."}),
		Sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_ui_flows_sent_total",
			Help: "Records sent to web UI pages over their event streams."}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_ui_flows_dropped_total",
			Help: "Records the web UI did not show: tap-behind (the tap fell a buffer behind the pipeline), client-behind (a page read too slowly), sampled (a page got a sample of a faster stream), edge-evicted (map edges forgotten at the cap)."},
			[]string{"reason"}),
		Streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_ui_streams_open",
			Help: "Open event streams of web UI pages."}),
		Traces: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_ui_traceflows_total",
			Help: "Traceflow requests of the web UI, by result (ok, invalid, error, busy)."}, []string{"result"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_ui_requests_refused_total",
			Help: "Requests the web UI refused: host (a Host header it does not answer, DNS rebinding protection), cross-origin (an unsafe method from another origin)."}, []string{"reason"}),
	}
	for _, r := range []string{RefusedHost, RefusedCrossOrigin} {
		m.Refused.WithLabelValues(r)
	}
	for _, r := range []string{ReasonTapBehind, ReasonClientBehind, ReasonSampled, ReasonEdgeEvicted} {
		m.Dropped.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Seen, m.Sent, m.Dropped, m.Streams, m.Traces, m.Refused)
	}
	return m
}

// entry is one record of the history: its row, and the record itself for
// the page that asks for every field (in the history, a copy of the
// pipeline's record, which the pipeline reuses once read).
type entry struct {
	row Row
	f   *flow.Flow
}

// record is the history's copy of a record, with its Aggregation.
type record struct {
	f   flow.Flow
	a   flow.Aggregation
	agg bool // f had an Aggregation
}

// history is the bounded history of recent records the tap fills and the
// pages read, each at its own position: the tap never waits for a page.
type history struct {
	mu    sync.Mutex
	items []entry
	// recs are the copies of the records of items, made on the first
	// lap and then overwritten in place.
	recs []*record
	next uint64 // sequence number of the next record (the first is 1)
}

func newHistory(n int) *history {
	return &history{items: make([]entry, n), recs: make([]*record, n), next: 1}
}

// add copies es into the history: the records of es may be reused once
// it returns.
func (h *history) add(es []entry) {
	h.mu.Lock()
	for _, e := range es {
		i := e.row.Seq % uint64(len(h.items))
		if e.f != nil {
			r := h.recs[i]
			if r == nil {
				r = &record{}
				h.recs[i] = r
			}
			r.f, r.agg = *e.f, e.f.Aggregation != nil
			r.f.Aggregation = nil
			if r.agg {
				r.a = *e.f.Aggregation
				r.f.Aggregation = &r.a
			}
			e.f = &r.f
		}
		h.items[i] = e
	}
	if len(es) > 0 {
		h.next = es[len(es)-1].row.Seq + 1
	}
	h.mu.Unlock()
}

// oldest is the sequence number of the oldest record held. Called with
// mu held.
func (h *history) oldest() uint64 {
	if n := uint64(len(h.items)); h.next > n {
		return h.next - n
	}
	return 1
}

// since returns the rows after seq (exclusive), at most max of them spread
// evenly over what is there (a sample when there are more), how many were
// overwritten before they could be read (lost) and how many the sample
// left out (skipped), and the sequence number to read from next.
func (h *history) since(seq uint64, max int) (rows []Row, lost, skipped, next uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	from := seq + 1
	if o := h.oldest(); from < o {
		lost = o - from
		from = o
	}
	n := h.next - from
	take := n
	if max > 0 && n > uint64(max) {
		take, skipped = uint64(max), n-uint64(max)
	}
	for k := range take {
		i := k * n / take // evenly spread over the n records
		rows = append(rows, h.items[(from+i)%uint64(len(h.items))].row)
	}
	return rows, lost, skipped, h.next - 1
}

// last returns up to max of the newest rows, oldest first.
func (h *history) last(max int) (rows []Row, newest uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	from := h.oldest()
	if h.next-from > uint64(max) {
		from = h.next - uint64(max)
	}
	for s := from; s < h.next; s++ {
		rows = append(rows, h.items[s%uint64(len(h.items))].row)
	}
	return rows, h.next - 1
}

// record returns a copy of the record of seq while the history still
// holds it (the history overwrites its own in place).
func (h *history) record(seq uint64) (*flow.Flow, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if seq < h.oldest() || seq >= h.next {
		return nil, false
	}
	i := seq % uint64(len(h.items))
	if h.items[i].f == nil {
		return nil, false
	}
	r := h.recs[i]
	x := &record{f: r.f, a: r.a}
	x.f.Aggregation = nil
	if r.agg {
		x.f.Aggregation = &x.a
	}
	return &x.f, true
}

// tap reads the pipeline's buffer as an observer (which the pipeline
// never waits for) into the history and the map's edges, until the
// buffer closes and is drained or ctx ends.
func (s *Server) tap(ctx context.Context) {
	c := s.o.Buffer.Observer()
	defer c.Close()
	var batch []*flow.Flow
	var es []entry
	var lost uint64
	seq := uint64(0)
	wl := &workloads{known: s.o.PodWorkload}
	for {
		var ok bool
		batch, ok = c.Next(ctx, batch[:0], 512)
		if !ok {
			return
		}
		if d := c.Lost - lost; d > 0 {
			s.m.Dropped.WithLabelValues(ReasonTapBehind).Add(float64(d))
			s.tapLost.Add(d)
			lost = c.Lost
		}
		es = es[:0]
		now := time.Now()
		for _, f := range batch {
			seq++
			e := entry{row: newRow(seq, f, wl), f: f}
			es = append(es, e)
			s.edges.add(&e.row, now)
		}
		s.m.Seen.Add(float64(len(batch)))
		s.hist.add(es)
		clear(batch) // the history holds copies; the batch need not
		c.Release(0)
	}
}

// Endpoint kinds of the map.
const (
	KindPod      = "pod"
	KindExternal = "external"
	KindEgress   = "egress"
)

// Endpoint is a node of the map at its finest grain (a Pod, an outside
// address, an Egress IP); the page groups them by namespace or workload.
type Endpoint struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	NS       string `json:"ns,omitempty"`
	Workload string `json:"wl,omitempty"`
	// WorkloadKind is the kind of the Pod's controller; "" when Workload
	// is guessed from the Pod's labels or name.
	WorkloadKind string `json:"wlKind,omitempty"`
	Pod          string `json:"pod,omitempty"`
	Node         string `json:"node,omitempty"`
	IP           string `json:"ip,omitempty"`
	Egress       string `json:"egress,omitempty"`
}

// Edge is traffic from one endpoint to another.
type Edge struct {
	From string `json:"from"`
	To   string `json:"to"`
	// Flows counts the records, Denied those a rule dropped or rejected.
	Flows  uint64 `json:"flows"`
	Denied uint64 `json:"denied"`
	Bytes  uint64 `json:"bytes"`
	// BPS is the throughput over the last window (bits per second).
	BPS      float64 `json:"bps"`
	Service  string  `json:"svc,omitempty"`
	Proto    string  `json:"proto,omitempty"`
	Port     uint16  `json:"port,omitempty"`
	LastSeen int64   `json:"lastSeen"`
}

// Graph is the map: its endpoints and edges.
type Graph struct {
	Endpoints []Endpoint `json:"endpoints"`
	Edges     []Edge     `json:"edges"`
	// Evicted counts edges forgotten at the cap.
	Evicted uint64 `json:"evicted"`
}

// rateWindow is the window of an edge's throughput.
const rateWindow = 10 * time.Second

type edgeKey struct{ from, to string }

type edgeState struct {
	Edge
	// bytes in the current and the previous window, and when the current
	// one started.
	cur, prev uint64
	winStart  time.Time
}

// edges is the map's state: bounded (max edges); the least recently seen
// edge is forgotten at the cap.
type edges struct {
	mu        sync.Mutex
	max       int
	m         map[edgeKey]*edgeState
	endpoints map[string]Endpoint
	evicted   uint64
	dropped   prometheus.Counter
	// ids are the endpoints' IDs, made once while cached (bounded as the
	// map is): the same endpoints recur record after record.
	ids map[idParts]string
}

// idParts are what an endpoint's ID is made of: prefix a "/" b, or
// prefix a when b is unset.
type idParts struct {
	prefix, a, b string
	two          bool
}

// id is the ID of parts. Called with mu held.
func (g *edges) id(p idParts) string {
	if s, ok := g.ids[p]; ok {
		return s
	}
	s := p.prefix + p.a
	if p.two {
		s += "/" + p.b
	}
	if g.ids == nil || len(g.ids) >= max(g.max, 1024) {
		g.ids = map[idParts]string{}
	}
	g.ids[p] = s
	return s
}

func newEdges(max int, dropped prometheus.Counter) *edges {
	return &edges{max: max, m: map[edgeKey]*edgeState{}, endpoints: map[string]Endpoint{}, dropped: dropped}
}

// endpoints of a row: source, destination, and the Egress IP between them
// when the traffic left through an Egress (hasEgress). Called with mu
// held.
func (g *edges) rowEndpoints(r *Row) (src, dst, egress Endpoint, hasEgress bool) {
	if r.SrcPod != "" {
		src = Endpoint{ID: g.id(idParts{"pod:", r.SrcNS, r.SrcPod, true}), Kind: KindPod, NS: r.SrcNS, Workload: r.SrcWL, WorkloadKind: r.SrcWLKind, Pod: r.SrcPod, Node: r.SrcNode, IP: r.SrcIP}
	} else {
		src = Endpoint{ID: g.id(idParts{"ip:", r.SrcIP, "", false}), Kind: KindExternal, IP: r.SrcIP}
	}
	if r.DstPod != "" {
		dst = Endpoint{ID: g.id(idParts{"pod:", r.DstNS, r.DstPod, true}), Kind: KindPod, NS: r.DstNS, Workload: r.DstWL, WorkloadKind: r.DstWLKind, Pod: r.DstPod, Node: r.DstNode, IP: r.DstIP}
	} else {
		dst = Endpoint{ID: g.id(idParts{"ip:", r.DstIP, "", false}), Kind: KindExternal, IP: r.DstIP}
	}
	if r.EgressIP != "" || r.Egress != "" {
		egress = Endpoint{ID: g.id(idParts{"egress:", r.Egress, r.EgressIP, true}), Kind: KindEgress, Egress: r.Egress, IP: r.EgressIP, Node: r.EgressN}
		hasEgress = true
	}
	return src, dst, egress, hasEgress
}

func (g *edges) add(r *Row, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	src, dst, eg, ok := g.rowEndpoints(r)
	if ok {
		g.addEdge(src, eg, r, now)
		g.addEdge(eg, dst, r, now)
		return
	}
	g.addEdge(src, dst, r, now)
}

func (g *edges) addEdge(from, to Endpoint, r *Row, now time.Time) {
	k := edgeKey{from.ID, to.ID}
	e := g.m[k]
	if e == nil {
		if len(g.m) >= g.max {
			g.evictOldest()
		}
		e = &edgeState{Edge: Edge{From: from.ID, To: to.ID, Service: r.Service, Proto: r.Proto, Port: r.DstPort}, winStart: now}
		g.m[k] = e
	}
	g.endpoints[from.ID], g.endpoints[to.ID] = from, to
	e.roll(now)
	e.Flows++
	if r.denied() {
		e.Denied++
	}
	e.Bytes += r.Delta
	e.cur += r.Delta
	e.LastSeen = now.UnixMilli()
}

// roll moves the window on.
func (e *edgeState) roll(now time.Time) {
	for now.Sub(e.winStart) >= rateWindow {
		e.prev, e.cur = e.cur, 0
		e.winStart = e.winStart.Add(rateWindow)
		if now.Sub(e.winStart) >= rateWindow { // idle for more than a window
			e.prev, e.winStart = 0, now
		}
	}
}

func (g *edges) evictOldest() {
	var oldest *edgeState
	for _, e := range g.m {
		if oldest == nil || e.LastSeen < oldest.LastSeen {
			oldest = e
		}
	}
	if oldest != nil {
		delete(g.m, edgeKey{oldest.From, oldest.To})
		g.evicted++
		g.dropped.Inc()
	}
	// Endpoints no edge names any more go too.
	used := map[string]bool{}
	for k := range g.m {
		used[k.from], used[k.to] = true, true
	}
	for id := range g.endpoints {
		if !used[id] {
			delete(g.endpoints, id)
		}
	}
}

// graph returns the map as it is now.
func (g *edges) graph(now time.Time) Graph {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := Graph{Evicted: g.evicted, Endpoints: make([]Endpoint, 0, len(g.endpoints)), Edges: make([]Edge, 0, len(g.m))}
	for _, ep := range g.endpoints {
		out.Endpoints = append(out.Endpoints, ep)
	}
	for _, e := range g.m {
		e.roll(now)
		ed := e.Edge
		span := rateWindow + now.Sub(e.winStart)
		ed.BPS = float64(e.prev+e.cur) * 8 / span.Seconds()
		out.Edges = append(out.Edges, ed)
	}
	sort.Slice(out.Endpoints, func(i, j int) bool { return out.Endpoints[i].ID < out.Endpoints[j].ID })
	sort.Slice(out.Edges, func(i, j int) bool {
		a, b := out.Edges[i], out.Edges[j]
		return a.From < b.From || a.From == b.From && a.To < b.To
	})
	return out
}
