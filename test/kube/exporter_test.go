package kube_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sluice/exporter/nodecidr"
)

// TestExporterNodePodCIDRs reads Nodes' Pod CIDRs with a token of the
// chart's exporter ServiceAccount, as the exporter does without
// --pod-cidr: a dual-stack Node's two CIDRs, and a Node whose CIDR is
// allocated only after the exporter started asking. The same account may
// read Pods, Nodes and Services (its Pod metadata), and nothing more.
func TestExporterNodePodCIDRs(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 2*time.Minute)
	installDefaults(t, ctx, c)
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	sa, err := c.ServiceAccountConfig(ctx, "flow-aggregator", "flow-aggregator-exporter")
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "exp-node-1"},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.3.0/24", PodCIDRs: []string{"10.244.3.0/24", "fd00:10:244:3::/64"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := nodecidr.Lookup(ctx, client, "exp-node-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:10:244:3::/64")}
	if !slices.Equal(got, want) {
		t.Errorf("Pod CIDRs %v, want %v", got, want)
	}

	// A Node without a Pod CIDR yet: Lookup waits for the allocation.
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "exp-node-2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		p   []netip.Prefix
		err error
	}
	done := make(chan result, 1)
	go func() {
		p, err := nodecidr.Lookup(ctx, client, "exp-node-2", nil)
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("Lookup returned %v, %v before the Node had a Pod CIDR", r.p, r.err)
	case <-time.After(nodecidr.RetryInterval / 2):
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, "exp-node-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.4.0/24", []string{"10.244.4.0/24"}
	if _, err := admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !slices.Equal(r.p, []netip.Prefix{netip.MustParsePrefix("10.244.4.0/24")}) {
		t.Errorf("after allocation: %v, %v", r.p, r.err)
	}

	// The certificates: the CA and the client pair, not the CA's key.
	for _, c := range []struct {
		verb, resource, name string
		want                 bool
	}{{"get", "configmaps", "flow-aggregator-ca", true}, {"get", "secrets", "flow-aggregator-client-tls", true},
		{"get", "secrets", "flow-aggregator-ca-tls", false}, {"update", "secrets", "flow-aggregator-client-tls", false},
		{"get", "configmaps", "flow-aggregator-configmap", false}} {
		ok, err := canINamed(ctx, sa, c.verb, c.resource, "flow-aggregator", c.name)
		if err != nil {
			t.Fatal(err)
		}
		if ok != c.want {
			t.Errorf("exporter may %s %s %s: %v, want %v", c.verb, c.resource, c.name, ok, c.want)
		}
	}

	// A Node that does not exist is an error at once, not a wait.
	if _, err := nodecidr.Lookup(ctx, client, "no-such-node", nil); err == nil {
		t.Error("no error for a missing Node")
	}

	// Least privilege: read Pods, Nodes and Services; no more without
	// policy attribution.
	for _, c := range []struct {
		verb, resource string
		want           bool
	}{{"get", "nodes", true}, {"list", "nodes", true}, {"watch", "nodes", true}, {"watch", "pods", true}, {"list", "services", true},
		{"list", "namespaces", false}, {"list", "secrets", false}, {"update", "nodes", false}, {"update", "pods", false}} {
		ok, err := canI(ctx, sa, c.verb, c.resource)
		if err != nil {
			t.Fatal(err)
		}
		if ok != c.want {
			t.Errorf("exporter may %s %s: %v, want %v", c.verb, c.resource, ok, c.want)
		}
	}
}

// TestAggregatorLeastPrivilege checks what the chart's aggregator
// ServiceAccount may do: read Pods, Nodes and Services, and keep its
// certificates in its namespace; nothing else tested here.
func TestAggregatorLeastPrivilege(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, time.Minute)
	installDefaults(t, ctx, c)
	sa, err := c.ServiceAccountConfig(ctx, "flow-aggregator", "flow-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		verb, resource string
		want           bool
	}{{"list", "pods", true}, {"watch", "nodes", true}, {"get", "services", true}, {"create", "pods", false},
		{"list", "secrets", false}, {"list", "configmaps", false}, {"delete", "nodes", false}} {
		ok, err := canI(ctx, sa, c.verb, c.resource)
		if err != nil {
			t.Fatal(err)
		}
		if ok != c.want {
			t.Errorf("aggregator may %s %s: %v, want %v", c.verb, c.resource, ok, c.want)
		}
	}
	// Its certificates in its own namespace, and no other Secret.
	for _, c := range []struct {
		verb, resource, ns, name string
		want                     bool
	}{{"update", "secrets", "flow-aggregator", "flow-aggregator-ca-tls", true},
		{"get", "configmaps", "flow-aggregator", "flow-aggregator-ca", true},
		{"create", "secrets", "flow-aggregator", "", true},
		// Its ConfigMap, to make it the owner of the three; not to change it.
		{"get", "configmaps", "flow-aggregator", "flow-aggregator-configmap", true},
		{"update", "configmaps", "flow-aggregator", "flow-aggregator-configmap", false},
		{"get", "configmaps", "flow-aggregator", "other", false},
		// The sinks' credentials reach it as environment variables.
		{"get", "secrets", "flow-aggregator", "clickhouse-secret", false},
		{"get", "secrets", "flow-aggregator", "other", false},
		{"get", "secrets", "kube-system", "flow-aggregator-ca-tls", false}} {
		ok, err := canINamed(ctx, sa, c.verb, c.resource, c.ns, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if ok != c.want {
			t.Errorf("aggregator may %s %s %s/%s: %v, want %v", c.verb, c.resource, c.ns, c.name, ok, c.want)
		}
	}
}
