package kube_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
	"sluice/test/kube/kubetest"
)

// installDefaults applies deploy/sluice.yaml (idempotent: server-side
// apply) so that the chart's ServiceAccounts and RBAC exist.
func installDefaults(t *testing.T, ctx context.Context, c *kubetest.Cluster) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, ctx, c, b)
}

// applyYAML server-side applies every object of a multi-document YAML
// (a rendered chart) and fails the test on any refusal.
func applyYAML(t *testing.T, ctx context.Context, c *kubetest.Cluster, b []byte) {
	t.Helper()
	objs, err := kubetest.Objects(b)
	if err != nil {
		t.Fatal(err)
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

// lockedBuffer collects a child's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// jsonCollector receives the aggregator's records as JSON lines over TCP
// (or TLS).
type jsonCollector struct {
	ln   net.Listener
	mu   sync.Mutex
	recs []map[string]any
	// byPeer counts the records of TLS connections by the client
	// certificate (DER) they presented; conns are the connections open.
	byPeer map[string]int
	conns  map[net.Conn]bool
}

func startJSONCollector(t *testing.T) *jsonCollector {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveJSON(t, ln)
}

// serveJSON collects the JSON lines of the connections ln accepts.
func serveJSON(t *testing.T, ln net.Listener) *jsonCollector {
	t.Helper()
	jc := &jsonCollector{ln: ln, conns: map[net.Conn]bool{}, byPeer: map[string]int{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				peer := ""
				if tc, ok := conn.(*tls.Conn); ok {
					if tc.Handshake() != nil {
						return
					}
					if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
						peer = string(pc[0].Raw)
					}
				}
				jc.mu.Lock()
				jc.conns[conn] = true
				jc.mu.Unlock()
				defer func() {
					jc.mu.Lock()
					delete(jc.conns, conn)
					jc.mu.Unlock()
				}()
				sc := bufio.NewScanner(conn)
				sc.Buffer(make([]byte, 1<<20), 1<<20)
				for sc.Scan() {
					var m map[string]any
					if json.Unmarshal(sc.Bytes(), &m) == nil {
						jc.mu.Lock()
						jc.recs = append(jc.recs, m)
						if peer != "" {
							jc.byPeer[peer]++
						}
						jc.mu.Unlock()
					}
				}
			}()
		}
	}()
	return jc
}

// find returns the records whose source port is port: their "ipfix"
// objects, which hold the information elements by name.
func (jc *jsonCollector) find(port uint16) []map[string]any {
	jc.mu.Lock()
	defer jc.mu.Unlock()
	var out []map[string]any
	for _, rec := range jc.recs {
		r, _ := rec["ipfix"].(map[string]any)
		if p, ok := r["sourceTransportPort"].(float64); ok && uint16(p) == port {
			out = append(out, r)
		}
	}
	return out
}

// aggregatorProc is `sluice aggregator` running as a child process.
type aggregatorProc struct {
	cmd    *exec.Cmd
	logs   *lockedBuffer
	exited chan struct{}
	ipfix  string
	api    string
	grpc   string
}

// startAggregator runs the sluice binary as an aggregator in Proxy mode
// with the Kubernetes credentials of kubeconfig, taking IPFIX over TCP and
// sending JSON records to jc.
func startAggregator(t *testing.T, kubeconfig string, jc *jsonCollector) *aggregatorProc {
	t.Helper()
	return startAggregatorWith(t, aggregatorOptions{kubeconfig: kubeconfig}, jc)
}

