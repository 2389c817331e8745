package ovscheck

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"sluice/traceflow/corpus"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/ovs"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

const testdata = "../testdata"

// startOVS starts a private Open vSwitch for the test, or skips (fails,
// with SLUICE_REQUIRE_PEERS=1) when it is not installed.
func startOVS(t *testing.T) (context.Context, *Server) {
	t.Helper()
	for _, p := range Programs {
		if _, err := exec.LookPath(p); err != nil {
			if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
				t.Fatalf("Open vSwitch is required (SLUICE_REQUIRE_PEERS=1) but %s is not installed: %v", p, err)
			}
			t.Skipf("Open vSwitch not installed (%v); set SLUICE_REQUIRE_PEERS=1 to make this a failure", err)
		}
	}
	deadline := time.Now().Add(5 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-5*time.Second).Before(deadline) {
		deadline = d.Add(-5 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	s, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return ctx, s
}

// names are this process's bridge and interface names: interfaces of the
// userspace datapath are tap devices of the host, so they must not clash
// with another test's.
func names() (br, prefix string) {
	p := fmt.Sprintf("sl%04x", os.Getpid()&0xffff)
	return p + "br", p
}

// traceCase runs one corpus case through the tracer.
func traceCase(t *testing.T, ctx context.Context, c *corpus.Case) (*pipeline.Model, *tracer.Trace) {
	t.Helper()
	m, err := c.Model(ctx, testdata)
	if err != nil {
		t.Fatal(err)
	}
	s, d, err := tracer.Endpoints(m.State, c.Src, c.Dst)
	if err != nil {
		t.Fatal(err)
	}
	pkt, err := flowspec.Parse(c.Flow)
	if err != nil {
		t.Fatal(err)
	}
	tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d, Packet: pkt}}
	tf.Name = "corpus"
	tr, err := tracer.Run(ctx, m, tf, tracer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return m, tr
}

// loader keeps one bridge loaded at a time (one flow-based tunnel per
// OVS), reloading only when the cluster variant or the Node changes.
type loader struct {
	s       *Server
	key     string
	current *Bridge
}

// bridgeKey names the bridge a case's hop on node needs.
func bridgeKey(c *corpus.Case, node string) string {
	return fmt.Sprintf("%s|%s|%v|%v|%s|%s", c.Mode, c.TrafficEncryptionMode, c.ProxyAll, c.EnableBridgingMode, strings.Join(c.Overlays, ","), node)
}

func (l *loader) load(ctx context.Context, c *corpus.Case, m *pipeline.Model, node string) (*Bridge, error) {
	key := bridgeKey(c, node)
	if l.current != nil && l.key == key {
		return l.current, nil
	}
	if l.current != nil {
		if err := l.current.Delete(ctx); err != nil {
			return nil, err
		}
		l.current = nil
	}
	br, prefix := names()
	b, err := l.s.Load(ctx, m, node, br, prefix)
	if err != nil {
		return nil, err
	}
	l.key, l.current = key, b
	return b, nil
}

// TestCorpusAgreesWithOVS traces every hop of every corpus case in real
// Open vSwitch and requires the same tables, verdict and rewrites as the
// model. Hops are grouped by the bridge they need, so each bridge (a
// Node of one mode and set of overlays) is loaded once.
func TestCorpusAgreesWithOVS(t *testing.T) {
	ctx, s := startOVS(t)
	cases, err := corpus.Load(testdata)
	if err != nil {
		t.Fatal(err)
	}
	type hop struct {
		c    *corpus.Case
		m    *pipeline.Model
		h    tracer.Hop
		n    int // the hop's place in its trace
		node string
	}
	byBridge := map[string][]hop{}
	var keys []string
	for i := range cases {
		c := &cases[i]
		m, tr := traceCase(t, ctx, c)
		for n, h := range tr.Hops {
			if h.Result == nil {
				continue // the agent's checks failed before any packet ran
			}
			k := bridgeKey(c, h.Node)
			if byBridge[k] == nil {
				keys = append(keys, k)
			}
			byBridge[k] = append(byBridge[k], hop{c, m, h, n, h.Node})
		}
	}
	l := &loader{s: s}
	hops := 0
	for _, k := range keys {
		for _, hp := range byBridge[k] {
			t.Run(fmt.Sprintf("%s/hop%d", hp.c.Name, hp.n), func(t *testing.T) {
				b, err := l.load(ctx, hp.c, hp.m, hp.node)
				if err != nil {
					t.Fatal(err)
				}
				got, diffs := traceAndCompare(t, ctx, b, hp.h)
				hops++
				if len(diffs) > 0 {
					t.Errorf("Node %s disagrees with OVS:\n  %s\nOVS trace:\n%s", hp.node, strings.Join(diffs, "\n  "), got.Text)
				}
			})
		}
	}
	if hops < len(cases) {
		t.Errorf("only %d hops compared for %d cases", hops, len(cases))
	}
}

