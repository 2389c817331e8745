package exporter

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/connstore"
	"sluice/exporter/queue"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/traceflow/cluster"
)

// podCache is a Pod metadata cache that learns Pods as the test goes, as
// the informers' cache does when the kubelet posts a Pod's IP; it counts
// the Pod look-ups, and runs hook (once) before the next one when set.
type podCache struct {
	cur     atomic.Pointer[enrich.Static]
	lookups atomic.Int64
	hook    atomic.Pointer[func()]
}

func newPodCache(pods ...enrich.Pod) *podCache {
	c := &podCache{}
	c.learn(pods...)
	return c
}

// learn replaces the Pods the cache knows.
func (c *podCache) learn(pods ...enrich.Pod) { c.cur.Store(enrich.NewStatic(pods, nil, nil)) }

func (c *podCache) PodByIP(ip netip.Addr, at time.Time) (*enrich.Pod, bool) {
	c.lookups.Add(1)
	if f := c.hook.Swap(nil); f != nil {
		(*f)()
	}
	return c.cur.Load().PodByIP(ip, at)
}
func (c *podCache) NodeByName(name string) (*enrich.Node, bool) { return c.cur.Load().NodeByName(name) }
func (c *podCache) ServiceByName(ns, name string) (*enrich.Service, bool) {
	return c.cur.Load().ServiceByName(ns, name)
}
func (c *podCache) ServiceByClusterIP(ip netip.Addr) (*enrich.Service, bool) {
	return c.cur.Load().ServiceByClusterIP(ip)
}

// The fixture cluster's Pods on k8s-node-1 (10.10.1.0/24).
var (
	clientPod = enrich.Pod{Namespace: "default", Name: "client", NodeName: "k8s-node-1",
		IPs: []netip.Addr{netip.MustParseAddr("10.10.1.5")}}
	webPod = enrich.Pod{Namespace: "default", Name: "web", NodeName: "k8s-node-1",
		IPs: []netip.Addr{netip.MustParseAddr("10.10.1.6")}}
)

// withoutClientIP is the fixture cluster while the client Pod's IP is not
// posted yet: the policy model does not know 10.10.1.5 either.
func withoutClientIP() attribution.Source {
	return func(ctx context.Context) ([]cluster.Object, error) {
		objs, err := fixtureSource()(ctx)
		if err != nil {
			return nil, err
		}
		top, err := cluster.ParseObjects([]byte(`apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default, labels: {app: client}, creationTimestamp: "2026-01-01T00:00:00Z"}
spec: {nodeName: k8s-node-1, containers: [{name: c, image: busybox}]}
status: {phase: Pending}
`), "pending-client.yaml")
		if err != nil {
			return nil, err
		}
		return cluster.Overlay(objs, top), nil
	}
}

// lateExporter is an exporter of k8s-node-1 on src with the Pod cache
// pods, polled every second (LateNaming is then its default, 10 s).
func lateExporter(t *testing.T, src source.Source, pods *podCache, a *attribution.Attributor, mod func(*Options)) *Exporter {
	t.Helper()
	o := Options{Node: "k8s-node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")}, Source: src, Store: pods,
		Attributor: a, Transport: idleTransport{}, ActiveTimeout: time.Second, PollInterval: time.Second,
		CatchUpWait: time.Minute, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&o)
	}
	e, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// pollQueued polls e at at, as Run does (direct, the records written in
// the queue's ring) or through Poll's batch, and returns the records the
// poll queued, by source port.
func pollQueued(t *testing.T, e *Exporter, at time.Time, direct bool) map[uint16]*flow.Flow {
	t.Helper()
	from := e.q.Head() + uint64(e.q.Len())
	var batch []record.Record
	if direct {
		e.poll(context.Background(), at, nil, nil)
	} else {
		_, batch = e.Poll(context.Background(), at, nil, nil)
	}
	_, recs := e.q.Peek(from, nil, 1<<12)
	if !direct && len(batch) != len(recs) {
		t.Errorf("%d records in the batch, %d queued", len(batch), len(recs))
	}
	out := map[uint16]*flow.Flow{}
	for _, f := range record.Flows(nil, recs) {
		if out[f.SourcePort] != nil {
			t.Errorf("two records of port %d in one poll", f.SourcePort)
		}
		out[f.SourcePort] = &f
	}
	return out
}

