package kube_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sluice/certs"
	"sluice/test/kube/kubetest"
)

// Names of the collector TLS Secrets the tests below create.
const (
	collectorCASecret     = "collector-ca"
	collectorClientSecret = "collector-client"
)

// collectorTLSConfig is the flowCollector.tls section naming the Secrets.
var collectorTLSConfig = fmt.Sprintf("  tls:\n    enable: true\n    caSecretName: %s\n    clientSecretName: %s\n",
	collectorCASecret, collectorClientSecret)

// applyCollectorTLSRBAC applies what the chart adds when
// flowCollector.tls names the Secrets: a Role that lets the aggregator's
// ServiceAccount get them, and its binding.
func applyCollectorTLSRBAC(t *testing.T, ctx context.Context, c *kubetest.Cluster) {
	t.Helper()
	out, err := render(t, "flow-aggregator", "flow-aggregator", "flowCollector.enable=true", "flowCollector.address=c:4739",
		"flowCollector.tls.enable=true", "flowCollector.tls.caSecretName="+collectorCASecret,
		"flowCollector.tls.clientSecretName="+collectorClientSecret)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	var rbac []string
	for _, o := range objs {
		if strings.HasSuffix(o.GetName(), "-collector-tls") {
			rbac = append(rbac, o.GetKind())
		}
	}
	if strings.Join(rbac, ",") != "Role,RoleBinding" {
		t.Fatalf("the chart renders %v for the collector's Secrets, want a Role and its RoleBinding", rbac)
	}
	res, err := c.ServerSideApply(ctx, objs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}

// putSecret creates or replaces a Secret.
func putSecret(t *testing.T, ctx context.Context, cs kubernetes.Interface, s *corev1.Secret) {
	t.Helper()
	api := cs.CoreV1().Secrets(s.Namespace)
	if old, err := api.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
		old.Data, old.Type = s.Data, s.Type
		if _, err := api.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	if _, err := api.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// collectorSecrets makes a CA and a client certificate in dir (whose CA,
// if any, is kept) and stores them in the Secrets the tests name.
func collectorSecrets(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns, dir string) *certs.Bundle {
	t.Helper()
	b, err := certs.Ensure(dir, certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	putSecret(t, ctx, cs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: collectorCASecret, Namespace: ns},
		Data: map[string][]byte{"ca.crt": read(certs.CACertFile)}})
	putSecret(t, ctx, cs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: collectorClientSecret, Namespace: ns},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": read(certs.ClientCertFile), "tls.key": read(certs.ClientKeyFile)}})
	return b
}

// TestCollectorTLSFromSecrets runs the aggregator with the token of the
// chart's ServiceAccount, flowCollector.tls naming a CA Secret and a
// client Secret, against a TLS collector that requires a client
// certificate from that CA: records reach it, over connections that
// presented the client certificate of the Secret. After the client Secret
// is renewed and the collector drops the connection, the next connection
// presents the new certificate.
func TestCollectorTLSFromSecrets(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	installDefaults(t, ctx, c)
	applyCollectorTLSRBAC(t, ctx, c)
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "flow-aggregator"
	dir := t.TempDir()
	caDir := filepath.Join(dir, "collector")
	b := collectorSecrets(t, ctx, admin, ns, caDir)

	sa, err := c.ServiceAccountConfig(ctx, ns, "flow-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	// RBAC reaches the authorizer through its informers: wait until the
	// grant is seen, and check it is no wider than the two Secrets.
	if err := poll(ctx, "the collector Secrets' grant visible", func() (bool, error) {
		return canINamed(ctx, sa, "get", "secrets", ns, collectorClientSecret)
	}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{collectorCASecret, "some-other-secret"} {
		ok, err := canINamed(ctx, sa, "get", "secrets", ns, name)
		if err != nil {
			t.Fatal(err)
		}
		if ok != (name == collectorCASecret) {
			t.Errorf("aggregator may get Secret %s: %v", name, ok)
		}
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}

	// The collector: mutual TLS with its CA, as the Secrets hold it.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", b.ServerTLS(true))
	if err != nil {
		t.Fatal(err)
	}
	jc := serveJSON(t, ln)
	agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: kubeconfig, collectorExtra: collectorTLSConfig,
		env: []string{"POD_NAMESPACE=" + ns}}, jc)
	s := dialSender(t, ctx, agg.ipfix)
	src := netip.MustParseAddr("10.244.1.7")
	// delivered sends a record (a new port each time) until the collector
	// has one over a connection that presented want.
	port := uint16(1000)
	delivered := func(what string, want []byte) {
		t.Helper()
		if err := poll(ctx, what, func() (bool, error) {
			select {
			case <-agg.exited:
				return false, fmt.Errorf("aggregator exited:\n%s", agg.logs.String())
			default:
			}
			port++
			s.send(t, src, port, time.Now())
			jc.mu.Lock()
			defer jc.mu.Unlock()
			return jc.byPeer[string(want)] > 0, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	delivered("records over mutual TLS with the Secret's client certificate", b.Client.Certificate[0])

	// Renew the client certificate (same CA, new key pair) in its Secret,
	// then drop the connection: the aggregator reads the Secret again.
	for _, f := range []string{certs.ClientCertFile, certs.ClientKeyFile, certs.ServerCertFile, certs.ServerKeyFile} {
		if err := os.Remove(filepath.Join(caDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	renewed := collectorSecrets(t, ctx, admin, ns, caDir)
	if bytes.Equal(renewed.Client.Certificate[0], b.Client.Certificate[0]) {
		t.Fatal("the client certificate was not renewed")
	}
	jc.mu.Lock()
	for conn := range jc.conns {
		conn.Close()
	}
	jc.mu.Unlock()
	delivered("records over a new connection with the renewed client certificate", renewed.Client.Certificate[0])
}

// TestCollectorTLSSecretMissing: a Secret that flowCollector.tls names
// and that does not exist (or may not be read) stops the aggregator at
// start-up with an error naming the key and the Secret.
func TestCollectorTLSSecretMissing(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 2*time.Minute)
	installDefaults(t, ctx, c)
	applyCollectorTLSRBAC(t, ctx, c)
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "flow-aggregator"
	collectorSecrets(t, ctx, admin, ns, filepath.Join(t.TempDir(), "collector"))
	sa, err := c.ServiceAccountConfig(ctx, ns, "flow-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	jc := serveJSON(t, ln)
	extra := strings.Replace(collectorTLSConfig, "clientSecretName: "+collectorClientSecret, "clientSecretName: no-such-secret", 1)
	agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: kubeconfig, collectorExtra: extra,
		env: []string{"POD_NAMESPACE=" + ns}}, jc)
	agg.waitStartupFailure(t, ctx, "flowCollector.tls.clientSecretName", "no-such-secret")
}