// traceAndCompare runs a hop's packet through ofproto/trace, which (given
// the packet) also runs learn actions, and lists how OVS differs from the
// model, the flows it learned included; it then forgets them, so that
// every trace finds the bridge as loaded.
func traceAndCompare(t *testing.T, ctx context.Context, b *Bridge, h tracer.Hop) (*Result, []string) {
	t.Helper()
	got, err := b.Trace(ctx, h.Entry, h.Frame)
	if err != nil {
		t.Fatal(err)
	}
	diffs := Compare(b.Tables, h.Result, got)
	// OVS installs a learned flow right after the translation: wait
	// (bounded) until it holds as many as the model learned.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = until(lctx, func() error {
		l, err := b.Learned(lctx)
		if err == nil && len(l) < len(h.Result.Learned) {
			err = fmt.Errorf("%d learned flows", len(l))
		}
		return err
	})
	ld, err := b.CompareLearned(ctx, h.Result.Learned)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ForgetLearned(ctx); err != nil {
		t.Fatal(err)
	}
	return got, append(diffs, ld...)
}

// TestPacketOutReachesTheModelledPort sends the traced packet, tag and
// all, through the real bridge, one case per kind of verdict, and
// requires the Traceflow packet-in to come from the table and carry the
// output port, tunnel destination, addresses and mark the model has.
func TestPacketOutReachesTheModelledPort(t *testing.T) {
	ctx, s := startOVS(t)
	cases, err := corpus.Load(testdata)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*corpus.Case{}
	for i := range cases {
		byName[cases[i].Name] = &cases[i]
	}
	l := &loader{s: s}
	for _, k := range []struct {
		name string
		hop  int // which Node of the trace: 0 the source's
	}{
		{"intra-node delivered", 0},                                          // Delivered to a local Pod
		{"pod to own gateway", 0},                                            // Delivered to the gateway
		{"inter-node through the tunnel", 0},                                 // Forwarded through the tunnel
		{"inter-node through the tunnel", 1},                                 // Received from the tunnel, Delivered
		{"service clusterIP load-balanced", 0},                               // DNAT by real conntrack, then the tunnel
		{"hairpin service", 0},                                               // DNAT and SNAT, back out of the ingress port
		{"NodePort of the own Node with proxyAll", 0},                        // NodePort DNAT, then the tunnel
		{"ClientIP affinity, a first trace is load-balanced and learned", 0}, // DNAT and a learned flow
		{"pod to external IP", 0},                                            // ForwardedOutOfNetwork through the gateway
		{"local egress", 0},                                                  // marked for SNAT, to the gateway
		{"remote egress", 0},                                                 // ForwardedToEgressNode through the tunnel
		{"remote egress", 1},                                                 // from the tunnel, marked for SNAT on the Egress Node
		{"noEncap inter-node", 0},                                            // Forwarded to the gateway (direct routing)
		{"noEncap inter-node", 1},                                            // Received from the gateway, Delivered
		{"WireGuard inter-node through the gateway", 0},                      // encap mode, Forwarded out of the gateway (WireGuard)
		{"WireGuard inter-node through the gateway", 1},                      // Received from the gateway, Delivered
		{"FlexibleIPAM pod to another node's pod ends at the uplink", 0},     // bridged out of the uplink, Delivered there
		{"FlexibleIPAM VLAN pod to a local pod of another VLAN", 0},          // the miss flow keeps the local Pod's MAC
		{"k8s egress default drop", 0},                                       // Dropped by the default rule
		{"antrea policy reject", 0},                                          // Rejected by an Antrea rule
	} {
		c := byName[k.name]
		if c == nil {
			t.Fatalf("no corpus case %q", k.name)
		}
		t.Run(fmt.Sprintf("%s/hop%d", k.name, k.hop), func(t *testing.T) {
			m, tr := traceCase(t, ctx, c)
			if k.hop >= len(tr.Hops) {
				t.Fatalf("the trace crosses %d Nodes", len(tr.Hops))
			}
			h := tr.Hops[k.hop]
			if h.Result == nil || len(h.Result.PacketIns) == 0 {
				t.Fatalf("the model sends no packet-in on %s", h.Node)
			}
			want := &h.Result.PacketIns[0]
			b, err := l.load(ctx, c, m, h.Node)
			if err != nil {
				t.Fatal(err)
			}
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			got, err := b.PacketOut(pctx, h.Entry, h.Frame, want.Category)
			if err != nil {
				t.Fatal(err)
			}
			tableOf := func(n string) int { return b.Tables[n] }
			if diffs := ComparePacketIn(tableOf, want, got); len(diffs) > 0 {
				t.Errorf("Node %s: the real packet differs from the model:\n  %s\npacket-in:\n%s", h.Node, strings.Join(diffs, "\n  "), got.Text)
			}
			// The real datapath learns what the model learns.
			_ = until(pctx, func() error {
				l, err := b.Learned(pctx)
				if err == nil && len(l) < len(h.Result.Learned) {
					err = fmt.Errorf("%d learned flows", len(l))
				}
				return err
			})
			if diffs, err := b.CompareLearned(ctx, h.Result.Learned); err != nil || len(diffs) > 0 {
				t.Errorf("Node %s: %v %v", h.Node, diffs, err)
			}
			if err := b.ForgetLearned(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestVerifyNoticesAChangedBridge shows the load check can fail: a flow
// removed from, or added to, the real bridge is reported.
func TestVerifyNoticesAChangedBridge(t *testing.T) {
	ctx, s := startOVS(t)
	c := &corpus.Case{Name: "fixture"}
	m, err := c.Model(ctx, testdata)
	if err != nil {
		t.Fatal(err)
	}
	l := &loader{s: s}
	b, err := l.load(ctx, c, m, "k8s-node-1")
	if err != nil {
		t.Fatal(err)
	}
	output := b.Tables[pipeline.TOutput]
	if _, err := s.Run(ctx, "", "ovs-ofctl", "-O", "OpenFlow15", "del-flows", "--strict", b.Name, fmt.Sprintf("table=%d,priority=0", output)); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(ctx); err == nil {
		t.Error("a removed flow went unnoticed")
	}
	// Back to the model's count, but with a different flow.
	if _, err := s.Run(ctx, "", "ovs-ofctl", "-O", "OpenFlow15", "add-flow", b.Name, fmt.Sprintf("table=%d,priority=0,actions=normal", output)); err != nil {
		t.Fatal(err)
	}
	if err := b.Verify(ctx); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("a changed flow went unnoticed: %v", err)
	}
}

// TestCompareReportsDifferences shows the comparison can fail: a model
// run that differs from the trace in each respect is reported in each.
func TestCompareReportsDifferences(t *testing.T) {
	br := datapath.NewBridge("n", []string{"A", "B", "C"})
	tables := ovs.TablesOf(br)
	got := &Result{Tables: []int{0, 2}, Outputs: []uint32{1}, PacketIns: []PacketIn{{1, 2}}, DropTable: -1,
		Final: map[string]string{"nw_src": "10.0.0.1", "nw_dst": "10.0.0.2", "tun_dst": "192.168.0.2"}}
	pkt := datapath.Packet{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.9")}
	want := &datapath.Result{
		Trail:     []datapath.Step{{Table: "A"}, {Table: "B"}},
		Outputs:   []datapath.Output{{Port: 2, Packet: pkt}},
		PacketIns: []datapath.PacketIn{{Category: 2, Table: "B", Packet: pkt, Meta: datapath.Metadata{PktMark: 1}}},
	}
	diffs := strings.Join(Compare(tables, want, got), "\n")
	for _, w := range []string{"tables visited", "output ports", "packet-ins", "final nw_dst", "final tun_dst", "final pkt_mark", "final nw_ttl"} {
		if !strings.Contains(diffs, w) {
			t.Errorf("no %q difference in:\n%s", w, diffs)
		}
	}
	if d := Compare(tables, &datapath.Result{Trail: []datapath.Step{{Table: "A"}, {Table: "C"}}, Dropped: true, DropTable: "C"},
		&Result{Tables: []int{0, 2}, Dropped: true, DropTable: 2}); len(d) != 0 {
		t.Errorf("a matching drop reported %v", d)
	}
}

// TestParseTrace reads a recorded ofproto/trace of a tagged packet that
// is committed, translated and sent through the tunnel.
func TestParseTrace(t *testing.T) {
	const out = `Flow: tcp,in_port=3,nw_src=10.10.1.5,nw_dst=10.96.0.20

bridge("br")
------------
 0. ip, priority 200
    ct(table=5,zone=65520,nat)
    nat

recirc(0x8) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)

bridge("br")
------------
    thaw
        Resuming from table 5
 5. ip,nw_tos=28, priority 191
    group:2
    bucket 0
            resubmit(,8)
         8. tcp,reg3=0xa0a0207, priority 200
            set_field:0x1->reg1
25. ip,reg1=0x1,nw_tos=28, priority 203
    output:NXM_NX_REG1[]
     -> output port is 1
     -> output to native tunnel
     >> native tunnel routing failed
    controller(reason=no_match,userdata=01)
    output:NXM_NX_REG1[]
     -> output port is 3
     >> skipping output to input port

Final flow: recirc_id=0x8,ct_mark=0x10,eth,tcp,tun_dst=192.168.77.102,in_port=3,nw_src=10.10.1.5,nw_dst=10.10.2.7,tp_dst=5432
`
	r, err := ParseTrace(out, 3)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.Tables) != "[0 5 8 25]" || fmt.Sprint(r.Outputs) != "[1]" || fmt.Sprint(r.PacketIns) != "[{1 25}]" || r.Dropped {
		t.Errorf("tables %v outputs %v packet-ins %v dropped %v", r.Tables, r.Outputs, r.PacketIns, r.Dropped)
	}
	if r.Final["nw_dst"] != "10.10.2.7" || r.Final["tun_dst"] != "192.168.77.102" || r.Final["ct_mark"] != "0x10" {
		t.Errorf("final %v", r.Final)
	}
	d, err := ParseTrace("Flow: ip\n\nbridge(\"br\")\n 0. priority 0\n    goto_table:4\n 4. No match.\n    drop\n", 1)
	if err != nil || !d.Dropped || d.DropTable != 4 {
		t.Errorf("miss: %+v %v", d, err)
	}
}
