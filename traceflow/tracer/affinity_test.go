package tracer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/pipeline"
)

func runTrace(t *testing.T, m *pipeline.Model, src, dst, flow string) *Trace {
	t.Helper()
	s, d, err := Endpoints(m.State, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	pkt, err := flowspec.Parse(flow)
	if err != nil {
		t.Fatal(err)
	}
	tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d, Packet: pkt}}
	tf.Name = "affinity"
	tr, err := Run(context.Background(), m, tf, Options{Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Traceflow.Status.Phase != crd.PhaseSucceeded {
		t.Fatalf("%s -> %s %s: %s %s", src, dst, flow, tr.Traceflow.Status.Phase, tr.Traceflow.Status.Reason)
	}
	return tr
}

func lbPod(tr *Trace) string {
	for _, r := range tr.Traceflow.Status.Results {
		for _, o := range r.Observations {
			if o.Component == crd.ComponentLB {
				return o.Pod
			}
		}
	}
	return ""
}

// TestSessionAffinity traces a Service with ClientIP affinity and two
// endpoints: a first connection is load-balanced by the group and learns
// a flow; once that flow is installed (as OVS installs it), the client's
// next connections go to the same endpoint, even those the group alone
// sends to the other one, while another client is still load-balanced.
func TestSessionAffinity(t *testing.T) {
	m := loadModel(t, pipeline.Encap)
	flow := func(port int) string { return fmt.Sprintf("tcp,tcp_src=%d,tcp_dst=80", port) }
	first := runTrace(t, m, "default/client", "sticky", flow(40000))
	firstPod := lbPod(first)
	other := 0
	for port := 40001; port < 40064 && other == 0; port++ {
		if lbPod(runTrace(t, m, "default/client", "sticky", flow(port))) != firstPod {
			other = port
		}
	}
	if firstPod == "" || other == 0 {
		t.Fatalf("first connection to %q; no connection load-balanced elsewhere", firstPod)
	}
	learned := first.Hops[0].Result.Learned
	if len(learned) != 1 {
		t.Fatalf("first connection learned %d flows, want 1", len(learned))
	}
	want := "table=SessionAffinity, hard_timeout=600, priority=200,tcp,nw_src=10.10.1.5,nw_dst=10.96.0.90,tp_dst=80 actions="
	if got := learned[0].String(); !strings.HasPrefix(got, want) {
		t.Errorf("learned %s\nwant %s...", got, want)
	}
	bridge := m.Nodes[first.Hops[0].Node].Bridge
	if err := bridge.Add(learned[0]); err != nil {
		t.Fatal(err)
	}

	again := runTrace(t, m, "default/client", "sticky", flow(other))
	if got := lbPod(again); got != firstPod {
		t.Errorf("with the learned flow, connection from port %d goes to %q, want %q", other, got, firstPod)
	}
	if hit := again.Hops[0].Trail; !trailHas(hit, pipeline.TSessionAffinity, "priority=200") || trailHas(hit, pipeline.TServiceLB, "group:") {
		t.Errorf("the second connection did not take the learned flow:\n%v", hit)
	}
	if n := len(again.Hops[0].Result.Learned); n != 0 {
		t.Errorf("a connection with a learned endpoint learned %d flows", n)
	}

	// web's own connections are not the client's: load-balanced anew.
	w := runTrace(t, m, "default/web", "sticky", flow(other))
	if trailHas(w.Hops[0].Trail, pipeline.TSessionAffinity, "priority=200") || len(w.Hops[0].Result.Learned) != 1 {
		t.Errorf("another client used the learned flow: %v", w.Hops[0].Trail)
	}
	// A Service without affinity learns nothing.
	if n := len(runTrace(t, m, "default/client", "db-svc", "").Hops[0].Result.Learned); n != 0 {
		t.Errorf("db-svc learned %d flows", n)
	}
}

func trailHas(trail []datapath.Step, table, text string) bool {
	for _, s := range trail {
		if s.Table == table && strings.Contains(s.Flow, text) {
			return true
		}
	}
	return false
}
