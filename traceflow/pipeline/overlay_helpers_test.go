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
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	top, err := cluster.ReadPath(ctx, "../testdata/overlays/"+overlay)
	if err != nil {
		t.Fatal(err)
	}
	st, probs := cluster.Build(cluster.Overlay(objs, top))
	if probs.Err() != nil {
		t.Fatal(probs.Err())
	}
	m, _, err := Build(ctx, st, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return m
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