// over is c ended: in TIME_WAIT, or dying.
func over(c source.Conn) source.Conn {
	if c.Proto == source.ProtoTCP {
		c.TCPState = source.TCPTimeWait
	} else {
		c.Dying = true
	}
	return c
}

// TestLateNamedOpenConnection: an open connection first seen before the
// Pod cache knows its local Pod is looked up again at the next poll, and
// its records name the Pod; once named, it costs no more look-ups.
func TestLateNamedOpenConnection(t *testing.T) {
	pods := newPodCache()
	src := &fixedSource{conns: []source.Conn{conn(1, source.ProtoTCP, "10.10.1.5:40001", "10.10.2.7:5432", true)}}
	e := lateExporter(t, src, pods, nil, nil)
	t0 := time.Unix(1_800_000_000, 0)
	if got := pollQueued(t, e, t0, true); len(got) != 0 {
		t.Fatalf("%d records at first sight", len(got))
	}
	pods.learn(clientPod)
	src.conns[0].Packets++
	got := pollQueued(t, e, t0.Add(time.Second), true)
	if f := got[40001]; f == nil || f.SourcePodName != "client" || f.SourcePodNamespace != "default" || f.SourceNodeName != "k8s-node-1" {
		t.Fatalf("record %+v; want one naming default/client on k8s-node-1", f)
	}
	if n := testutil.ToFloat64(e.m.lateNames); n != 1 {
		t.Errorf("late names %v, want 1", n)
	}
	lookups := pods.lookups.Load()
	for i := 2; i <= 4; i++ {
		src.conns[0].Packets++
		if f := pollQueued(t, e, t0.Add(time.Duration(i)*time.Second), true)[40001]; f == nil || f.SourcePodName != "client" {
			t.Fatalf("poll %d: record %+v", i, f)
		}
	}
	if n := pods.lookups.Load() - lookups; n != 0 {
		t.Errorf("%d Pod look-ups for a named connection", n)
	}
}

// TestLateNamedFinalRecordHeld: the final record of a connection whose
// local Pod the cache does not know yet (over at first sight, or ending
// while still unnamed) waits for the next poll, and names the Pod that
// the cache and the policy model learnt meanwhile: Pod, verdict (the
// client's Egress) and all. Records of named connections leave at once.
func TestLateNamedFinalRecordHeld(t *testing.T) {
	for _, direct := range []bool{true, false} {
		name := "batch"
		if direct {
			name = "direct"
		}
		t.Run(name, func(t *testing.T) {
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			a, change := followedModel(t, log, withoutClientIP())
			pods := newPodCache(webPod)
			src := &fixedSource{conns: []source.Conn{
				over(conn(1, source.ProtoUDP, "10.10.1.5:40001", "8.8.8.8:53", true)), // over at first sight
				conn(2, source.ProtoTCP, "10.10.1.5:40002", "10.10.2.7:5432", true),   // ends at the next poll
				over(conn(3, source.ProtoTCP, "10.10.1.6:40003", "10.10.2.7:5432", true)),
			}}
			e := lateExporter(t, src, pods, a, func(o *Options) { o.ActiveTimeout = time.Minute })
			t0 := time.Unix(1_800_000_000, 0)
			got := pollQueued(t, e, t0, direct)
			if len(got) != 1 || got[40003] == nil || got[40003].SourcePodName != "web" {
				t.Fatalf("records at first sight %v; want web's only", got)
			}
			if n := testutil.ToFloat64(e.m.held); n != 1 {
				t.Fatalf("%v records held, want 1", n)
			}
			src.conns[1] = over(src.conns[1])
			if got := pollQueued(t, e, t0.Add(time.Second), direct); len(got) != 0 {
				t.Fatalf("records %v, want none while client is unknown", got)
			}
			if n := testutil.ToFloat64(e.m.held); n != 2 {
				t.Fatalf("%v records held, want 2", n)
			}
			pods.learn(clientPod, webPod)
			change(fixtureSource())
			got = pollQueued(t, e, t0.Add(2*time.Second), direct)
			for port, end := range map[uint16]time.Time{40001: t0, 40002: t0.Add(time.Second)} {
				f := got[port]
				if f == nil || f.SourcePodName != "client" || f.EndReason != connstore.ReasonEnd || !f.EndTime.Equal(end) ||
					!f.StartTime.Equal(t0) || f.Stats.PacketTotalCount != 3 {
					t.Fatalf("port %d: record %+v; want its end of flow at %v, naming client", port, f, end)
				}
			}
			if f := got[40001]; f.EgressName != "egress-client" {
				t.Errorf("Egress %q: the verdict was not judged with the client known", f.EgressName)
			}
			if len(got) != 2 || testutil.ToFloat64(e.m.held) != 0 || testutil.ToFloat64(e.m.lateNames) != 2 {
				t.Errorf("%d records, %v held, %v late names; want 2, 0, 2", len(got), testutil.ToFloat64(e.m.held),
					testutil.ToFloat64(e.m.lateNames))
			}
			if len(pollQueued(t, e, t0.Add(3*time.Second), direct)) != 0 {
				t.Error("records after the end of flow")
			}
		})
	}
}

