package exporter

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/queue"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/traceflow/cluster"
	"sluice/traceflow/pipeline"
)

type fixedSource struct{ conns []source.Conn }

func (s *fixedSource) Dump(_ context.Context, dst []source.Conn) ([]source.Conn, error) {
	return append(dst, s.conns...), nil
}
func (s *fixedSource) Close() error { return nil }

type idleTransport struct{}

func (idleTransport) Run(ctx context.Context, _ *queue.Queue) error { <-ctx.Done(); return nil }

// fixtureSource is the Traceflow fixture cluster with overlays.
func fixtureSource(overlays ...string) attribution.Source {
	return func(ctx context.Context) ([]cluster.Object, error) {
		objs, err := cluster.ReadPath(ctx, "../traceflow/testdata/cluster")
		if err != nil {
			return nil, err
		}
		for _, o := range overlays {
			top, err := cluster.ReadPath(ctx, "../traceflow/testdata/overlays/"+o)
			if err != nil {
				return nil, err
			}
			objs = cluster.Overlay(objs, top)
		}
		return objs, nil
	}
}

func conn(id uint32, proto uint8, src, dst string, replied bool) source.Conn {
	s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
	c := source.Conn{ID: id, Proto: proto, OrigSrc: s, OrigDst: d, ReplySrc: d, ReplyDst: s, Packets: 3, Bytes: 180}
	if proto == source.ProtoTCP {
		c.TCPState = source.TCPSynSent
	}
	if replied {
		c.ReversePackets, c.ReverseBytes = 2, 120
		if proto == source.ProtoTCP {
			c.TCPState = source.TCPEstablished
		}
	}
	return c
}

type wantAttr struct {
	ingress, egress flow.Policy
	egName, egIP    string
}

func pol(typ uint8, ns, name, rule string, action uint8) flow.Policy {
	return flow.Policy{Type: typ, Namespace: ns, Name: name, RuleName: rule, RuleAction: action}
}

// TestAttribution: records of k8s-node-1 carry the model's policy rules
// on the sides the Node owns, denied connections name the denying rule
// whichever Node owns it, and a changed model is applied to live
// connections at their next export.
func TestAttribution(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := attribution.New(attribution.Options{Log: log, MaxEntries: 4})
	l := attribution.NewLoader(a, fixtureSource("antrea-deny.yaml"), pipeline.DefaultConfig())
	if _, err := l.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	const (
		client = "10.10.1.5"
		web    = "10.10.1.6"
		db     = "10.10.2.7"
	)
	conns := []source.Conn{
		conn(1, source.ProtoTCP, client+":40001", web+":80", false),
		conn(2, source.ProtoTCP, client+":40002", db+":5432", false),
		conn(3, source.ProtoTCP, client+":40003", db+":5432", true),
		conn(4, source.ProtoUDP, client+":40004", "8.8.8.8:53", true),
		conn(5, source.ProtoTCP, "192.168.1.50:40005", web+":80", true),
		conn(6, source.ProtoTCP, client+":40006", db+":5433", true),
	}
	src := &fixedSource{conns: conns}
	e, err := New(Options{Node: "k8s-node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")}, Source: src, Transport: idleTransport{},
		Attributor: a, ActiveTimeout: time.Second, PollInterval: time.Second, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0)
	records := func(at time.Time) map[uint16]*flow.Flow {
		_, recs := e.Poll(ctx, at, nil, nil)
		batch := record.Flows(nil, recs)
		out := map[uint16]*flow.Flow{}
		for i := range batch {
			out[batch[i].SourcePort] = &batch[i]
		}
		return out
	}
	bump := func() {
		for i := range src.conns {
			src.conns[i].Packets++
		}
	}
	if got := records(t0); len(got) != 0 {
		t.Fatalf("%d records before the active timeout", len(got))
	}
	bump()
	got := records(t0.Add(2 * time.Second))
	want := map[uint16]wantAttr{
		40001: {ingress: pol(3, "", "protect-web", "drop-from-client", flow.ActionDrop)},
		40002: {egress: pol(2, "default", "no-db-from-client", "reject-db", flow.ActionReject)},
		40003: {}, // answered: the model's Reject is not exported
		40004: {egName: "egress-client", egIP: "192.168.77.210"},
		40005: {},
		40006: {},
	}
	check := func(got map[uint16]*flow.Flow, want map[uint16]wantAttr) {
		t.Helper()
		for port, w := range want {
			f := got[port]
			if f == nil {
				t.Errorf("port %d: no record", port)
				continue
			}
			egIP := ""
			if f.EgressIP.IsValid() {
				egIP = f.EgressIP.String()
			}
			if f.Ingress != w.ingress || f.Egress != w.egress || f.EgressName != w.egName || egIP != w.egIP {
				t.Errorf("port %d: ingress %+v egress %+v Egress %q %q; want %+v", port, f.Ingress, f.Egress, f.EgressName, egIP, w)
			}
			if (w.ingress.RuleAction != 0) != f.Present.Has(flow.IngressPolicyRuleAction) ||
				(w.egress.RuleAction != 0) != f.Present.Has(flow.EgressPolicyRuleAction) ||
				(w.egName != "") != f.Present.Has(flow.EgressName) {
				t.Errorf("port %d: presence bits do not match the fields", port)
			}
		}
	}
	check(got, want)
	if d := testutil.ToFloat64(e.m.disagreements); d != 1 {
		t.Errorf("disagreements %v, want 1", d)
	}
	if d := testutil.ToFloat64(e.m.deniedRecords); d != 2 {
		t.Errorf("denied records %v, want 2", d)
	}
	st := a.Stats()
	if st.Evicted == 0 || st.Entries > 4 {
		t.Errorf("cache of 4 entries: %+v", st)
	}

	// The policies change: the Antrea-native ones go, db is isolated.
	gen := a.Generation()
	l2 := attribution.NewLoader(a, fixtureSource("k8s-ingress-isolate.yaml"), pipeline.DefaultConfig())
	if _, err := l2.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Generation() != gen+1 {
		t.Fatalf("generation %d after a change from %d", a.Generation(), gen)
	}
	bump()
	got = records(t0.Add(4 * time.Second))
	check(got, map[uint16]wantAttr{
		40001: {},
		40002: {ingress: pol(1, "default", "db-deny-all", "", flow.ActionDrop)}, // denied on node-2, reported here
		40003: {},                                                               // answered, and isolation is not this Node's side
		40004: {egName: "egress-client", egIP: "192.168.77.210"},
	})
	if changed, err := l2.Load(ctx); err != nil || changed || a.Generation() != gen+1 {
		t.Errorf("an unchanged state: changed %v, err %v, generation %d", changed, err, a.Generation())
	}
}

