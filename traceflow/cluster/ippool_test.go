package cluster

import (
	"context"
	"strings"
	"testing"
)

// TestIPPools: IPPools are read with their ranges, subnet and VLAN; a Pod
// takes its own ipam.antrea.io/ippools annotation over its Namespace's,
// and gets the pool only when the pool is known and holds its address.
func TestIPPools(t *testing.T) {
	ctx := context.Background()
	objs, err := ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	top, err := ReadPath(ctx, "../testdata/overlays/flexible-ipam.yaml")
	if err != nil {
		t.Fatal(err)
	}
	extra, err := ParseObjects([]byte(`
apiVersion: v1
kind: Pod
metadata: {name: stray, namespace: bridged, annotations: {ipam.antrea.io/ippools: nowhere}}
spec: {nodeName: k8s-node-1}
status: {phase: Running, podIP: 10.10.1.77}
---
apiVersion: v1
kind: Pod
metadata: {name: outside, namespace: bridged}
spec: {nodeName: k8s-node-1}
status: {phase: Running, podIP: 192.168.77.250}
`), "extra.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st, probs := Build(Overlay(Overlay(objs, top), extra))
	if err := probs.Err(); err != nil {
		t.Fatal(err)
	}
	v := st.IPPools["vlan20"]
	if v == nil || v.VLAN != 20 || v.Subnet.String() != "172.20.0.0/24" || v.Gateway.String() != "172.20.0.1" ||
		len(v.Ranges) != 1 || v.Ranges[0].First.String() != "172.20.0.16" || v.Ranges[0].Last.String() != "172.20.0.31" {
		t.Fatalf("vlan20 = %+v", v)
	}
	for pod, want := range map[string]string{"bridged/front": "underlay", "default/vlan-app": "vlan20", "default/client": "",
		"bridged/stray": "", "bridged/outside": ""} {
		ns, name, _ := strings.Cut(pod, "/")
		p := st.Pod(ns, name)
		got := ""
		if p.IPPool != nil {
			got = p.IPPool.Name
		}
		if got != want {
			t.Errorf("%s: pool %q, want %q", pod, got, want)
		}
	}
	var text []string
	for _, p := range probs {
		text = append(text, p.String())
	}
	all := strings.Join(text, "\n")
	for _, want := range []string{"Pod bridged/stray: allocates from IPPool nowhere, which is not in the cluster state",
		"Pod bridged/outside: no IPv4 address of it is in IPPool underlay",
		"Pod bridged/outside: IP 192.168.77.250 is outside the podCIDRs"} {
		if !strings.Contains(all, want) {
			t.Errorf("no warning %q in:\n%s", want, all)
		}
	}
	if strings.Contains(all, "bridged/front: IP") {
		t.Errorf("an IPPool address is warned about:\n%s", all)
	}
	bad, err := ParseObjects([]byte(`
apiVersion: crd.antrea.io/v1beta1
kind: IPPool
metadata: {name: bad}
spec: {ipRanges: [{start: 10.0.0.9, end: 10.0.1.2}], subnetInfo: {gateway: 10.0.0.1, prefixLength: 24}}
`), "bad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, probs := Build(Overlay(objs, bad)); probs.Err() == nil || !strings.Contains(probs.Err().Error(), "outside the subnet 10.0.0.0/24") {
		t.Errorf("a range outside the subnet: %v", probs.Err())
	}
}