// aggregatorOptions are what tests vary in startAggregatorWith.
// waitPublished waits until the aggregator has published its
// certificates in the cluster; it fails the test if the aggregator exits.
func (a *aggregatorProc) waitPublished(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := poll(ctx, "certificates published", func() (bool, error) {
		select {
		case <-a.exited:
			return false, fmt.Errorf("aggregator exited:\n%s", a.logs.String())
		default:
		}
		return strings.Contains(a.logs.String(), "TLS certificates published"), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// waitStartupFailure waits until the aggregator stops with a non-zero
// status, checks that its output says each of wants, and returns the
// output.
func (a *aggregatorProc) waitStartupFailure(t *testing.T, ctx context.Context, wants ...string) string {
	t.Helper()
	select {
	case <-a.exited:
	case <-ctx.Done():
		t.Fatalf("the aggregator did not stop:\n%s", a.logs.String())
	}
	if a.cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("the aggregator exited with 0:\n%s", a.logs.String())
	}
	logs := a.logs.String()
	for _, want := range wants {
		if !strings.Contains(logs, want) {
			t.Errorf("error output lacks %q:\n%s", want, logs)
		}
	}
	return logs
}

type aggregatorOptions struct {
	kubeconfig string
	grpc       bool     // run the gRPC collector (mutual TLS)
	env        []string // added to the process's environment
	// sluiceExtra is appended to the sluice section of the configuration
	// (keys indented by two spaces).
	sluiceExtra string
	// collectorExtra is appended to the flowCollector section likewise.
	collectorExtra string
	// topExtra is prepended to the configuration (top-level keys).
	topExtra string
	// ipfixCollector, when set, is where IPFIX (not JSON) records go
	// instead of the JSON collector.
	ipfixCollector string
}

func startAggregatorWith(t *testing.T, o aggregatorOptions, jc *jsonCollector) *aggregatorProc {
	t.Helper()
	kubeconfig := o.kubeconfig
	dir := t.TempDir()
	ipfixPort, apiPort, grpcPort := freePort(t), freePort(t), freePort(t)
	grpcAddr := `""`
	if o.grpc {
		grpcAddr = fmt.Sprintf("127.0.0.1:%d", grpcPort)
	}
	collector, format := "", "JSON"
	if o.ipfixCollector != "" {
		collector, format = o.ipfixCollector, "IPFIX"
	} else {
		collector = jc.ln.Addr().String()
	}
	conf := fmt.Sprintf(`%smode: Proxy
aggregatorTransportProtocol: tcp
recordContents:
  podLabels: true
flowStreamService:
  enable: false
flowCollector:
  enable: true
  address: %s:tcp
  recordFormat: %s
%s
sluice:
  ipfixAddress: 127.0.0.1:%d
  grpcAddress: %s
  apiAddress: 127.0.0.1:%d
  kubeconfig: "%s"
  tls:
    certDir: %s
%s`, o.topExtra, collector, format, o.collectorExtra, ipfixPort, grpcAddr, apiPort, kubeconfig, filepath.Join(dir, "certs"), o.sluiceExtra)
	path := filepath.Join(dir, "flow-aggregator.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &aggregatorProc{logs: &lockedBuffer{}, exited: make(chan struct{}), ipfix: fmt.Sprintf("127.0.0.1:%d", ipfixPort),
		api: fmt.Sprintf("127.0.0.1:%d", apiPort), grpc: fmt.Sprintf("127.0.0.1:%d", grpcPort)}
	p.cmd = exec.Command(shared.sluice, "aggregator", "--config", path, "--log-level", "debug")
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	p.cmd.Env = append(os.Environ(), o.env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("aggregator log:\n%s", p.logs.String())
		}
	})
	return p
}

// sender sends IPFIX records to the aggregator over TCP.
type sender struct {
	conn net.Conn
	enc  *ipfix.Encoder
	tmpl *ipfix.Template
}