// TestDeniedRateLimit: denied records over the rate are dropped and
// counted; the others pass.
func TestDeniedRateLimit(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := attribution.New(attribution.Options{Log: log})
	if _, err := attribution.NewLoader(a, fixtureSource("antrea-deny.yaml"), pipeline.DefaultConfig()).Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	src := &fixedSource{}
	for i := range 50 {
		c := conn(uint32(i+1), source.ProtoTCP, "10.10.1.5:"+strconv.Itoa(41000+i), "10.10.1.6:80", false)
		c.Dying = true // exported at once
		src.conns = append(src.conns, c)
	}
	src.conns = append(src.conns, func() source.Conn {
		c := conn(99, source.ProtoTCP, "10.10.1.5:42000", "10.10.2.7:5433", true)
		c.Dying = true
		return c
	}())
	// Through Poll's batch, and as Run polls (the records written straight
	// into the queue's ring), with room and with a queue too small for
	// them (then the oldest are dropped).
	for _, c := range []struct {
		name         string
		direct       bool
		buffer, held int
	}{{"batch", false, 0, 11}, {"direct", true, 0, 11}, {"direct, small queue", true, 5, 5}} {
		e, err := New(Options{Node: "k8s-node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")}, Source: src,
			Transport: idleTransport{}, Attributor: a, DeniedRate: 1, DeniedBurst: 10, BufferSize: c.buffer, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		at := time.Unix(1_800_000_000, 0)
		if c.direct {
			e.poll(context.Background(), at, nil, nil)
		} else {
			_, batch := e.Poll(context.Background(), at, nil, nil)
			if len(batch) != 11 {
				t.Errorf("%s: %d records in the batch, want 11", c.name, len(batch))
			}
		}
		_, queued := e.q.Peek(0, nil, 100)
		denied, other := 0, 0
		for i := range queued {
			if queued[i].Denied() {
				denied++
			} else {
				other++
			}
		}
		if c.held == 11 && (denied != 10 || other != 1) || len(queued) != c.held {
			t.Errorf("%s: %d denied and %d other records queued, want 10 and 1 of %d", c.name, denied, other, c.held)
		}
		if d := testutil.ToFloat64(e.m.deniedDrops); d != 40 {
			t.Errorf("%s: dropped %v, want 40", c.name, d)
		}
		if d := testutil.ToFloat64(e.m.bufferDrops); d != float64(11-c.held) {
			t.Errorf("%s: %v dropped for lack of room, want %d", c.name, d, 11-c.held)
		}
	}
}

// TestConnMetaSize keeps the store entry's metadata at three words.
func TestConnMetaSize(t *testing.T) {
	if n := unsafe.Sizeof(connMeta{}); n > 24 {
		t.Errorf("connMeta is %d octets", n)
	}
}

