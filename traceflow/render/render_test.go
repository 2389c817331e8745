package render

import (
	"bytes"
	"strings"
	"testing"

	"sluice/traceflow/crd"
)

func sample() *crd.Traceflow {
	tf := &crd.Traceflow{Spec: crd.TraceflowSpec{
		Source:      crd.Source{Namespace: "default", Pod: "client"},
		Destination: crd.Destination{Namespace: "default", Service: "db-svc"},
	}}
	tf.Name = "default-client-to-default-db-svc-abcdefgh"
	tf.Status.Phase = crd.PhaseSucceeded
	tf.Status.Results = []crd.NodeResult{{Node: "n1", Timestamp: 1700000000, Observations: []crd.Observation{
		{Component: crd.ComponentSpoofGuard, Action: crd.ActionForwarded, SrcPodIP: "10.0.0.5"},
		{Component: crd.ComponentNetworkPolicy, ComponentInfo: "EgressMetric", Action: crd.ActionDropped, NetworkPolicy: "AntreaClusterNetworkPolicy:p", NetworkPolicyRule: "r"},
	}}}
	return tf
}

// TestYAMLLayout pins antctl's layout: field order, omitted empties and
// go-yaml v3's 4-space indentation with sequences indented under keys.
func TestYAMLLayout(t *testing.T) {
	var b bytes.Buffer
	if err := YAML(&b, Summarize(sample())); err != nil {
		t.Fatal(err)
	}
	want := `name: default-client-to-default-db-svc-abcdefgh
phase: Succeeded
source: default/client
destination: default/db-svc
results:
    - node: n1
      timestamp: 1700000000
      observations:
        - component: SpoofGuard
          action: Forwarded
          srcPodIP: 10.0.0.5
        - component: NetworkPolicy
          componentInfo: EgressMetric
          action: Dropped
          networkPolicy: AntreaClusterNetworkPolicy:p
          networkPolicyRule: r
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestJSONHasNoTrailingNewline(t *testing.T) {
	var b bytes.Buffer
	if err := JSON(&b, Summarize(sample())); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if strings.HasSuffix(s, "\n") || !strings.HasPrefix(s, "{\n  \"name\": ") || !strings.Contains(s, `"srcPodIP": "10.0.0.5"`) {
		t.Errorf("json:\n%s", s)
	}
}

func TestSourceWithoutPodPrintsSlash(t *testing.T) {
	tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Destination: crd.Destination{IP: "1.2.3.4"}}}
	if s := Summarize(tf); s.Source != "/" || s.Destination != "1.2.3.4" {
		t.Errorf("%+v", s)
	}
}

func TestDOT(t *testing.T) {
	var b bytes.Buffer
	if err := DOT(&b, sample()); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{"digraph G {", `label="n1"`, `"NetworkPolicy\nEgressMetric\nDropped\nNetpol: AntreaClusterNetworkPolicy:p\nRule: r", color="#B22222"`, "source -> n0_0;", "n0_0 -> n0_1;"} {
		if !strings.Contains(s, want) {
			t.Errorf("dot lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "destination [") {
		t.Error("a dropped packet must not reach the destination node")
	}
	failed := sample()
	failed.Status.Phase, failed.Status.Reason = crd.PhaseFailed, `Traceflow "timeout"`
	b.Reset()
	_ = DOT(&b, failed)
	if !strings.Contains(b.String(), `label="Traceflow default-client-to-default-db-svc-abcdefgh failed: Traceflow \"timeout\""`) {
		t.Errorf("failed label not escaped:\n%s", b.String())
	}
}

func TestDiff(t *testing.T) {
	before, after := sample(), sample()
	after.Status.Results[0].Observations[1] = crd.Observation{Component: crd.ComponentForwarding, ComponentInfo: "Output", Action: crd.ActionDelivered}
	var b bytes.Buffer
	if err := Diff(&b, before, after); err != nil {
		t.Fatal(err)
	}
	want := "# changes\nnode n1:\n  - NetworkPolicy/EgressMetric Dropped networkPolicy=AntreaClusterNetworkPolicy:p networkPolicyRule=r\n  + Forwarding/Output Delivered\n"
	if !strings.HasSuffix(b.String(), want) {
		t.Errorf("diff:\n%s", b.String())
	}
	b.Reset()
	_ = Diff(&b, before, sample())
	if !strings.HasSuffix(b.String(), "none: the proposed objects do not change this trace\n") {
		t.Errorf("no-change diff:\n%s", b.String())
	}
}
