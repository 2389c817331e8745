package tracer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/pipeline"
)

type obj = map[string]any

// randomCluster writes a small random cluster, sometimes inconsistent
// (overlapping CIDRs, Pods on unknown Nodes, duplicate IPs, Egress IPs on
// no Node), as the objects a user might hand us.
func randomCluster(r *rand.Rand) []obj {
	var out []obj
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	nNodes := 1 + r.IntN(4)
	for i := 0; i < nNodes; i++ {
		cidrs := []string{fmt.Sprintf("10.%d.0.0/24", i)}
		if r.IntN(8) == 0 {
			cidrs[0] = "10.0.0.0/16" // overlaps Node 0
		}
		if r.IntN(2) == 0 {
			cidrs = append(cidrs, fmt.Sprintf("fd00:%d::/64", i))
		}
		ip := fmt.Sprintf("192.168.%d.%d", r.IntN(2), 1+i)
		out = append(out, obj{"apiVersion": "v1", "kind": "Node", "metadata": obj{"name": fmt.Sprintf("n%d", i)},
			"spec": obj{"podCIDRs": cidrs}, "status": obj{"addresses": []obj{{"type": "InternalIP", "address": ip}}}})
	}
	var podIPs []string
	for k := 0; k < r.IntN(9); k++ {
		node := r.IntN(nNodes)
		if r.IntN(12) == 0 {
			node = nNodes // an unknown Node
		}
		host := 2 + k
		if r.IntN(12) == 0 {
			host = 2 // maybe a duplicate IP
		}
		ips := []obj{{"ip": fmt.Sprintf("10.%d.0.%d", node%nNodes, host)}}
		if r.IntN(2) == 0 {
			ips = append(ips, obj{"ip": fmt.Sprintf("fd00:%d::%d", node%nNodes, host)})
		}
		podIPs = append(podIPs, ips[0]["ip"].(string))
		out = append(out, obj{"apiVersion": "v1", "kind": "Pod",
			"metadata": obj{"name": fmt.Sprintf("p%d", k), "namespace": pick("x", "y"), "labels": obj{"app": pick("a", "b", "c")}},
			"spec":     obj{"nodeName": fmt.Sprintf("n%d", node), "hostNetwork": r.IntN(10) == 0},
			"status":   obj{"podIPs": ips}})
	}
	out = append(out, obj{"apiVersion": "v1", "kind": "Namespace", "metadata": obj{"name": "x", "labels": obj{"team": "t"}}})
	for k := 0; k < r.IntN(3); k++ {
		name := fmt.Sprintf("s%d", k)
		proto := pick("TCP", "UDP")
		out = append(out, obj{"apiVersion": "v1", "kind": "Service", "metadata": obj{"name": name, "namespace": "x"},
			"spec": obj{"clusterIP": fmt.Sprintf("10.96.0.%d", 1+k), "ports": []obj{{"name": "p", "port": 1 + r.IntN(1000), "protocol": proto}}}})
		var eps []obj
		for e := 0; e < r.IntN(3) && len(podIPs) > 0; e++ {
			eps = append(eps, obj{"addresses": []string{podIPs[r.IntN(len(podIPs))]}})
		}
		out = append(out, obj{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
			"metadata":    obj{"name": name + "-1", "namespace": "x", "labels": obj{"kubernetes.io/service-name": name}},
			"addressType": "IPv4", "ports": []obj{{"name": "p", "port": 1 + r.IntN(1000), "protocol": proto}}, "endpoints": eps})
	}
	sel := func() obj { return obj{"matchLabels": obj{"app": pick("a", "b", "c")}} }
	peer := func() obj {
		switch r.IntN(4) {
		case 0:
			return obj{"ipBlock": obj{"cidr": pick("10.0.0.0/8", "0.0.0.0/0", "8.8.8.0/24"), "except": []string{"10.1.0.0/16"}}}
		case 1:
			return obj{"namespaceSelector": obj{"matchLabels": obj{"team": "t"}}}
		}
		return obj{"podSelector": sel()}
	}
	ports := func() []obj {
		if r.IntN(2) == 0 {
			return nil
		}
		return []obj{{"protocol": pick("TCP", "UDP"), "port": 1 + r.IntN(1000), "endPort": 1000 + r.IntN(2000)}}
	}
	for k := 0; k < r.IntN(4); k++ {
		spec := obj{"podSelector": sel(), "policyTypes": []string{pick("Ingress", "Egress")}}
		if r.IntN(2) == 0 {
			spec["ingress"] = []obj{{"from": []obj{peer()}, "ports": ports()}}
			spec["egress"] = []obj{{"to": []obj{peer()}, "ports": ports()}}
		}
		out = append(out, obj{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
			"metadata": obj{"name": fmt.Sprintf("np%d", k), "namespace": pick("x", "y")}, "spec": spec})
	}
	for k := 0; k < r.IntN(3); k++ {
		rule := func() obj {
			return obj{"action": pick("Allow", "Drop", "Reject", "Pass"), "from": []obj{peer()}, "to": []obj{peer()}, "ports": ports()}
		}
		kind := pick("NetworkPolicy", "ClusterNetworkPolicy")
		out = append(out, obj{"apiVersion": "crd.antrea.io/v1beta1", "kind": kind,
			"metadata": obj{"name": fmt.Sprintf("ap%d", k), "namespace": "x"},
			"spec": obj{"tier": pick("application", "securityops", "baseline"), "priority": r.Float64() * 10,
				"appliedTo": []obj{{"podSelector": sel()}}, "ingress": []obj{rule()}, "egress": []obj{rule()}}})
	}
	for k := 0; k < r.IntN(3); k++ {
		e := obj{"apiVersion": "crd.antrea.io/v1beta1", "kind": "Egress", "metadata": obj{"name": fmt.Sprintf("e%d", k)},
			"spec": obj{"appliedTo": obj{"podSelector": sel()}, "egressIP": fmt.Sprintf("192.168.0.%d", 1+r.IntN(6))}}
		if r.IntN(3) > 0 {
			e["status"] = obj{"egressNode": fmt.Sprintf("n%d", r.IntN(nNodes+1)), "egressIP": fmt.Sprintf("192.168.0.%d", 1+r.IntN(6))}
		}
		out = append(out, e)
	}
	return out
}

