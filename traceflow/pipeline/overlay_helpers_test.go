package pipeline

import (
	"context"
	"strings"
	"testing"

	"sluice/traceflow/cluster"
)

// overlayModel builds the default configuration's model of the test
// cluster with overlay (a file of ../testdata/overlays) on top.
func overlayModel(t *testing.T, overlay string) *Model {
	t.Helper()
	m, _, err := Build(context.Background(), overlayState(t, overlay), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// overlayState is the cluster state of the test fixture with the objects
// of testdata/overlays/overlay on top (none when overlay is "").
func overlayState(t *testing.T, overlay string) *cluster.State {
	t.Helper()
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	if overlay != "" {
		top, err := cluster.ReadPath(ctx, "../testdata/overlays/"+overlay)
		if err != nil {
			t.Fatal(err)
		}
		objs = cluster.Overlay(objs, top)
	}
	st, probs := cluster.Build(objs)
	if probs.Err() != nil {
		t.Fatal(probs.Err())
	}
	return st
}

// stateWith builds the cluster state of base with the objects of yaml
// (named name in errors) on top.
func stateWith(t *testing.T, base []cluster.Object, yaml, name string) (*cluster.State, cluster.Problems) {
	t.Helper()
	top, err := cluster.ParseObjects([]byte(yaml), name)
	if err != nil {
		t.Fatal(err)
	}
	st, probs := cluster.Build(cluster.Overlay(base, top))
	if probs.Err() != nil {
		t.Fatal(probs.Err())
	}
	return st, probs
}

// flowDump is a Node's flows as OVS prints them, one per line.
func flowDump(m *Model, node string) string {
	var b strings.Builder
	for _, f := range m.Nodes[node].Bridge.Flows() {
		b.WriteString(f.String() + "\n")
	}
	return b.String()
}
