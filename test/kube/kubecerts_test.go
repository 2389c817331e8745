package kube_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/certs"
	"sluice/certs/kubecerts"
)

// TestKubecertsCAConflict: a CA Secret that another aggregator replica
// created after this one looked is never overwritten (ErrCAConflict), a
// restart adopts it (Restore), and what is published is what Fetch
// returns.
func TestKubecertsCAConflict(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, time.Minute)
	const ns = "certs-race"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs := t.TempDir(), t.TempDir()
	if _, err := certs.Ensure(mine, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.Ensure(theirs, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	found, err := kubecerts.Restore(ctx, admin, ns, mine)
	if err != nil || found {
		t.Fatalf("Restore in an empty namespace: %v, %v", found, err)
	}
	// The other replica publishes first.
	if err := kubecerts.Publish(ctx, admin, ns, theirs, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := kubecerts.Publish(ctx, admin, ns, mine, false, nil); !errors.Is(err, kubecerts.ErrCAConflict) {
		t.Fatalf("Publish over another replica's CA: %v, want ErrCAConflict", err)
	}
	// Restarted with an empty directory, this replica adopts their CA.
	fresh := filepath.Join(t.TempDir(), "certs")
	found, err = kubecerts.Restore(ctx, admin, ns, fresh)
	if err != nil || !found {
		t.Fatalf("Restore: %v, %v", found, err)
	}
	if _, err := certs.Ensure(fresh, certs.Options{}); err != nil {
		t.Fatal(err)
	}
	if !sameFile(t, filepath.Join(fresh, certs.CACertFile), filepath.Join(theirs, certs.CACertFile)) {
		t.Fatal("the restored CA is not the published one")
	}
	if err := kubecerts.Publish(ctx, admin, ns, fresh, found, nil); err != nil {
		t.Fatal(err)
	}
	got := t.TempDir()
	if err := kubecerts.Fetch(ctx, admin, ns, got); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{certs.CACertFile, certs.ClientCertFile, certs.ClientKeyFile} {
		if !sameFile(t, filepath.Join(got, f), filepath.Join(fresh, f)) {
			t.Errorf("fetched %s differs from the published one", f)
		}
	}
	s, err := admin.CoreV1().Secrets(ns).Get(ctx, kubecerts.ClientSecret, metav1.GetOptions{})
	if err != nil || s.Type != corev1.SecretTypeTLS {
		t.Errorf("client Secret: %v, type %q", err, s.Type)
	}
	if _, err := certs.LoadClient(filepath.Join(got, certs.ClientCertFile), filepath.Join(got, certs.ClientKeyFile),
		filepath.Join(got, certs.CACertFile)); err != nil {
		t.Errorf("the fetched client certificate does not load: %v", err)
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(x, y)
}
