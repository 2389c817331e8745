package kube_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sluice/clusterid"
	"sluice/flow"
	"sluice/ipfix"
	"sluice/test/kube/kubetest"
)

// ipfixRecord is what the cluster identity tests read of an exported
// record: its message's observation domain and its clusterId.
type ipfixRecord struct {
	domain    uint32
	clusterID string
	port      uint16
}

// ipfixCollector keeps the records of the IPFIX messages (over TCP) its
// listener receives.
type ipfixCollector struct {
	ln   net.Listener
	mu   sync.Mutex
	recs []ipfixRecord
}

func startIPFIXCollector(t *testing.T) *ipfixCollector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &ipfixCollector{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go c.serve(conn)
		}
	}()
	return c
}

func (c *ipfixCollector) serve(conn net.Conn) {
	defer conn.Close()
	dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	hdr := make([]byte, 16)
	for {
		if _, err := io.ReadFull(conn, hdr); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(hdr[2:4]))
		if n < 16 {
			return
		}
		msg := make([]byte, n)
		copy(msg, hdr)
		if _, err := io.ReadFull(conn, msg[16:]); err != nil {
			return
		}
		if dec.Reset(msg, time.Now()) != nil {
			return
		}
		for dec.Next() {
			r := dec.Record()
			rec := ipfixRecord{domain: dec.Header().ObservationDomainID}
			for i := range r.NumFields() {
				switch r.Field(i).IE.Name {
				case "clusterId":
					rec.clusterID, _ = r.String(i)
				case "sourceTransportPort":
					p, _ := r.Uint(i)
					rec.port = uint16(p)
				}
			}
			c.mu.Lock()
			c.recs = append(c.recs, rec)
			c.mu.Unlock()
		}
	}
}

// wait returns the first record of source port port.
func (c *ipfixCollector) wait(t *testing.T, ctx context.Context, port uint16) ipfixRecord {
	t.Helper()
	var got ipfixRecord
	if err := poll(ctx, fmt.Sprintf("record of port %d", port), func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, r := range c.recs {
			if r.port == port {
				got = r
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// fnv1 is FNV-1 (32-bit), written out: the observation domain the
// reference derives from the cluster UUID's 16 octets.
func fnv1(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h *= 16777619
		h ^= uint32(c)
	}
	return h
}

// TestAggregatorClusterIdentity runs the aggregator against the real API
// server and reads clusterId and the observation domain off the IPFIX it
// exports: without Antrea, the kube-system Namespace's UID; with Antrea's
// ConfigMap kube-system/antrea-cluster-identity, its uuid; with clusterID
// configured, that text, while the domain stays the UUID's.
func TestAggregatorClusterIdentity(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 4*time.Minute)
	installDefaults(t, ctx, c)
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	sa, err := c.ServiceAccountConfig(ctx, "flow-aggregator", "flow-aggregator")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}
	// The chart's grants, as the authorizer sees them.
	if err := poll(ctx, "RBAC grant visible", func() (bool, error) {
		return canINamed(ctx, sa, "get", "namespaces", "", "kube-system")
	}); err != nil {
		t.Fatal(err)
	}
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsUID, ok := flow.ParseUID(string(ns.UID))
	if !ok {
		t.Fatalf("kube-system UID %q", ns.UID)
	}
	run := func(name, topExtra string, port uint16, wantID string, wantUUID flow.UID) {
		t.Helper()
		coll := startIPFIXCollector(t)
		agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: kubeconfig, topExtra: topExtra, ipfixCollector: coll.ln.Addr().String()}, nil)
		s := dialSender(t, ctx, agg.ipfix)
		s.send(t, netip.MustParseAddr("10.244.9.9"), port, time.Now())
		r := coll.wait(t, ctx, port)
		if r.clusterID != wantID {
			t.Errorf("%s: clusterId %q, want %q", name, r.clusterID, wantID)
		}
		if want := fnv1(wantUUID[:]); r.domain != want {
			t.Errorf("%s: observation domain %#x, want %#x (FNV-1 of the UUID's octets; of nothing it is %#x)", name, r.domain, want, fnv1(nil))
		}
	}

	// No Antrea in this cluster: the Namespace's UID.
	if err := cs.CoreV1().ConfigMaps("kube-system").Delete(ctx, clusterid.ConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	run("no Antrea", "", 41000, string(ns.UID), nsUID)

	// Antrea's identity.
	const antreaUUID = "8f3b2c1d-4e5f-4a6b-9c7d-0e1f2a3b4c5d"
	u, _ := flow.ParseUID(antreaUUID)
	if _, err := cs.CoreV1().ConfigMaps("kube-system").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: clusterid.ConfigMap, Namespace: "kube-system"},
		Data:       map[string]string{clusterid.Key: antreaUUID},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().ConfigMaps("kube-system").Delete(context.Background(), clusterid.ConfigMap, metav1.DeleteOptions{})
	})
	run("Antrea", "", 42000, antreaUUID, u)
	// clusterID names the records; the domain is still the UUID's, as
	// the reference derives it.
	run("clusterID configured", "clusterID: custom-cluster-id\n", 43000, "custom-cluster-id", u)
}

