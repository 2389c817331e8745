package kube_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"sluice/certs"
	"sluice/certs/kubecerts"
	"sluice/internal/testkit/netns"
	"sluice/test/kube/kubetest"
)

// chartRelease is the chart installed as its own release in its own
// namespace (so that its ClusterRoles do not replace those of
// installDefaults' release), with what its exporter DaemonSet would run.
type chartRelease struct {
	ns, fullname string
	// args and env of the exporter container, as rendered.
	args []string
	env  []corev1.EnvVar
}

// installChart renders the chart as release in namespace ns with set and
// applies every object (the DaemonSet and Deployment stay objects: no
// controller runs here).
func installChart(t *testing.T, ctx context.Context, c *kubetest.Cluster, release, ns string, set ...string) *chartRelease {
	t.Helper()
	out, err := render(t, release, ns, append([]string{"createNamespace=true"}, set...)...)
	if err != nil {
		t.Fatal(err)
	}
	r := parseRendered(t, out)
	var ds appsv1.DaemonSet
	cr := &chartRelease{ns: ns, fullname: release + "-flow-aggregator"}
	r.get(t, "DaemonSet", cr.fullname+"-exporter", &ds)
	ctr := ds.Spec.Template.Spec.Containers[0]
	cr.args, cr.env = ctr.Args, ctr.Env
	applyYAML(t, ctx, c, out)
	return cr
}

// publishCerts publishes a generated CA and client certificate in the
// release's namespace as the aggregator does, from dir (generated there
// if empty), for the exporter's --tls-from-namespace.
func (cr *chartRelease) publishCerts(t *testing.T, ctx context.Context, c *kubetest.Cluster, dir string) {
	t.Helper()
	if _, err := certs.Ensure(dir, certs.Options{ServerNames: []string{cr.fullname + "." + cr.ns + ".svc"}}); err != nil {
		t.Fatal(err)
	}
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	if err := kubecerts.Publish(ctx, admin, cr.ns, dir, false, nil); err != nil {
		t.Fatal(err)
	}
}

// chartNode is a Node as the chart's DaemonSet Pod sees it: a network
// namespace of its own (the Pod has hostNetwork) where the API server is
// reachable on 127.0.0.1:6443, as through the kubernetes Service.
type chartNode struct {
	name, netns string
}

func requireNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "needs root: it creates network and mount namespaces")
	}
	for _, p := range []string{"ip", "nft", "sh"} {
		if _, err := exec.LookPath(p); err != nil {
			missing(t, fmt.Sprintf("%s is not installed (scripts/install-deps.sh installs it)", p))
		}
	}
}

func runCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// newChartNode makes the network namespace of Node name, deleted when the
// test ends, with conntrack tracking its connections.
func newChartNode(t *testing.T, c *kubetest.Cluster, name string) *chartNode {
	t.Helper()
	requireNetns(t)
	n := &chartNode{name: name, netns: fmt.Sprintf("slk%d-%s", os.Getpid(), name)}
	if out, err := exec.Command("ip", "netns", "add", n.netns).CombinedOutput(); err != nil {
		missing(t, fmt.Sprintf("network namespaces are not available here (ip netns add: %v: %s)", err, strings.TrimSpace(string(out))))
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.netns).Run() })
	runCmd(t, "ip", "-n", n.netns, "link", "set", "lo", "up")
	// A rule that uses conntrack makes the namespace track connections,
	// the locally made ones included.
	x := func(args ...string) { runCmd(t, append([]string{"ip", "netns", "exec", n.netns, "nft"}, args...)...) }
	x("add", "table", "inet", "sluice")
	x("add chain inet sluice track { type filter hook output priority 0; policy accept; }")
	x("add", "rule", "inet", "sluice", "track", "ct", "state", "new", "counter")
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	n.forward(t, "127.0.0.1:6443", u.Host)
	return n
}