func dialSender(t *testing.T, ctx context.Context, addr string) *sender {
	t.Helper()
	var conn net.Conn
	if err := poll(ctx, "IPFIX collector listening", func() (bool, error) {
		var err error
		conn, err = net.Dial("tcp", addr)
		return err == nil, err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(1, tmpl); err != nil {
		t.Fatal(err)
	}
	return &sender{conn: conn, enc: enc, tmpl: tmpl}
}

// send exports one flow from src that started at start, identified by its
// source port, with no Pod names: the aggregator fills them in.
func (s *sender) send(t *testing.T, src netip.Addr, port uint16, start time.Time) {
	t.Helper()
	f := ipfixtest.Flow{Start: start, End: start.Add(time.Second), Src: src, Dst: netip.MustParseAddr("10.96.0.10"),
		SrcPort: port, DstPort: 53, Proto: 17, Packets: 1, Octets: 100}
	if err := ipfixtest.WriteAntreaV27(s.enc, 1, s.tmpl, f); err != nil {
		t.Fatal(err)
	}
	if err := s.enc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// sourcePod waits for the record of port and returns its source Pod's
// name and labels as the aggregator filled them in.
func sourcePod(t *testing.T, ctx context.Context, jc *jsonCollector, port uint16) (name, labels string) {
	t.Helper()
	var rec map[string]any
	if err := poll(ctx, fmt.Sprintf("record of port %d", port), func() (bool, error) {
		if r := jc.find(port); len(r) > 0 {
			rec = r[0]
			return true, nil
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	name, _ = rec["sourcePodName"].(string)
	labels, _ = rec["sourcePodLabels"].(string)
	return name, labels
}

func setPodIP(t *testing.T, ctx context.Context, cs kubernetes.Interface, p *corev1.Pod, ip string) *corev1.Pod {
	t.Helper()
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIP = ip
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	out, err := cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func newPod(ns, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "default",
			Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}
}

// TestAggregatorFollowsPods runs the aggregator as a process with a token
// of the chart's ServiceAccount and follows Pods created, relabelled and
// deleted through the API into its records: a record's source Pod and
// labels change within seconds of the change, and an IP reused by a new
// Pod resolves by the flow's start time.
func TestAggregatorFollowsPods(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	installDefaults(t, ctx, c)
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "apps"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
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
	jc := startJSONCollector(t)
	agg := startAggregator(t, kubeconfig, jc)
	if err := poll(ctx, "informers synced", func() (bool, error) {
		select {
		case <-agg.exited:
			return false, fmt.Errorf("aggregator exited:\n%s", agg.logs.String())
		default:
		}
		return strings.Contains(agg.logs.String(), "kubernetes: caches synced"), nil
	}); err != nil {
		t.Fatal(err)
	}
	s := dialSender(t, ctx, agg.ipfix)
	ip := netip.MustParseAddr("10.244.1.7")
	within := func(what string, port uint16, start time.Time, wantName, wantLabels string) {
		t.Helper()
		// Each attempt is a new flow (a new port): a record is enriched
		// once, when it arrives, so later attempts see later states.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.send(t, ip, port, start)
			name, labels := sourcePod(t, ctx, jc, port)
			if name == wantName && strings.Contains(labels, wantLabels) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: record has source Pod %q labels %q, want %q with %q", what, name, labels, wantName, wantLabels)
			}
			port++
		}
	}

	// Created.
	p, err := cs.CoreV1().Pods(ns).Create(ctx, newPod(ns, "web-1", map[string]string{"app": "web"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p = setPodIP(t, ctx, cs, p, ip.String())
	t0 := time.Now()
	within("created", 1000, time.Now(), "web-1", `"app":"web"`)
	t.Logf("a created Pod showed in records %v after its IP was set", time.Since(t0).Round(time.Millisecond))

	// Relabelled.
	p.Labels = map[string]string{"app": "web", "tier": "front"}
	if _, err := cs.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	within("relabelled", 2000, time.Now(), "web-1", `"tier":"front"`)
	t.Logf("new labels showed in records %v after the update", time.Since(t0).Round(time.Millisecond))
	aliveAt := time.Now()
	// A flow starting in a second resolves to the live Pod: so the empty
	// answer below is the deletion's doing.
	within("alive, flow starting later", 2500, time.Now().Add(time.Second), "web-1", `"tier":"front"`)

	// Deleted: a flow that starts afterwards has no Pod.
	if err := cs.CoreV1().Pods(ns).Delete(ctx, "web-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	within("deleted", 3000, time.Now().Add(time.Second), "", "")
	t.Logf("the deletion showed in records %v after it", time.Since(t0).Round(time.Millisecond))

	// The IP reused by a new Pod: resolution by the flow's start time.
	// flowStartSeconds and creationTimestamp have whole seconds, so the
	// new Pod is created in a later second than aliveAt (a wait for the
	// clock, not for an event), and its flows start a second after its
	// creation.
	time.Sleep(time.Until(aliveAt.Truncate(time.Second).Add(time.Second)))
	p2, err := cs.CoreV1().Pods(ns).Create(ctx, newPod(ns, "web-2", map[string]string{"app": "api"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setPodIP(t, ctx, cs, p2, ip.String())
	created := p2.CreationTimestamp.Time
	within("reused IP, flow of the new Pod", 4000, created.Add(time.Second), "web-2", `"app":"api"`)
	within("reused IP, flow of the old Pod", 5000, aliveAt, "web-1", `"tier":"front"`)
}

// TestAggregatorMissingPermission binds a ClusterRole without "watch" on
// Pods to a ServiceAccount and starts the aggregator with its token: it
// must stop at start-up with an error naming the missing permission.
func TestAggregatorMissingPermission(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 2*time.Minute)
	cs, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "limited"
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agg"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "sluice-no-pod-watch"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"nodes", "services"}, Verbs: []string{"get", "list", "watch"}},
	}}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sluice-no-pod-watch"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "agg", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa, err := c.ServiceAccountConfig(ctx, ns, "agg")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}
	// RBAC changes reach the authorizer through its informers: wait until
	// the grant that is there is seen, so that the missing one is the
	// only thing reported.
	if err := poll(ctx, "RBAC grant visible", func() (bool, error) {
		return canI(ctx, sa, "list", "pods")
	}); err != nil {
		t.Fatal(err)
	}
	jc := startJSONCollector(t)
	agg := startAggregator(t, kubeconfig, jc)
	logs := agg.waitStartupFailure(t, ctx, `system:serviceaccount:limited:agg may not "watch" on "pods"`, "sluice.kubeconfig")
	if strings.Contains(logs, `"list" on "pods"`) || strings.Contains(logs, `on "nodes"`) {
		t.Errorf("granted permissions reported missing:\n%s", logs)
	}
}