// followedModel is an Attributor whose Loader follows first as a watch
// would, with an hour between loads, until the test ends: loaded once
// when it returns. change replaces the source's objects, counts the
// change and signals it, as a kube.Watcher does; only a CatchUp has it
// loaded within the hour.
func followedModel(t *testing.T, log *slog.Logger, first attribution.Source) (*attribution.Attributor, func(attribution.Source)) {
	t.Helper()
	var cur atomic.Pointer[attribution.Source]
	var changes atomic.Uint64
	cur.Store(&first)
	a := attribution.New(attribution.Options{Log: log})
	l := attribution.NewLoader(a, func(ctx context.Context) ([]cluster.Object, error) { return (*cur.Load())(ctx) },
		pipeline.DefaultConfig())
	l.TrackChanges(changes.Load)
	ctx, cancel := context.WithCancel(context.Background())
	changed := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() { l.Follow(ctx, changed, time.Hour); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	changed <- struct{}{}
	testkit.WaitFor(t, "the first model", func() bool { return a.Generation() == 1 })
	return a, func(s attribution.Source) {
		cur.Store(&s)
		changes.Add(1)
		select {
		case changed <- struct{}{}:
		default: // one is pending already
		}
	}
}

// TestPollCatchesUpTheModel: a poll does not judge connections by a model
// behind the cluster state it has heard of. The loader would wait an hour
// before loading the change (its interval); the poll right after the
// change has it loaded first, so the record carries the new policy.
func TestPollCatchesUpTheModel(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	a, change := followedModel(t, log, fixtureSource())

	// client → db, unanswered: without a policy, no rule; with db
	// isolated, the isolating policy's Drop (reported by the source Node).
	src := &fixedSource{conns: []source.Conn{conn(1, source.ProtoTCP, "10.10.1.5:40002", "10.10.2.7:5432", false)}}
	e, err := New(Options{Node: "k8s-node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")}, Source: src, Transport: idleTransport{},
		Attributor: a, ActiveTimeout: time.Second, PollInterval: time.Second, CatchUpWait: time.Minute, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	if _, recs := e.Poll(ctx, t0, nil, nil); len(recs) != 0 {
		t.Fatalf("%d records at first sight", len(recs))
	}
	change(fixtureSource("k8s-ingress-isolate.yaml"))
	src.conns[0].Packets++
	_, recs := e.Poll(ctx, t0.Add(2*time.Second), nil, nil)
	fl := record.Flows(nil, recs)
	want := pol(1, "default", "db-deny-all", "", flow.ActionDrop)
	if len(fl) != 1 || fl[0].Ingress != want {
		t.Fatalf("records %+v; want one naming %+v (model generation %d)", fl, want, a.Generation())
	}
	if st := a.Stats(); st.CatchUps != 1 || st.CatchUpTimeouts != 0 {
		t.Errorf("stats %+v, want one catch-up, no timeout", st)
	}
	for _, name := range []string{"sluice_exporter_attribution_catch_ups_total", "sluice_exporter_attribution_catch_up_timeouts_total"} {
		if n, err := testutil.GatherAndCount(e.Registry(), name); n != 1 || err != nil {
			t.Errorf("%s: %d series, %v", name, n, err)
		}
	}
}

// lookupHook is a Pod store whose first lookup runs hook: a cluster change
// that reaches the informers after the poll caught the model up, and
// before the poll names the connection's Pods.
type lookupHook struct {
	enrich.Store
	once sync.Once
	hook func()
}

func (s *lookupHook) PodByIP(ip netip.Addr, at time.Time) (*enrich.Pod, bool) {
	s.once.Do(s.hook)
	return s.Store.PodByIP(ip, at)
}

// TestLateChangeCaughtUp: a change that arrives after the poll's catch-up
// and makes the model deny a connection that was answered (here db's
// isolation goes: the model still isolates db) is caught up once more
// before the connection's only record is written, so the model and the
// datapath agree and the record names no stale rule.
func TestLateChangeCaughtUp(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	a, change := followedModel(t, log, fixtureSource("k8s-ingress-isolate.yaml"))

	// client → db, answered and over (TIME_WAIT): its one record is
	// written at first sight (the Pod cache knows client: otherwise the
	// record would wait for its name, see latename.go).
	c := conn(1, source.ProtoTCP, "10.10.1.5:40002", "10.10.2.7:5432", true)
	c.TCPState = source.TCPTimeWait
	store := &lookupHook{Store: enrich.NewStatic([]enrich.Pod{clientPod}, nil, nil), hook: func() { change(fixtureSource()) }}
	e, err := New(Options{Node: "k8s-node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")}, Source: &fixedSource{conns: []source.Conn{c}},
		Store: store, Transport: idleTransport{}, Attributor: a, ActiveTimeout: time.Second, PollInterval: time.Second,
		CatchUpWait: time.Minute, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	_, recs := e.Poll(ctx, time.Unix(1_800_000_000, 0), nil, nil)
	fl := record.Flows(nil, recs)
	if len(fl) != 1 || fl[0].Ingress != (flow.Policy{}) || fl[0].Egress != (flow.Policy{}) {
		t.Fatalf("records %+v; want one, naming no policy", fl)
	}
	if d := testutil.ToFloat64(e.m.disagreements); d != 0 || a.Generation() != 2 {
		t.Errorf("disagreements %v, generation %d; want 0 and the model without db's isolation (2)", d, a.Generation())
	}
	if st := a.Stats(); st.CatchUps != 1 || st.CatchUpTimeouts != 0 {
		t.Errorf("stats %+v, want one catch-up (the late one), no timeout", st)
	}
}