// TestLateNamingCaughtUpDuringPoll: the Pod becomes known during the poll
// that releases its held record, after that poll caught the policy model
// up: the model is caught up again before the record is judged.
func TestLateNamingCaughtUpDuringPoll(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, change := followedModel(t, log, withoutClientIP())
	pods := newPodCache()
	src := &fixedSource{conns: []source.Conn{over(conn(1, source.ProtoUDP, "10.10.1.5:40001", "8.8.8.8:53", true))}}
	e := lateExporter(t, src, pods, a, nil)
	t0 := time.Unix(1_800_000_000, 0)
	if got := pollQueued(t, e, t0, true); len(got) != 0 {
		t.Fatalf("%d records at first sight", len(got))
	}
	arrive := func() { pods.learn(clientPod); change(fixtureSource()) }
	pods.hook.Store(&arrive)
	f := pollQueued(t, e, t0.Add(time.Second), true)[40001]
	if f == nil || f.SourcePodName != "client" || f.EgressName != "egress-client" {
		t.Fatalf("record %+v; want client's, through egress-client", f)
	}
	if st := a.Stats(); st.CatchUps != 1 {
		t.Errorf("%d catch-ups, want the late one", st.CatchUps)
	}
}

// TestLateNamingBound: an address the cache never names is looked up
// again for LateNaming (10 s here) and no longer; its final record is
// held that long, then written unnamed and counted. The Pod CIDR's
// gateway address is never waited for.
func TestLateNamingBound(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	t.Run("open", func(t *testing.T) {
		pods := newPodCache()
		src := &fixedSource{conns: []source.Conn{conn(1, source.ProtoTCP, "10.10.1.77:40001", "10.10.2.7:5432", true)}}
		e := lateExporter(t, src, pods, nil, nil)
		for _, p := range []struct {
			at      time.Duration
			lookups int64
		}{{0, 1}, {5 * time.Second, 2}, {9 * time.Second, 3}, {10 * time.Second, 3}, {20 * time.Second, 3}} {
			src.conns[0].Packets++
			pollQueued(t, e, t0.Add(p.at), true)
			if n := pods.lookups.Load(); n != p.lookups {
				t.Errorf("after the poll at +%v: %d look-ups, want %d", p.at, n, p.lookups)
			}
		}
		// Its end, past the wait, is written at once.
		src.conns[0] = over(src.conns[0])
		if got := pollQueued(t, e, t0.Add(21*time.Second), true); len(got) != 1 || got[40001] == nil ||
			got[40001].EndReason != connstore.ReasonEnd || got[40001].SourcePodName != "" {
			t.Fatalf("records %v; want the end of flow, unnamed", got)
		}
		if n := testutil.ToFloat64(e.m.held); n != 0 {
			t.Errorf("%v held past the wait", n)
		}
	})
	t.Run("final", func(t *testing.T) {
		pods := newPodCache()
		src := &fixedSource{conns: []source.Conn{over(conn(1, source.ProtoTCP, "10.10.1.77:40001", "10.10.2.7:5432", true))}}
		e := lateExporter(t, src, pods, nil, nil)
		for _, at := range []time.Duration{0, 5 * time.Second, 9 * time.Second} {
			if got := pollQueued(t, e, t0.Add(at), true); len(got) != 0 {
				t.Fatalf("at +%v: records %v while waiting", at, got)
			}
		}
		got := pollQueued(t, e, t0.Add(10*time.Second), true)
		if f := got[40001]; len(got) != 1 || f == nil || f.SourcePodName != "" || !f.EndTime.Equal(t0) {
			t.Fatalf("records %v; want the end of flow of +0, unnamed", got)
		}
		if n := testutil.ToFloat64(e.m.unnamedTimeout); n != 1 || testutil.ToFloat64(e.m.held) != 0 {
			t.Errorf("unnamed for timeout %v, held %v; want 1, 0", n, testutil.ToFloat64(e.m.held))
		}
	})
	t.Run("gateway", func(t *testing.T) {
		pods := newPodCache()
		src := &fixedSource{conns: []source.Conn{
			over(conn(1, source.ProtoTCP, "10.10.1.1:40001", "10.10.2.7:5432", true)),
			conn(2, source.ProtoTCP, "10.10.1.1:40002", "10.10.2.7:5432", true),
		}}
		e := lateExporter(t, src, pods, nil, nil)
		if got := pollQueued(t, e, t0, true); len(got) != 1 || got[40001] == nil {
			t.Fatalf("records at first sight %v; want the gateway's end of flow at once", got)
		}
		lookups := pods.lookups.Load()
		pollQueued(t, e, t0.Add(time.Second), true)
		if n := pods.lookups.Load() - lookups; n != 0 {
			t.Errorf("%d look-ups of the gateway at the next poll", n)
		}
	})
}

