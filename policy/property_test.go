package policy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"sluice/policy/flowsrc"
	"sluice/policy/observed"
	"sluice/policy/recommend"
	"sluice/policy/verify"
	"sluice/traceflow/cluster"
)

// randomCluster makes a small cluster: two Nodes, up to three namespaces,
// workloads of one to three Pods (Deployments, StatefulSets or Pods
// without an owner; sometimes two workloads with the same labels, so no
// selector tells them apart), named and unnamed container ports, and
// sometimes NetworkPolicies of the cluster's own (an ingress one, and an
// egress one that lets a workload reach one outside address only).
// limited is a Pod of the workload the egress policy limits, if any.
func randomCluster(r *rand.Rand) (objs []cluster.Object, podIPs []netip.Addr, limited netip.Addr, err error) {
	var docs []any
	for n := 1; n <= 2; n++ {
		docs = append(docs, map[string]any{"apiVersion": "v1", "kind": "Node",
			"metadata": map[string]any{"name": fmt.Sprintf("n%d", n)},
			"spec":     map[string]any{"podCIDR": fmt.Sprintf("10.1.%d.0/24", n), "podCIDRs": []string{fmt.Sprintf("10.1.%d.0/24", n)}},
			"status":   map[string]any{"addresses": []any{map[string]any{"type": "InternalIP", "address": fmt.Sprintf("192.168.0.%d", n)}}}})
	}
	nns := 1 + r.IntN(3)
	for i := range nns {
		docs = append(docs, map[string]any{"apiVersion": "v1", "kind": "Namespace",
			"metadata": map[string]any{"name": fmt.Sprintf("ns%d", i), "labels": map[string]any{"team": []string{"a", "b"}[r.IntN(2)]}}})
	}
	wlNS := map[int]string{}
	wlPod := map[int]netip.Addr{}
	next := [3]int{0, 10, 10}
	nwl := 2 + r.IntN(4)
	for w := range nwl {
		ns := fmt.Sprintf("ns%d", r.IntN(nns))
		wlNS[w] = ns
		labels := map[string]any{"app": fmt.Sprintf("w%d", w)}
		if w > 0 && r.IntN(5) == 0 {
			labels = map[string]any{"app": "shared"}
		}
		if r.IntN(2) == 0 {
			labels["tier"] = []string{"web", "db"}[r.IntN(2)]
		}
		kind := []string{"Deployment", "StatefulSet", ""}[r.IntN(3)]
		for p := range 1 + r.IntN(3) {
			node := 1 + r.IntN(2)
			ip := netip.AddrFrom4([4]byte{10, 1, byte(node), byte(next[node])})
			next[node]++
			podIPs = append(podIPs, ip)
			if p == 0 {
				wlPod[w] = ip
			}
			md := map[string]any{"name": fmt.Sprintf("w%d-%d", w, p), "namespace": ns, "labels": labels}
			switch kind {
			case "Deployment":
				md["labels"] = merge(labels, map[string]any{"pod-template-hash": "5d4f8"})
				md["ownerReferences"] = []any{map[string]any{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": fmt.Sprintf("w%d-5d4f8", w), "uid": "u", "controller": true}}
			case "StatefulSet":
				md["ownerReferences"] = []any{map[string]any{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": fmt.Sprintf("w%d", w), "uid": "u", "controller": true}}
			}
			ports := []any{map[string]any{"containerPort": 8080, "name": "http"}, map[string]any{"containerPort": 53, "protocol": "UDP", "name": "dns"}}
			if r.IntN(2) == 0 {
				ports = []any{map[string]any{"containerPort": 8080}}
			}
			docs = append(docs, map[string]any{"apiVersion": "v1", "kind": "Pod", "metadata": md,
				"spec":   map[string]any{"nodeName": fmt.Sprintf("n%d", node), "containers": []any{map[string]any{"name": "c", "image": "x", "ports": ports}}},
				"status": map[string]any{"phase": "Running", "podIP": ip.String(), "podIPs": []any{map[string]any{"ip": ip.String()}}}})
		}
	}
	if r.IntN(3) == 0 {
		docs = append(docs, map[string]any{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
			"metadata": map[string]any{"name": "own", "namespace": fmt.Sprintf("ns%d", r.IntN(nns))},
			"spec": map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": fmt.Sprintf("w%d", r.IntN(nwl))}},
				"ingress": []any{map[string]any{"from": []any{map[string]any{"namespaceSelector": map[string]any{}}},
					"ports": []any{map[string]any{"port": 8080}}}}}})
	}
	if r.IntN(3) == 0 {
		// One workload may reach one outside address only: its
		// neighbours in the same CIDR are denied, and must stay so.
		w := r.IntN(nwl)
		limited = wlPod[w]
		docs = append(docs, map[string]any{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
			"metadata": map[string]any{"name": "own-out", "namespace": wlNS[w]},
			"spec": map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app": fmt.Sprintf("w%d", w)}},
				"policyTypes": []string{"Egress"},
				"egress": []any{map[string]any{"to": []any{map[string]any{"ipBlock": map[string]any{"cidr": "198.51.100.7/32"}}},
					"ports": []any{map[string]any{"port": 443}}}}}})
	}
	for i, d := range docs {
		b, err := json.Marshal(d)
		if err != nil {
			return nil, nil, limited, err
		}
		o, err := cluster.ParseObjects(b, fmt.Sprintf("random#%d", i))
		if err != nil {
			return nil, nil, limited, err
		}
		objs = append(objs, o...)
	}
	return objs, podIPs, limited, nil
}

func merge(a, b map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// randomTraffic makes connections between the Pods and a few outside
// addresses, on a few ports of TCP and UDP.
func randomTraffic(r *rand.Rand, pods []netip.Addr) *observed.Set {
	set := observed.NewSet(0)
	outside := []netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("198.51.100.200"), netip.MustParseAddr("203.0.113.9")}
	pick := func() netip.Addr {
		if r.IntN(4) == 0 {
			return outside[r.IntN(len(outside))]
		}
		return pods[r.IntN(len(pods))]
	}
	t0 := time.Unix(1_790_000_000, 0)
	for range 5 + r.IntN(20) {
		src, dst := pick(), pick()
		if src == dst || (!src.IsPrivate() && !dst.IsPrivate()) {
			continue
		}
		rec := flowsrc.Record{Start: t0, End: t0.Add(time.Minute), Src: src, Dst: dst, SrcPort: uint16(30000 + r.IntN(1000)),
			Proto: []uint8{6, 6, 17}[r.IntN(3)], DstPort: []uint16{8080, 443, 53, 9000}[r.IntN(4)]}
		for range 1 + r.IntN(3) {
			set.Add(&rec)
		}
	}
	return set
}

// TestPropertyRandomClusters: on random small clusters with random
// observed traffic, verifying the recommendations never blocks an
// observed connection the cluster allows now; a denied one becomes
// allowed only when some workload's selector could not be exact; and the
// independent checker allows every connection the recommendation carries.
func TestPropertyRandomClusters(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 28))
	ctx := context.Background()
	runs := 40
	if testing.Short() {
		runs = 10
	}
	checked := 0
	for run := range runs {
		objs, pods, limited, err := randomCluster(r)
		if err != nil {
			t.Fatal(err)
		}
		set := randomTraffic(r, pods)
		if limited.IsValid() {
			// The limited workload reaches its one address and tries a
			// neighbour (which the cluster denies).
			t0 := time.Unix(1_790_000_000, 0)
			for _, dst := range []string{"198.51.100.7", "198.51.100.200"} {
				set.Add(&flowsrc.Record{Start: t0, End: t0.Add(time.Minute), Src: limited, Dst: netip.MustParseAddr(dst), SrcPort: 40000, Proto: 6, DstPort: 443})
			}
		}
		conns := set.Conns()
		if len(conns) == 0 {
			continue
		}
		before := buildModel(t, objs)
		iso := []string{recommend.IsolationBoth, recommend.IsolationIngress, recommend.IsolationEgress}[r.IntN(3)]
		dd := []string{recommend.DenyNamespace, recommend.DenyWorkload}[r.IntN(2)]
		res, err := recommend.Recommend(ctx, before, objs, conns, recommend.Options{Isolation: iso, DefaultDeny: dd, PrefixV4: 16 + r.IntN(17)})
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		cands := candidates(t, res)
		after := buildModel(t, cluster.Overlay(objs, cands))
		rep, err := verify.Verify(ctx, before, after, cands, conns, verify.Options{})
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		inexact := false
		for _, o := range res.Objects {
			if o.Workload != nil && len(o.Workload.Extra) > 0 {
				inexact = true
			}
		}
		if rep.Blocks() || (len(rep.NewlyAllowed) > 0 && !inexact) {
			t.Errorf("run %d (%s, default deny per %s): newly blocked %+v, newly allowed %+v", run, iso, dd, rep.NewlyBlocked, rep.NewlyAllowed)
		}
		chk := newNPCheck(t, cluster.Overlay(objs, cands))
		for _, o := range res.Objects {
			for _, rules := range [][]*recommend.Rule{o.Ingress, o.Egress} {
				for _, rule := range rules {
					for _, c := range rule.Conns {
						checked++
						if !chk.allowed(c.Src, c.Dst, k8sProto(c.Proto), int32(c.DstPort)) {
							t.Errorf("run %d: %s carried by %s/%s, denied by the independent checker", run, recommend.ConnText(c), o.Policy.Namespace, o.Policy.Name)
						}
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no carried connection was checked")
	}
	t.Logf("%d runs, %d carried connections checked", runs, checked)
}
