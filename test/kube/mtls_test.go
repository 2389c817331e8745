package kube_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/certs/kubecerts"
	"sluice/test/kube/kubetest"
)

// TestExporterMutualTLS runs the aggregator with the token of the chart's
// aggregator ServiceAccount and the exporter with the token of the
// exporter's, both as processes, as the chart starts them: the aggregator
// keeps its CA and publishes the client certificate in its namespace; the
// exporter, given no --pod-cidr and no certificate files, learns its
// Node's Pod CIDR and its client certificate from the API, and its records
// reach the aggregator over gRPC with mutual TLS. A restarted aggregator
// keeps the CA.
func TestExporterMutualTLS(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	installDefaults(t, ctx, c)
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const ns, node = "flow-aggregator", "mtls-node"
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.9.0/24", PodCIDRs: []string{"10.244.9.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := func(sa string) string {
		rc, err := c.ServiceAccountConfig(ctx, ns, sa)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, sa+".kubeconfig")
		if err := kubetest.WriteKubeconfig(p, rc); err != nil {
			t.Fatal(err)
		}
		return p
	}
	aggKC, expKC := kubeconfig("flow-aggregator"), kubeconfig("flow-aggregator-exporter")

	jc := startJSONCollector(t)
	agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: aggKC, grpc: true, env: []string{"POD_NAMESPACE=" + ns}}, jc)
	agg.waitPublished(t, ctx)
	cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, kubecerts.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := cm.Data["ca.crt"]

	logs := &lockedBuffer{}
	exp := exec.Command(shared.sluice, "exporter", "--source", "synthetic", "--rate", "50", "--node", node,
		"--collector", agg.grpc+":grpc", "--tls-from-namespace", ns, "--metrics-address", "", "--active-timeout", "1s")
	exp.Env = append(os.Environ(), "KUBECONFIG="+expKC)
	exp.Stdout, exp.Stderr = logs, logs
	if err := exp.Start(); err != nil {
		t.Fatal(err)
	}
	expExited := make(chan struct{})
	go func() { _ = exp.Wait(); close(expExited) }()
	t.Cleanup(func() {
		_ = exp.Process.Signal(os.Interrupt)
		select {
		case <-expExited:
		case <-time.After(30 * time.Second):
			_ = exp.Process.Kill()
			<-expExited
		}
		if t.Failed() {
			t.Logf("exporter log:\n%s", logs.String())
		}
	})

	podCIDR := netip.MustParsePrefix("10.244.9.0/24")
	if err := poll(ctx, "records from the exporter's Pods", func() (bool, error) {
		select {
		case <-expExited:
			return false, fmt.Errorf("exporter exited:\n%s", logs.String())
		default:
		}
		jc.mu.Lock()
		defer jc.mu.Unlock()
		for _, rec := range jc.recs {
			r, _ := rec["ipfix"].(map[string]any)
			src, _ := r["sourceIPv4Address"].(string)
			if a, err := netip.ParseAddr(src); err == nil && podCIDR.Contains(a) {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{"Pod CIDRs from the Node object", "10.244.9.0/24", "client certificate from the cluster"} {
		if !strings.Contains(out, want) {
			t.Errorf("exporter log lacks %q", want)
		}
	}

	// A restart with an empty certificate directory (an emptyDir) keeps
	// the CA that exporters trust.
	agg2 := startAggregatorWith(t, aggregatorOptions{kubeconfig: aggKC, grpc: true, env: []string{"POD_NAMESPACE=" + ns}}, jc)
	if err := poll(ctx, "certificates published again", func() (bool, error) {
		return strings.Contains(agg2.logs.String(), "TLS certificates published"), nil
	}); err != nil {
		t.Fatal(err)
	}
	cm2, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, kubecerts.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm2.Data["ca.crt"] != ca || !bytes.Contains([]byte(ca), []byte("BEGIN CERTIFICATE")) {
		t.Error("the CA changed across an aggregator restart")
	}
}
