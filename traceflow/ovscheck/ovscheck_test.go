package ovscheck

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"sluice/traceflow/corpus"
	"sluice/traceflow/crd"
	"sluice/traceflow/flowspec"
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

func (l *loader) load(ctx context.Context, c *corpus.Case, m *pipeline.Model, node string) (*Bridge, error) {
	key := c.Mode + "|" + strings.Join(c.Overlays, ",") + "|" + node
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
// model.
func TestCorpusAgreesWithOVS(t *testing.T) {
	ctx, s := startOVS(t)
	cases, err := corpus.Load(testdata)
	if err != nil {
		t.Fatal(err)
	}
	l := &loader{s: s}
	hops := 0
	for i := range cases {
		c := &cases[i]
		t.Run(c.Name, func(t *testing.T) {
			m, tr := traceCase(t, ctx, c)
			for _, h := range tr.Hops {
				if h.Result == nil {
					continue
				}
				b, err := l.load(ctx, c, m, h.Node)
				if err != nil {
					t.Fatal(err)
				}
				got, err := b.Trace(ctx, h.Entry, h.Frame)
				if err != nil {
					t.Fatal(err)
				}
				hops++
				if diffs := Compare(b.Tables, h.Result, got); len(diffs) > 0 {
					t.Errorf("Node %s disagrees with OVS:\n  %s\nOVS trace:\n%s", h.Node, strings.Join(diffs, "\n  "), got.Text)
				}
			}
		})
	}
	if hops < len(cases) {
		t.Errorf("only %d hops compared for %d cases", hops, len(cases))
	}
}