// TestHeldRecordsCap: past MaxHeld, final records of unnamed connections
// are written at once, unnamed, and counted; those held are named later.
func TestHeldRecordsCap(t *testing.T) {
	pods := newPodCache()
	src := &fixedSource{}
	for i := range 3 {
		src.conns = append(src.conns, over(conn(uint32(i+1), source.ProtoTCP, "10.10.1.5:"+strconv.Itoa(40001+i), "10.10.2.7:5432", true)))
	}
	e := lateExporter(t, src, pods, nil, func(o *Options) { o.MaxHeld = 2 })
	t0 := time.Unix(1_800_000_000, 0)
	got := pollQueued(t, e, t0, true)
	if len(got) != 1 || testutil.ToFloat64(e.m.held) != 2 || testutil.ToFloat64(e.m.unnamedHeldFull) != 1 {
		t.Fatalf("%d records, %v held, %v unnamed for the cap; want 1, 2, 1", len(got), testutil.ToFloat64(e.m.held),
			testutil.ToFloat64(e.m.unnamedHeldFull))
	}
	for _, f := range got {
		if f.SourcePodName != "" {
			t.Errorf("record %+v named", f)
		}
	}
	pods.learn(clientPod)
	got = pollQueued(t, e, t0.Add(time.Second), true)
	if len(got) != 2 {
		t.Fatalf("%d records, want the 2 held", len(got))
	}
	for _, f := range got {
		if f.SourcePodName != "client" {
			t.Errorf("record %+v not named", f)
		}
	}
}

// captureTransport takes every record queued, acknowledging it.
type captureTransport struct {
	mu  sync.Mutex
	got []record.Record
}

func (c *captureTransport) Run(ctx context.Context, q *queue.Queue) error {
	var next uint64
	for q.Wait(ctx, next) {
		first, recs := q.Peek(next, nil, 1024)
		c.mu.Lock()
		c.got = append(c.got, recs...)
		c.mu.Unlock()
		next = first + uint64(len(recs))
		q.Ack(next)
	}
	return nil
}

// TestHeldRecordsFlushedAtShutdown: a stopping exporter writes the records
// it holds, named when the cache knows the Pod by then, and counts the
// others.
func TestHeldRecordsFlushedAtShutdown(t *testing.T) {
	pods := newPodCache()
	src := &fixedSource{conns: []source.Conn{
		over(conn(1, source.ProtoTCP, "10.10.1.5:40001", "10.10.2.7:5432", true)),
		over(conn(2, source.ProtoTCP, "10.10.1.77:40002", "10.10.2.7:5432", true)),
	}}
	tr := &captureTransport{}
	e := lateExporter(t, src, pods, nil, func(o *Options) { o.Transport = tr })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	testkit.WaitFor(t, "two records held", func() bool { return testutil.ToFloat64(e.m.held) == 2 })
	pods.learn(clientPod)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	got := record.Flows(nil, tr.got)
	tr.mu.Unlock()
	names := map[uint16]string{}
	for _, f := range got {
		names[f.SourcePort] = f.SourcePodName
	}
	if len(got) != 2 || names[40001] != "client" || names[40002] != "" {
		t.Fatalf("records sent %+v; want both, the first naming client", names)
	}
	if n := testutil.ToFloat64(e.m.unnamedShutdown); n != 1 || testutil.ToFloat64(e.m.held) != 0 {
		t.Errorf("unnamed at shutdown %v, held %v; want 1, 0", n, testutil.ToFloat64(e.m.held))
	}
}

