package kube_test

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/certs"
	"sluice/certs/kubecerts"
	"sluice/test/kube/kubetest"
)

func parseCert(t *testing.T, what string, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", what)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// TestClusterCARenewedAtStart: a CA kept in the cluster that expires
// within the renewal window (30 days) is replaced when the aggregator
// starts, with the chart's ServiceAccount token, and the new CA and a
// client certificate issued by it are published for the exporters.
// Renewal happens at start-up only (docs/tls.md): a running aggregator
// does not renew.
func TestClusterCARenewedAtStart(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 2*time.Minute)
	installDefaults(t, ctx, c)
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "flow-aggregator"
	old := t.TempDir()
	if _, err := certs.Ensure(old, certs.Options{CAValidity: 20 * 24 * time.Hour, Validity: 10 * 24 * time.Hour,
		RenewBefore: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := kubecerts.Publish(ctx, admin, ns, old, true, nil); err != nil {
		t.Fatal(err)
	}
	oldCA, err := os.ReadFile(filepath.Join(old, certs.CACertFile))
	if err != nil {
		t.Fatal(err)
	}

	rc, err := c.ServiceAccountConfig(ctx, ns, "flow-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kc, rc); err != nil {
		t.Fatal(err)
	}
	jc := startJSONCollector(t)
	agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: kc, grpc: true, env: []string{"POD_NAMESPACE=" + ns}}, jc)
	agg.waitPublished(t, ctx)

	caSecret, err := admin.CoreV1().Secrets(ns).Get(ctx, kubecerts.CASecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newCA := caSecret.Data[certs.CACertFile]
	if string(newCA) == string(oldCA) {
		t.Fatal("the CA expiring within 20 days was kept")
	}
	ca := parseCert(t, "new CA", newCA)
	if left := time.Until(ca.NotAfter); left < 365*24*time.Hour {
		t.Errorf("the new CA expires in %v", left.Round(time.Hour))
	}
	cm, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, kubecerts.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data[certs.CACertFile] != string(newCA) {
		t.Error("the CA ConfigMap does not hold the new CA")
	}
	client, err := admin.CoreV1().Secrets(ns).Get(ctx, kubecerts.ClientSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(client.Data[certs.CACertFile]) != string(newCA) {
		t.Error("the client Secret's ca.crt is not the new CA")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	leaf := parseCert(t, "client certificate", client.Data[corev1.TLSCertKey])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the published client certificate does not verify against the new CA: %v", err)
	}
}