// traceRandom builds a random cluster and traces a random request from
// every Pod; it fails on anything but a finished trace or an admission
// error, and counts the phases it saw ("refused" for a state rejected
// with a message).
func traceRandom(t *testing.T, seed uint64, flow string, mode uint8, seen map[string]int) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var objs []cluster.Object
	for i, o := range randomCluster(r) {
		b, _ := json.Marshal(o)
		parsed, err := cluster.ParseObjects(b, fmt.Sprint(i))
		if err != nil {
			t.Fatalf("generator wrote a bad object: %v", err)
		}
		objs = append(objs, parsed...)
	}
	st, probs := cluster.Build(objs)
	if probs.Err() != nil {
		seen["refused"]++
		return // refused with a message: fine
	}
	cfg := pipeline.DefaultConfig()
	cfg.Tag = 7
	cfg.TrafficMode = []pipeline.TrafficMode{pipeline.Encap, pipeline.NoEncap, pipeline.Hybrid, pipeline.NetworkPolicyOnly}[mode%4]
	if mode&4 != 0 {
		cfg.TunnelType = "vxlan"
	}
	if mode&8 != 0 && cfg.TrafficMode == pipeline.Encap {
		cfg.Encryption = pipeline.WireGuard
	}
	m, _, err := pipeline.Build(context.Background(), st, cfg)
	if err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	pkt, err := flowspec.Parse(flow)
	if err != nil {
		pkt = crd.Packet{}
	}
	dsts := []string{"8.8.8.8", "192.168.0.1", "10.0.0.1", "fd00:1::2", "10.96.0.1", "x/s0", "x/s1", "nope"}
	for _, p := range st.Pods {
		dsts = append(dsts, p.Key())
	}
	for _, src := range st.Pods {
		s, d, err := Endpoints(st, src.Key(), dsts[r.IntN(len(dsts))])
		if err != nil {
			t.Fatal(err)
		}
		tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d, Packet: pkt}}
		tf.Name = "fuzz"
		tr, err := Run(context.Background(), m, tf, Options{Now: fixedNow})
		var ae *AdmissionError
		if errors.As(err, &ae) {
			continue
		}
		if err != nil {
			t.Fatalf("%s -> %+v: %v", src.Key(), d, err)
		}
		st := tr.Traceflow.Status
		if st.Phase != crd.PhaseSucceeded && st.Phase != crd.PhaseFailed {
			t.Fatalf("phase %q", st.Phase)
		}
		if len(st.Results) > maxHops {
			t.Fatalf("%d results", len(st.Results))
		}
		seen[string(st.Phase)]++
		if st.Phase == crd.PhaseSucceeded && len(st.Results) == 0 {
			t.Fatal("succeeded without results")
		}
	}
}

// TestRandomClusters is the property test run on every `go test`: the
// tracer terminates and never fails on a few hundred random states.
func TestRandomClusters(t *testing.T) {
	flows := []string{"", "tcp,tcp_dst=80", "udp,udp_dst=53", "ipv6", "ipv6,tcp,tcp_dst=443", "icmp"}
	seen := map[string]int{}
	for seed := uint64(0); seed < 300; seed++ {
		traceRandom(t, seed, flows[seed%uint64(len(flows))], uint8(seed), seen)
	}
	t.Logf("outcomes: %v", seen)
	// The generator must exercise all three outcomes, or the property
	// says little.
	if seen["refused"] == 0 || seen[string(crd.PhaseSucceeded)] < 100 || seen[string(crd.PhaseFailed)] == 0 {
		t.Errorf("random states too uniform: %v", seen)
	}
}

// FuzzTrace explores cluster states, packets and modes.
func FuzzTrace(f *testing.F) {
	f.Add(uint64(1), "tcp,tcp_dst=80", uint8(0))
	f.Add(uint64(7), "ipv6", uint8(1))
	f.Add(uint64(42), "udp,udp_dst=53", uint8(6))
	f.Fuzz(func(t *testing.T, seed uint64, flow string, mode uint8) {
		traceRandom(t, seed, flow, mode, map[string]int{})
	})
}
