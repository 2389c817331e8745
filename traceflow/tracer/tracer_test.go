package tracer

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"sluice/traceflow/cluster"
	"sluice/traceflow/corpus"
	"sluice/traceflow/crd"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/pipeline"
)

var fixedNow = func() time.Time { return time.Unix(1700000000, 0) }

// loadModel builds the fixture cluster, with overlays, in one mode.
func loadModel(t testing.TB, mode pipeline.TrafficMode, overlays ...string) *pipeline.Model {
	t.Helper()
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range overlays {
		top, err := cluster.ReadPath(ctx, "../testdata/overlays/"+o)
		if err != nil {
			t.Fatal(err)
		}
		objs = cluster.Overlay(objs, top)
	}
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		t.Fatal(err)
	}
	cfg := pipeline.DefaultConfig()
	cfg.TrafficMode, cfg.Tag = mode, 7
	m, _, err := pipeline.Build(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func trace(t testing.TB, m *pipeline.Model, src, dst, flow string) *crd.Traceflow {
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
	tf.Name = "test"
	tr, err := Run(context.Background(), m, tf, Options{Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Traceflow
}

// TestTraces runs every case of the Traceflow test corpus
// (testdata/corpus.yaml) and compares the results with the reference's.
func TestTraces(t *testing.T) {
	cases, err := corpus.Load("../testdata")
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("empty corpus")
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			m, err := c.Model(context.Background(), "../testdata")
			if err != nil {
				t.Fatal(err)
			}
			tf := trace(t, m, c.Src, c.Dst, c.Flow)
			if tf.Status.Phase != c.Phase || tf.Status.Reason != c.Reason {
				t.Errorf("phase %q reason %q, want %q %q", tf.Status.Phase, tf.Status.Reason, c.Phase, c.Reason)
			}
			want := c.Results
			for i := range want {
				want[i].Timestamp = fixedNow().Unix()
			}
			if !reflect.DeepEqual(tf.Status.Results, want) {
				got, _ := yaml.Marshal(tf.Status.Results)
				exp, _ := yaml.Marshal(want)
				t.Errorf("results:\n%s\nwant:\n%s", got, exp)
			}
		})
	}
}

func TestAdmission(t *testing.T) {
	m := loadModel(t, pipeline.Encap)
	for _, c := range []struct {
		spec crd.TraceflowSpec
		want string
	}{
		{crd.TraceflowSpec{Destination: crd.Destination{IP: "1.1.1.1"}}, "neither source nor destination Pod"},
		{crd.TraceflowSpec{Destination: crd.Destination{Namespace: "default", Pod: "db"}}, "source Pod must be specified"},
		{crd.TraceflowSpec{Source: crd.Source{Namespace: "default", Pod: "ghost"}, Destination: crd.Destination{IP: "1.1.1.1"}}, "requested source Pod default/ghost not found"},
		{crd.TraceflowSpec{Source: crd.Source{Namespace: "prod", Pod: "node-exporter"}, Destination: crd.Destination{IP: "1.1.1.1"}}, "hostNetwork Pod"},
	} {
		tf := &crd.Traceflow{Spec: c.spec}
		tf.Name = "t"
		_, err := Run(context.Background(), m, tf, Options{Now: fixedNow})
		var ae *AdmissionError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want admission error containing %q", c.spec, err, c.want)
		}
	}
}
