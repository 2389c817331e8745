package ovscheck

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"sluice/traceflow/corpus"
	"sluice/traceflow/crd"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// traceOn traces -S src -D dst -f flow on an existing model.
func traceOn(t *testing.T, ctx context.Context, m *pipeline.Model, src, dst, flow string) *tracer.Trace {
	t.Helper()
	s, d, err := tracer.Endpoints(m.State, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	pkt, err := flowspec.Parse(flow)
	if err != nil {
		t.Fatal(err)
	}
	tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d, Packet: pkt}}
	tf.Name = "affinity"
	tr, err := tracer.Run(ctx, m, tf, tracer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Hops) == 0 || tr.Hops[0].Result == nil {
		t.Fatalf("%s: no hop ran", flow)
	}
	return tr
}

// lbPod is the Pod the trace's LB observation names ("" if none).
func lbPod(tr *tracer.Trace) string {
	for _, r := range tr.Traceflow.Status.Results {
		for _, o := range r.Observations {
			if o.Component == crd.ComponentLB {
				return o.Pod
			}
		}
	}
	return ""
}

// TestAffinityLearnsAsOVSDoes checks ClientIP session affinity in real
// Open vSwitch, on a Service with two endpoints on two Nodes:
//   - a first connection, whose endpoint OVS's select group and the model
//     choose alike, runs the same tables and learns the same flow (given
//     a packet, ofproto/trace runs learn actions);
//   - sent through the bridge (packet-out), OVS learns exactly the flow
//     the model's learn action produces;
//   - a second connection from the same client, which the group alone
//     would send to the other endpoint, goes to the learned one, in OVS
//     as in the model.
func TestAffinityLearnsAsOVSDoes(t *testing.T) {
	ctx, s := startOVS(t)
	c := &corpus.Case{Name: "affinity"}
	m, err := c.Model(ctx, testdata)
	if err != nil {
		t.Fatal(err)
	}
	const node = "k8s-node-1"
	l := &loader{s: s}
	b, err := l.load(ctx, c, m, node)
	if err != nil {
		t.Fatal(err)
	}
	flow := func(port int) string { return fmt.Sprintf("tcp,tcp_src=%d,tcp_dst=80", port) }

	// A first connection both choose alike, and one the group alone
	// sends to the other endpoint.
	first, second := 0, 0
	var firstTrace *tracer.Trace
	var lastDiffs []string
	firstPod := ""
	for port := 40000; port < 40064 && (first == 0 || second == 0); port++ {
		tr := traceOn(t, ctx, m, "default/client", "sticky", flow(port))
		pod := lbPod(tr)
		if pod == "" {
			t.Fatalf("%s: no LB observation: %+v", flow(port), tr.Traceflow.Status)
		}
		if first == 0 {
			h := tr.Hops[0]
			got, diffs := traceAndCompare(t, ctx, b, h)
			lastDiffs = diffs
			if len(diffs) == 0 {
				if !strings.Contains(got.Text, "learn(") {
					t.Fatalf("OVS ran no learn action:\n%s", got.Text)
				}
				first, firstTrace, firstPod = port, tr, pod
			}
			continue
		}
		if pod != firstPod {
			second = port
		}
	}
	if first == 0 || second == 0 {
		t.Fatalf("no source port where OVS and the model agree (%d; the last differs in %q), or none load-balanced elsewhere (%d)", first, lastDiffs, second)
	}
	h := firstTrace.Hops[0]
	if len(h.Result.Learned) != 1 {
		t.Fatalf("the model's first connection learned %d flows, want 1", len(h.Result.Learned))
	}

	// The real packet makes OVS learn; the bridge must then hold the
	// model's flows and the model's learned flow, nothing else.
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := b.PacketOut(pctx, h.Entry, h.Frame, pipeline.CategoryTraceflow); err != nil {
		t.Fatal(err)
	}
	if err := m.Nodes[node].Bridge.Add(h.Result.Learned[0]); err != nil {
		t.Fatal(err)
	}
	if err := until(pctx, func() error { return b.Verify(pctx) }); err != nil {
		t.Fatalf("after the packet-out: %v", err)
	}

	// The second connection follows the learned flow in both.
	tr := traceOn(t, ctx, m, "default/client", "sticky", flow(second))
	if pod := lbPod(tr); pod != firstPod {
		t.Errorf("second connection: LB to %q, want the learned %q", pod, firstPod)
	}
	h2 := tr.Hops[0]
	got, err := b.Trace(ctx, h2.Entry, h2.Frame)
	if err != nil {
		t.Fatal(err)
	}
	if diffs := Compare(b.Tables, h2.Result, got); len(diffs) > 0 {
		t.Errorf("second connection: OVS disagrees:\n  %s\nOVS trace:\n%s", strings.Join(diffs, "\n  "), got.Text)
	}
	if !strings.Contains(got.Text, fmt.Sprintf("%d. tcp,nw_src=10.10.1.5,nw_dst=10.96.0.90,tp_dst=80, priority %d", b.Tables[pipeline.TSessionAffinity], pipeline.AffinityPriority)) {
		t.Errorf("OVS did not use the learned flow:\n%s", got.Text)
	}
}

// until retries check every 100ms until it passes or ctx ends (OVS
// installs a learned flow shortly after the packet's translation).
func until(ctx context.Context, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}