// TestClusterIDGet exercises clusterid.Get against the real API server:
// a ConfigMap whose uuid is written after Get started (Antrea's controller
// creates the ConfigMap first) is waited for; credentials that may read
// neither the ConfigMap nor the Namespace get ErrForbidden at once.
func TestClusterIDGet(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 2*time.Minute)
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	// Other tests of the package use the same ConfigMap: a Namespace of
	// its own would not do (Get reads kube-system), so this test does not
	// run in parallel with them (none of the package's tests does).
	cms := cs.CoreV1().ConfigMaps("kube-system")
	if err := cms.Delete(ctx, clusterid.ConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: clusterid.ConfigMap, Namespace: "kube-system"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cms.Delete(context.Background(), clusterid.ConfigMap, metav1.DeleteOptions{}) })
	const want = "01234567-89ab-4cde-8f01-23456789abcd"
	type result struct {
		id  clusterid.Identity
		err error
	}
	// Get's client counts the answers to its reads of the ConfigMap, so
	// that the key is written only after Get has seen it missing: Get
	// must then ask again, not settle for the Namespace's UID nor fail.
	var reads atomic.Int32
	cfg := rest.CopyConfig(c.Admin)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err == nil && req.Method == http.MethodGet &&
				strings.HasSuffix(req.URL.Path, "/namespaces/kube-system/configmaps/"+clusterid.ConfigMap) {
				reads.Add(1)
			}
			return resp, err
		})
	})
	counted, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() {
		id, err := clusterid.Get(ctx, counted, clusterid.Options{Interval: 100 * time.Millisecond, Timeout: time.Minute})
		done <- result{id, err}
	}()
	if err := poll(ctx, "Get's first read of the ConfigMap", func() (bool, error) { return reads.Load() > 0, nil }); err != nil {
		t.Fatal(err)
	}
	cm, err := cms.Get(ctx, clusterid.ConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{clusterid.Key: want}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.id.String() != want || r.id.Source != clusterid.SourceAntrea {
		t.Fatalf("Get: %v (%s), %v; want %s from the ConfigMap", r.id, r.id.Source, r.err, want)
	}
	if n := reads.Load(); n < 2 {
		t.Errorf("Get read the ConfigMap %d time(s); it saw no key and must have asked again", n)
	}

	// Credentials without the grants.
	const ns = "no-identity"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agg"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rc, err := c.ServiceAccountConfig(ctx, ns, "agg")
	if err != nil {
		t.Fatal(err)
	}
	limited, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = clusterid.Get(ctx, limited, clusterid.Options{Timeout: time.Minute})
	if !errors.Is(err, clusterid.ErrForbidden) {
		t.Fatalf("Get without grants: %v, want ErrForbidden", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("Get without grants took %v: a refusal is not retried", d)
	}
	// With the grant of the Namespace only: its UID.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "sluice-ns-only"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, ResourceNames: []string{"kube-system"}, Verbs: []string{"get"}},
	}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sluice-ns-only"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "agg", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, "RBAC grant visible", func() (bool, error) {
		return canINamed(ctx, rc, "get", "namespaces", "", "kube-system")
	}); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	id, err := clusterid.Get(ctx, limited, clusterid.Options{Timeout: time.Minute, Log: slog.New(slog.NewTextHandler(logs, nil))})
	kns, err2 := cs.CoreV1().Namespaces().Get(ctx, "kube-system", metav1.GetOptions{})
	if err != nil || err2 != nil || id.String() != string(kns.UID) || id.Source != clusterid.SourceNamespace {
		t.Fatalf("Get with the Namespace only: %v (%s), %v, %v; want %s", id, id.Source, err, err2, kns.UID)
	}
	// The ConfigMap exists (Antrea's UUID is there): falling back for
	// want of a grant is worth a warning, not silence.
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "may not get configmap kube-system/antrea-cluster-identity") {
		t.Errorf("no warning that the ConfigMap may not be read; log:\n%s", l)
	}
}
