// Package attribution says which NetworkPolicy rules and which Egress act
// on the exporter's connections. It holds the datapath model that
// `sluice traceflow` runs (traceflow/pipeline), built from the same
// cluster objects, and asks it, through tracer.Decide, what the first
// packet of each new connection meets: there is one policy engine, the
// model's flows.
//
// Verdicts are cached in a bounded map keyed by what the model's decision
// depends on (addresses, protocol, destination port: no modelled policy
// matches a source port), and stamped with the model's generation: a
// connection keeps its verdict until the model changes (any object of the
// cluster state: a Pod's labels move it in and out of selectors), then
// asks again at its next export.
package attribution

import (
	"container/list"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"sluice/flow"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// DefaultMaxEntries bounds the verdict cache by default.
const DefaultMaxEntries = 65_536

// Tag is the Traceflow dataplane tag of the attribution model's flows:
// the model is the pipeline as a Traceflow with that tag sees it, so that
// every Node reports what it did with the packet.
const Tag = 1

// NetworkPolicyType codes of the records' …NetworkPolicyType elements.
const (
	PolicyTypeK8s       uint8 = 1
	PolicyTypeAntreaNP  uint8 = 2
	PolicyTypeAntreaCNP uint8 = 3
)

// Key is what a verdict depends on.
type Key struct {
	Src, Dst netip.Addr
	Proto    uint8
	DstPort  uint16
}

// Verdict is a connection's attribution in the exporter's terms: the
// policy of each direction as the records carry it, and the Egress.
type Verdict struct {
	// Gen is the model generation the verdict was computed at.
	Gen uint64
	// Egress and Ingress are the policies (RuleAction 0 when none).
	Egress, Ingress flow.Policy
	// Denied says a policy drops or rejects the connection's packets.
	Denied bool
	// EgressName, EgressIP and EgressNode are the Egress the connection
	// leaves the cluster through.
	EgressName string
	EgressIP   netip.Addr
	EgressNode string
	// EgressIPText is EgressIP as text (how IPFIX carries it), rendered
	// once for every record that carries the verdict.
	EgressIPText string
}

// Stats are an Attributor's counters.
type Stats struct {
	Generation uint64
	// Lookups by result: cache hits, verdicts computed, failures (the
	// model could not run the packet; the connection gets no attribution).
	Hits, Computed, Errors uint64
	// Evicted counts verdicts pushed out of the full cache.
	Evicted uint64
	// Entries is the cache's size now.
	Entries int
	// LoadErrors counts the Loader's loads that failed (the source could
	// not be read, or its state not modelled); the previous model stayed.
	LoadErrors uint64
	// CatchUps counts the loads CatchUp asked for (the model was behind
	// the cluster state); CatchUpTimeouts those not done within its wait.
	CatchUps, CatchUpTimeouts uint64
	// Watch is the live cluster's watch (zero without one).
	Watch WatchStats
}

// WatchStats describe the watch of a live cluster that feeds the model.
type WatchStats struct {
	// Events counts the objects' add, update and delete notifications.
	Events uint64
	// Errors counts failed lists and dropped watches (retried).
	Errors uint64
	// Objects is the number of objects the watch holds.
	Objects int
}

// Options configures an Attributor.
type Options struct {
	// MaxEntries bounds the verdict cache; DefaultMaxEntries if 0.
	MaxEntries int
	Log        *slog.Logger
}

type modelGen struct {
	m   *pipeline.Model
	gen uint64
}

type cacheEntry struct {
	k Key
	v *Verdict
}

// Attributor answers verdicts from the current model. Safe for concurrent
// use: the exporter asks, a loader replaces the model.
type Attributor struct {
	o   Options
	cur atomic.Pointer[modelGen]

	mu    sync.Mutex // guards the cache
	cache map[Key]*list.Element
	lru   list.List // front: most recent

	hits, computed, errs, evicted atomic.Uint64
	loadErrors                    atomic.Uint64
	catchUps, catchUpTimeouts     atomic.Uint64
	watch                         atomic.Pointer[func() WatchStats]
	loader                        atomic.Pointer[Loader]
}

// SetWatchStats says where Stats reads the live cluster watch's counters.
func (a *Attributor) SetWatchStats(f func() WatchStats) { a.watch.Store(&f) }

// New returns an Attributor without a model: every verdict is nil until
// SetModel gives it one.
func New(o Options) *Attributor {
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Attributor{o: o, cache: map[Key]*list.Element{}}
}

// SetModel replaces the model (built with Tag) and starts a generation:
// cached verdicts are forgotten and connections ask again.
func (a *Attributor) SetModel(m *pipeline.Model) {
	var gen uint64 = 1
	if old := a.cur.Load(); old != nil {
		gen = old.gen + 1
	}
	a.mu.Lock()
	a.cur.Store(&modelGen{m: m, gen: gen})
	clear(a.cache)
	a.lru.Init()
	a.mu.Unlock()
}

// CatchUp makes the model current before connections are judged: when
// the cluster state changed after the Loader's last load began (a Pod, a
// policy, a label the model does not hold yet), it has the Loader's
// Follow load at once, instead of at its next interval, and waits for
// that load for at most max. Without it, a connection that starts and
// ends between a change and the next load (a new Pod's first requests)
// is judged by the model from before the change, and keeps that verdict.
// It returns at once when the model is current, or when no Loader that
// tracks its source's changes (TrackChanges) is following (Follow).
func (a *Attributor) CatchUp(ctx context.Context, max time.Duration) {
	l := a.loader.Load()
	if l == nil || !l.behind() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	a.catchUps.Add(1)
	if !l.catchUp(ctx) {
		a.catchUpTimeouts.Add(1)
	}
}

// Behind reports whether CatchUp would ask for a load.
func (a *Attributor) Behind() bool {
	l := a.loader.Load()
	return l != nil && l.behind()
}

// Generation is the current model's generation, 0 before the first.
func (a *Attributor) Generation() uint64 {
	if c := a.cur.Load(); c != nil {
		return c.gen
	}
	return 0
}

// Stats returns the counters.
func (a *Attributor) Stats() Stats {
	a.mu.Lock()
	n := len(a.cache)
	a.mu.Unlock()
	s := Stats{Generation: a.Generation(), Hits: a.hits.Load(), Computed: a.computed.Load(), Errors: a.errs.Load(),
		Evicted: a.evicted.Load(), Entries: n, LoadErrors: a.loadErrors.Load(),
		CatchUps: a.catchUps.Load(), CatchUpTimeouts: a.catchUpTimeouts.Load()}
	if f := a.watch.Load(); f != nil {
		s.Watch = (*f)()
	}
	return s
}

// Verdict returns k's verdict under the current model: from the cache, or
// computed and cached. It is nil when there is no model or the model
// cannot tell (neither end is a Pod it knows, or the run failed).
func (a *Attributor) Verdict(ctx context.Context, k Key) *Verdict {
	cur := a.cur.Load()
	if cur == nil {
		return nil
	}
	a.mu.Lock()
	if el, ok := a.cache[k]; ok {
		a.lru.MoveToFront(el)
		v := el.Value.(*cacheEntry).v
		a.mu.Unlock()
		if v.Gen == cur.gen {
			a.hits.Add(1)
			return v
		}
	} else {
		a.mu.Unlock()
	}
	v, err := decide(ctx, cur, k)
	if err != nil {
		if !errors.Is(err, tracer.ErrNotModelled) {
			a.errs.Add(1)
			a.o.Log.Debug("no attribution for a connection", "src", k.Src, "dst", k.Dst, "proto", k.Proto, "port", k.DstPort, "err", err)
		}
		v = &Verdict{Gen: cur.gen} // remembered, so the model is not asked again
	} else {
		a.computed.Add(1)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur.Load() != cur {
		return v // a new model arrived meanwhile; do not cache a stale verdict
	}
	if el, ok := a.cache[k]; ok {
		el.Value.(*cacheEntry).v = v
		a.lru.MoveToFront(el)
		return v
	}
	for len(a.cache) >= a.o.MaxEntries {
		old := a.lru.Back()
		a.lru.Remove(old)
		delete(a.cache, old.Value.(*cacheEntry).k)
		a.evicted.Add(1)
	}
	a.cache[k] = a.lru.PushFront(&cacheEntry{k: k, v: v})
	return v
}

func decide(ctx context.Context, cur *modelGen, k Key) (*Verdict, error) {
	tv, err := tracer.Decide(ctx, cur.m, tracer.Connection{Src: k.Src, Dst: k.Dst, Proto: k.Proto, SrcPort: 32768, DstPort: k.DstPort})
	if err != nil {
		return nil, err
	}
	v := &Verdict{Gen: cur.gen, Denied: tv.Denied, EgressName: tv.EgressName, EgressIP: tv.EgressIP, EgressNode: tv.EgressNode}
	if v.EgressIP.IsValid() {
		v.EgressIPText = v.EgressIP.String()
	}
	if tv.Egress != nil {
		v.Egress = policy(&tv.Egress.Rule)
	}
	if tv.Ingress != nil {
		v.Ingress = policy(&tv.Ingress.Rule)
	}
	return v, nil
}

// policy converts a model rule to the record's policy fields.
func policy(r *pipeline.RuleRef) flow.Policy {
	p := flow.Policy{Namespace: r.Namespace, Name: r.Name, RuleName: r.Rule}
	switch r.PolicyType {
	case crd.K8sNetworkPolicyType:
		p.Type = PolicyTypeK8s
	case crd.AntreaNetworkPolicyType:
		p.Type = PolicyTypeAntreaNP
	case crd.AntreaClusterPolicyType:
		p.Type = PolicyTypeAntreaCNP
	}
	switch r.Action {
	case crd.RuleActionAllow:
		p.RuleAction = flow.ActionAllow
	case crd.RuleActionDrop:
		p.RuleAction = flow.ActionDrop
	case crd.RuleActionReject:
		p.RuleAction = flow.ActionReject
	}
	return p
}