// TestLateNamingOptions: the wait is 10 s, or two poll intervals when
// longer; with LateNaming negative, nothing waits.
func TestLateNamingOptions(t *testing.T) {
	for _, c := range []struct {
		poll, late, want time.Duration
	}{{time.Second, 0, 10 * time.Second}, {30 * time.Second, 0, time.Minute}, {time.Second, 3 * time.Second, 3 * time.Second}} {
		e := lateExporter(t, &fixedSource{}, newPodCache(), nil, func(o *Options) { o.PollInterval, o.LateNaming = c.poll, c.late })
		if got := time.Duration(e.lateNaming); got != c.want {
			t.Errorf("poll interval %v, LateNaming %v: a wait of %v, want %v", c.poll, c.late, got, c.want)
		}
	}
	src := &fixedSource{conns: []source.Conn{over(conn(1, source.ProtoTCP, "10.10.1.5:40001", "10.10.2.7:5432", true))}}
	e := lateExporter(t, src, newPodCache(), nil, func(o *Options) { o.LateNaming = -1 })
	if got := pollQueued(t, e, time.Unix(1_800_000_000, 0), true); len(got) != 1 || testutil.ToFloat64(e.m.held) != 0 {
		t.Fatalf("records %v; want the end of flow at once", got)
	}
}

// dumpFailing is a fixedSource whose dumps fail while fail is set.
type dumpFailing struct {
	fixedSource
	fail bool
}

func (s *dumpFailing) Dump(ctx context.Context, dst []source.Conn) ([]source.Conn, error) {
	if s.fail {
		return dst, errors.New("netlink: no buffer space")
	}
	return s.fixedSource.Dump(ctx, dst)
}

// TestHeldReleasedWhileDumpsFail: a held final record is released at its
// bound even when the polls after it cannot read the connection table.
func TestHeldReleasedWhileDumpsFail(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	src := &dumpFailing{fixedSource: fixedSource{conns: []source.Conn{over(conn(1, source.ProtoTCP, "10.10.1.77:40001", "10.10.2.7:5432", true))}}}
	e := lateExporter(t, src, newPodCache(), nil, nil)
	pollQueued(t, e, t0, true)
	if len(e.held) != 1 {
		t.Fatalf("%d records held, want the unnamed one", len(e.held))
	}
	src.fail = true
	for i := 1; i <= 12; i++ {
		e.poll(context.Background(), t0.Add(time.Duration(i)*time.Second), nil, nil)
	}
	if len(e.held) != 0 || e.q.Len() != 1 {
		t.Errorf("after 12 s of failing dumps: %d held, %d queued (want 0 and 1: the bound is 10 s)", len(e.held), e.q.Len())
	}
}

// TestLateNamingSetting: --late-naming reaches the exporter as given, 0
// turns late naming off, and without the flag the wait is Options'
// default (two poll intervals when longer than 10 s).
func TestLateNamingSetting(t *testing.T) {
	for _, c := range []struct {
		set        bool
		flag, poll time.Duration
		want       time.Duration // 0: never
	}{
		{false, DefaultLateNaming, 30 * time.Second, time.Minute},
		{true, 0, time.Second, 0},
		{true, 3 * time.Second, time.Second, 3 * time.Second},
	} {
		s := Settings{LateNaming: c.flag, LateNamingSet: c.set, MaxHeld: 17, PollInterval: c.poll}
		e := lateExporter(t, &fixedSource{}, newPodCache(), nil, func(o *Options) {
			tuned := s.tuning()
			o.PollInterval, o.LateNaming, o.MaxHeld = tuned.PollInterval, tuned.LateNaming, tuned.MaxHeld
		})
		if got := time.Duration(e.lateNaming); got != c.want || e.o.MaxHeld != 17 {
			t.Errorf("--late-naming %v (given: %v), poll interval %v: a wait of %v and %d held at most, want %v and 17",
				c.flag, c.set, c.poll, got, e.o.MaxHeld, c.want)
		}
	}
}