// forward accepts connections on listen inside the Node's namespace and
// relays them to target outside it.
func (n *chartNode) forward(t *testing.T, listen, target string) {
	t.Helper()
	var ln net.Listener
	if err := netns.Do(n.netns, func() (err error) {
		ln, err = net.Listen("tcp", listen)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in); out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
}

// mountSA is run by sh inside the exporter's own mount namespace (ip
// netns exec makes one): it puts the ServiceAccount's token and CA where
// the kubelet mounts them, over a tmpfs that hides /run from this process
// only, and execs the exporter.
const mountSA = `set -e
mount -t tmpfs -o size=1m sluice-sa /run
d=/run/secrets/kubernetes.io/serviceaccount
mkdir -p $d
cp "$SA_DIR/token" "$SA_DIR/ca.crt" "$SA_DIR/namespace" $d/
exec "$@"`

// chartExporter is the exporter process of the chart's DaemonSet on a
// chartNode.
type chartExporter struct {
	cmd    *exec.Cmd
	logs   *lockedBuffer
	exited chan struct{}
	err    error // Wait's, once exited is closed
	http   *http.Client
}

// startChartExporter runs `sluice <the DaemonSet's args>` in the Node's
// namespace with the DaemonSet's environment (NODE_NAME from the downward
// API), the in-cluster environment of a Pod, and a token of the release's
// exporter ServiceAccount.
func (n *chartNode) startChartExporter(t *testing.T, ctx context.Context, c *kubetest.Cluster, cr *chartRelease) *chartExporter {
	t.Helper()
	sa, err := c.ServiceAccountConfig(ctx, cr.ns, cr.fullname+"-exporter")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"token": []byte(sa.BearerToken), "ca.crt": c.CA, "namespace": []byte(cr.ns)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "SA_DIR=" + dir,
		"KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443"}
	for _, e := range cr.env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env = append(env, e.Name+"="+n.name)
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		default:
			t.Fatalf("the DaemonSet sets %s from %+v, which this test does not know", e.Name, e.ValueFrom)
		}
	}
	args := append([]string{"netns", "exec", n.netns, "sh", "-c", mountSA, "sh", shared.sluice}, cr.args...)
	e := &chartExporter{cmd: exec.Command("ip", args...), logs: &lockedBuffer{}, exited: make(chan struct{}),
		http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: netns.Dialer(n.netns)}}}
	e.cmd.Env = env
	e.cmd.Stdout, e.cmd.Stderr = e.logs, e.logs
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { e.err = e.cmd.Wait(); close(e.exited) }()
	t.Cleanup(func() {
		e.stop(t)
		if t.Failed() {
			t.Logf("exporter %q log:\n%s", cr.args, e.logs.String())
		}
	})
	return e
}

// stop sends SIGTERM, as the kubelet does, and returns how it exited.
func (e *chartExporter) stop(t *testing.T) error {
	t.Helper()
	_ = e.cmd.Process.Signal(os.Interrupt)
	select {
	case <-e.exited:
	case <-time.After(30 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
		t.Error("the exporter did not stop within 30 s of SIGTERM")
	}
	return e.err
}

// probe GETs path on the exporter's metrics port (the DaemonSet's
// --metrics-address, inside the Node's namespace).
func (e *chartExporter) probe(ctx context.Context, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:10350"+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := e.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// waitProbe waits until path answers code with a body containing want.
func (e *chartExporter) waitProbe(ctx context.Context, path string, code int, want string) error {
	var got int
	var body string
	err := poll(ctx, fmt.Sprintf("%s answering %d %q", path, code, want), func() (bool, error) {
		select {
		case <-e.exited:
			return false, fmt.Errorf("the exporter exited: %v", e.err)
		default:
		}
		var err error
		got, body, err = e.probe(ctx, path)
		return err == nil && got == code && strings.Contains(body, want), err
	})
	if err != nil {
		return fmt.Errorf("%w; last answer %d %q", err, got, body)
	}
	return nil
}
