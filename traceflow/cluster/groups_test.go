package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func TestGroupMembers(t *testing.T) {
	ctx := context.Background()
	objs, err := ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	top, err := ReadPath(ctx, "../testdata/overlays/antrea-groups.yaml")
	if err != nil {
		t.Fatal(err)
	}
	loop, err := ParseObjects([]byte(`apiVersion: crd.antrea.io/v1beta1
kind: ClusterGroup
metadata: {name: a}
spec: {childGroups: [b]}
---
apiVersion: crd.antrea.io/v1beta1
kind: ClusterGroup
metadata: {name: b}
spec: {childGroups: [a]}
`), "loop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st, probs := Build(Overlay(objs, append(top, loop...)))
	if probs.Err() != nil {
		t.Fatal(probs.Err())
	}
	members := func(ns, name string) string {
		pods, blocks, err := st.GroupMembers(ns, name)
		if err != nil {
			return "error: " + err.Error()
		}
		var keys []string
		for _, p := range pods {
			keys = append(keys, p.Key())
		}
		return fmt.Sprint(keys, blocks)
	}
	for _, c := range []struct{ ns, name, want string }{
		{"", "databases", "[default/db] []"},
		{"", "frontends", "[default/client] [172.20.0.0/16]"}, // nested: a Pod group and an IP block
		{"default", "public-dns", "[] [8.8.8.0/24 1.1.1.0/24]"},
		{"prod", "public-dns", `error: Group "public-dns" is not in the cluster state`}, // Groups are namespaced
		{"", "public-dns", `error: ClusterGroup "public-dns" is not in the cluster state`},
		{"", "a", "error: ClusterGroup"}, // a loop
	} {
		if got := members(c.ns, c.name); !strings.HasPrefix(got, c.want) {
			t.Errorf("%s/%s: %s, want %s", c.ns, c.name, got, c.want)
		}
	}
}
