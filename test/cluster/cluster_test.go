package cluster_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"sluice/flow"
	"sluice/internal/testkit/stubcollector"
	"sluice/test/kube/kubetest"
)

// EnvRun turns the real-cluster tests on (they need root and change the
// machine's network while they run); `make cluster-test` sets it.
const EnvRun = "SLUICE_CLUSTER_TESTS"

const (
	// nodeIP is the Node's address on the cluster bridge
	// (scripts/local-cluster.sh); Pods reach the host there.
	nodeIP   = "10.244.0.1"
	nodeName = "node-1"
	release  = "flow-aggregator"
	relNS    = "flow-aggregator"
	appNS    = "demo"
	// The workload: a client makes requests of this many bytes each.
	requests  = 40
	bodyBytes = 2000
)

// kc is a running local cluster and the tools that talk to it.
type kc struct {
	t          *testing.T
	repo, dir  string
	kubeconfig string
	kubectlBin string
	helmBin    string
	cs         *kubernetes.Clientset
}

// up starts scripts/local-cluster.sh's cluster for the test and stops it
// when the test ends.
func up(t *testing.T) *kc {
	t.Helper()
	if os.Getenv(EnvRun) != "1" {
		t.Skipf("the real-cluster tests run with %s=1 (make cluster-test, part of make test)", EnvRun)
	}
	if os.Geteuid() != 0 {
		t.Fatal("the real-cluster tests need root (a bridge, containerd, kubelet)")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// Short: containerd's socket lives under it.
	dir, err := os.MkdirTemp("", "sluice-cl-")
	if err != nil {
		t.Fatal(err)
	}
	c := &kc{t: t, repo: repo, dir: dir, kubeconfig: filepath.Join(dir, "admin.kubeconfig"),
		kubectlBin: filepath.Join(kubetest.BinDir(), "kubectl"), helmBin: kubetest.HelmPath()}
	script := filepath.Join(repo, "scripts", "local-cluster.sh")
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpState()
		}
		cmd := exec.Command(script, "down")
		cmd.Env = append(os.Environ(), "SLUICE_CLUSTER_DIR="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("local-cluster.sh down: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	start := time.Now()
	cmd := exec.Command(script, "up")
	cmd.Env = append(os.Environ(), "SLUICE_CLUSTER_DIR="+dir)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("local-cluster.sh up: %v\n%s", err, out)
	}
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// run runs a command with the cluster's kubeconfig and returns its
// standard output; it fails the test when the command fails.
func (c *kc) run(name string, args ...string) string {
	c.t.Helper()
	out, err := c.try(name, args...)
	if err != nil {
		c.t.Fatalf("%s %s: %v", filepath.Base(name), strings.Join(args, " "), err)
	}
	return out
}

func (c *kc) try(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig, "HELM_CACHE_HOME="+filepath.Join(c.dir, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.dir, "helm-config"), "HELM_DATA_HOME="+filepath.Join(c.dir, "helm-data"))
	cmd.Dir = c.repo
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w\n%s%s", err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// with is c for a subtest: failures end the subtest, not its parent.
func (c *kc) with(t *testing.T) *kc {
	cc := *c
	cc.t = t
	return &cc
}

func (c *kc) kubectl(args ...string) string { c.t.Helper(); return c.run(c.kubectlBin, args...) }
func (c *kc) helm(args ...string) string    { c.t.Helper(); return c.run(c.helmBin, args...) }

// dumpState logs what a failed run needs to be understood.
func (c *kc) dumpState() {
	out, _ := c.try(c.kubectlBin, "get", "pods", "-A", "-o", "wide")
	c.t.Logf("pods:\n%s", out)
	out, _ = c.try(c.kubectlBin, "get", "events", "-A", "--sort-by=.lastTimestamp")
	c.t.Logf("events:\n%s", tail(out, 60))
	for _, sel := range []string{"app.kubernetes.io/component=aggregator", "app.kubernetes.io/component=exporter"} {
		out, _ = c.try(c.kubectlBin, "-n", relNS, "logs", "-l", sel, "--tail=60", "--all-containers", "--prefix")
		c.t.Logf("logs of %s:\n%s", sel, out)
	}
	for _, f := range []string{"kubelet", "containerd", "kube-apiserver"} {
		b, _ := os.ReadFile(filepath.Join(c.dir, "logs", f+".log"))
		c.t.Logf("%s log (end):\n%s", f, tail(string(b), 30))
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every half second until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		if state != "" {
			last = state
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last: %s)", d, what, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// pods lists the Pods of a namespace that a label selector picks.
func (c *kc) pods(ns, sel string) []corev1.Pod {
	c.t.Helper()
	l, err := c.cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		c.t.Fatal(err)
	}
	return l.Items
}

func ready(p corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitReady waits until n Pods of sel are Ready, and no other Pod of sel
// is left.
func (c *kc) waitReady(ns, sel string, n int, d time.Duration) []corev1.Pod {
	c.t.Helper()
	var got []corev1.Pod
	waitFor(c.t, d, fmt.Sprintf("%d Ready Pods of %s/%s", n, ns, sel), func() (bool, string) {
		got = c.pods(ns, sel)
		r := 0
		for _, p := range got {
			if ready(p) {
				r++
			}
		}
		return r == n && len(got) == n, fmt.Sprintf("%d of %d Ready", r, len(got))
	})
	return got
}

// hostProcess finds the host's pid of a container's main process, by
// its command line.
func hostProcess(t *testing.T, want ...string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < len(want) {
			continue
		}
		match := true
		for i, w := range want {
			if args[i] != w {
				match = false
				break
			}
		}
		if match {
			return pid
		}
	}
	t.Fatalf("no process %q", want)
	return 0
}

// procStatus reads fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// serviceURL is http://CLUSTER-IP:PORT of a Service port, reached from the
// host through kube-proxy.
func (c *kc) serviceURL(ns, name, port string) string {
	c.t.Helper()
	svc, err := c.cs.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, p := range svc.Spec.Ports {
		if p.Name == port {
			return fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, p.Port)
		}
	}
	c.t.Fatalf("Service %s/%s has no port %q", ns, name, port)
	return ""
}

func httpGet(url string) ([]byte, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	return b, nil
}

// metric reads one sample (the sum over label sets that match the
// prefix) from a Prometheus text page.
func metric(page []byte, name string) (float64, bool) {
	sum, found := 0.0, false
	for _, line := range strings.Split(string(page), "\n") {
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		if rest != "" && rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

// podNetns finds the network namespace (under /var/run/netns) of the Pod
// with this IP.
func podNetns(t *testing.T, ip string) string {
	t.Helper()
	ents, _ := filepath.Glob("/var/run/netns/cni-*")
	for _, ns := range ents {
		out, err := exec.Command("ip", "-n", filepath.Base(ns), "-4", "-o", "addr").Output()
		if err == nil && strings.Contains(string(out), " "+ip+"/") {
			return filepath.Base(ns)
		}
	}
	t.Fatalf("no network namespace holds %s", ip)
	return ""
}

// The workload's manifests: a server Deployment of two replicas behind a
// ClusterIP Service, a NetworkPolicy that lets only app=client in, and
// client Pods.
const workload = `
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: server, namespace: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: server}}
  template:
    metadata: {labels: {app: server, tier: backend}}
    spec:
      containers:
      - name: server
        image: example.invalid/testkit:1
        imagePullPolicy: Never
        args: [serve, --listen, ":8080"]
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: demo}
spec:
  selector: {app: server}
  ports: [{name: http, port: 80, targetPort: http, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-ingress, namespace: demo}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: TCP, port: 8080}]
`

// clientPod is a client making n requests of size bytes each, with more
// of testkit client's flags.
func clientPod(name, app string, n, size int, timeout string, extra ...string) string {
	w := ""
	for _, e := range extra {
		w += ", " + e
	}
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: demo, labels: {app: %s}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: example.invalid/testkit:1
    imagePullPolicy: Never
    args: [client, --requests, "%d", --size, "%d", --timeout, %s%s]
`, name, app, n, size, timeout, w)
}

// enforcePolicy makes each server Pod drop TCP to 8080 from any address
// but the Node's (the kubelet's probes) and the allowed ones; later calls
// allow more addresses.
func (c *kc) enforcePolicy(allowed ...string) {
	c.t.Helper()
	for _, p := range c.pods(appNS, "app=server") {
		ns := podNetns(c.t, p.Status.PodIP)
		var cmds []string
		if exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "sluicetest").Run() != nil {
			cmds = append(cmds, "add table inet sluicetest",
				"add set inet sluicetest allowed { type ipv4_addr; }",
				"add chain inet sluicetest in { type filter hook input priority 0; policy accept; }",
				"add rule inet sluicetest in tcp dport 8080 ip saddr != @allowed drop",
				"add element inet sluicetest allowed { "+nodeIP+" }")
		}
		for _, ip := range allowed {
			cmds = append(cmds, "add element inet sluicetest allowed { "+ip+" }")
		}
		for _, cmd := range cmds {
			if out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, strings.Fields(cmd)...)...).CombinedOutput(); err != nil {
				c.t.Fatalf("nft %s in %s: %v\n%s", cmd, ns, err, out)
			}
		}
	}
}

func (c *kc) apply(manifest string) {
	c.t.Helper()
	f := filepath.Join(c.dir, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(manifest), 0o600); err != nil {
		c.t.Fatal(err)
	}
	c.kubectl("apply", "-f", f)
}

// clientDone waits for a client Pod's summary line.
func (c *kc) clientDone(name string) (ok, failed, body int) {
	c.t.Helper()
	re := regexp.MustCompile(`DONE requests=(\d+) ok=(\d+) failed=(\d+) bodyBytes=(\d+)`)
	waitFor(c.t, 3*time.Minute, "client "+name+" to finish", func() (bool, string) {
		out, err := c.try(c.kubectlBin, "-n", appNS, "logs", name)
		if err != nil {
			return false, err.Error()
		}
		m := re.FindStringSubmatch(out)
		if m == nil {
			return false, tail(out, 3)
		}
		ok, _ = strconv.Atoi(m[2])
		failed, _ = strconv.Atoi(m[3])
		body, _ = strconv.Atoi(m[4])
		return true, ""
	})
	return ok, failed, body
}

func (c *kc) podIP(ns, name string) string {
	c.t.Helper()
	var ip string
	waitFor(c.t, 2*time.Minute, "an IP for Pod "+ns+"/"+name, func() (bool, string) {
		p, err := c.cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ip = p.Status.PodIP
		return ip != "", string(p.Status.Phase)
	})
	return ip
}

// conns groups the IPFIX records of one client's connections by source
// port: the largest counters seen (Aggregate mode exports totals).
type conn struct {
	fwdOctets, revOctets uint64
	rec                  stubcollector.Record
	// viaProxy: a record came through Proxy mode (no Aggregate-mode
	// elements).
	viaProxy bool
}

func connsFrom(recs []stubcollector.Record, srcIP string) map[uint16]*conn {
	m := map[uint16]*conn{}
	for _, r := range recs {
		f := &r.Flow
		if f.SourceIP.String() != srcIP || f.DestinationPort != 8080 {
			continue
		}
		c := m[f.SourcePort]
		if c == nil {
			c = &conn{}
			m[f.SourcePort] = c
		}
		c.fwdOctets = max(c.fwdOctets, f.Stats.OctetTotalCount)
		c.revOctets = max(c.revOctets, f.ReverseStats.OctetTotalCount)
		c.rec = r
		c.viaProxy = c.viaProxy || f.Aggregation == nil
	}
	return m
}

func TestHelmInstall(t *testing.T) {
	c := up(t)
	ctx := context.Background()

	// The IPFIX collector and ClickHouse run on the host, on the Node's
	// bridge address, which the aggregator's Pod reaches.
	ipfix := stubcollector.NewAt(t, nodeIP+":0")
	ch := startClickHouse(t)

	// What a user does: the ClickHouse credentials in the Secret the chart
	// reads (as Antrea's chart), then the README's install command with
	// the values that turn the sinks on.
	c.kubectl("create", "namespace", relNS)
	c.kubectl("-n", relNS, "create", "secret", "generic", "clickhouse-secret",
		"--from-literal=username="+chUser, "--from-literal=password="+chPassword)
	install := time.Now()
	c.helm("install", release, "deploy/helm/sluice", "-n", relNS, "--create-namespace", "--wait", "--timeout", "5m",
		"--set", "exporter.attribution.enable=true",
		"--set", "recordContents.podLabels=true",
		"--set", "activeFlowRecordTimeout=5s", "--set", "inactiveFlowRecordTimeout=60s",
		"--set", "flowCollector.enable=true", "--set", "flowCollector.address="+ipfix.Addr()+":tcp",
		"--set", "flowLogger.enable=true",
		"--set", "clickHouse.enable=true", "--set", "clickHouse.databaseURL=tcp://"+ch.Addr, "--set", "clickHouse.commitInterval=1s",
		"--set", "sluice.ui.enable=true")
	t.Logf("helm install --wait returned after %s", time.Since(install).Round(time.Second))

	t.Run("ready", func(t *testing.T) {
		c := c.with(t)
		agg := c.waitReady(relNS, "app.kubernetes.io/component=aggregator", 1, 3*time.Minute)
		exp := c.waitReady(relNS, "app.kubernetes.io/component=exporter", 1, 3*time.Minute)
		for _, p := range append(agg, exp...) {
			for _, s := range p.Status.ContainerStatuses {
				if s.RestartCount != 0 {
					t.Errorf("%s/%s restarted %d times", p.Name, s.Name, s.RestartCount)
				}
			}
		}
		// The processes as the kernel sees them: the aggregator as the
		// image's non-root user; the exporter as root with CAP_NET_ADMIN
		// (bit 12) and no other capability, as docs/install.md says.
		aggPid := hostProcess(t, "/usr/local/bin/sluice", "aggregator")
		if st := procStatus(t, aggPid); !strings.HasPrefix(st["Uid"], "65532\t") || st["CapEff"] != "0000000000000000" {
			t.Errorf("aggregator runs as Uid %q with CapEff %s, want 65532 and none", st["Uid"], st["CapEff"])
		}
		expPid := hostProcess(t, "/usr/local/bin/sluice", "exporter")
		if st := procStatus(t, expPid); st["CapEff"] != "0000000000001000" || st["CapBnd"] != "0000000000001000" || st["NoNewPrivs"] != "1" {
			t.Errorf("exporter capabilities: effective %s, bounding %s, NoNewPrivs %s; want only CAP_NET_ADMIN (0000000000001000) and no new privileges",
				st["CapEff"], st["CapBnd"], st["NoNewPrivs"])
		}
		// The exporter reads the Node's conntrack: its network namespace
		// is the host's.
		self, _ := os.Readlink("/proc/self/ns/net")
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", expPid)); ns != self {
			t.Errorf("exporter's network namespace %s, the Node's %s", ns, self)
		}
	})

	// The workload, after Sluice is running, so that every connection is
	// seen from its start.
	c.apply(workload)
	c.waitReady(appNS, "app=server", 2, 3*time.Minute)
	servers := c.pods(appNS, "app=server")
	c.apply(clientPod("client", "client", requests, bodyBytes, "5s"))
	clientIP := c.podIP(appNS, "client")
	// The bridge CNI enforces no NetworkPolicy: each server Pod drops, at
	// its own interface, what the policy denies (TCP to 8080 from other
	// than app=client), as an enforcing CNI would at the destination.
	c.enforcePolicy(clientIP)
	c.apply(clientPod("denied", "denied", 3, bodyBytes, "2s"))
	deniedIP := c.podIP(appNS, "denied")

	okN, failedN, body := c.clientDone("client")
	if okN != requests || failedN != 0 || body != requests*bodyBytes {
		t.Fatalf("client: %d ok, %d failed, %d body bytes; want %d, 0, %d", okN, failedN, body, requests, requests*bodyBytes)
	}
	if okN, _, _ := c.clientDone("denied"); okN != 0 {
		t.Fatalf("the denied client got %d answers through the drop rules", okN)
	}
	serverNames := map[string]bool{}
	for _, p := range servers {
		serverNames[p.Name] = true
	}

	t.Run("ipfix", func(t *testing.T) {
		// Every connection, with its final counters: the response's bytes
		// plus HTTP and TCP/IP headers back, the request forward. The
		// tolerance: headers of at most 1,000 octets a direction.
		var cs map[uint16]*conn
		waitFor(t, 3*time.Minute, fmt.Sprintf("records of the client's %d connections with their final counters", requests), func() (bool, string) {
			cs = connsFrom(ipfix.Records(), clientIP)
			done := 0
			for _, cn := range cs {
				if cn.revOctets >= bodyBytes && cn.rec.Flow.SourcePodName != "" {
					done++
				}
			}
			return done == requests, fmt.Sprintf("%d connections seen, %d complete", len(cs), done)
		})
		var fwd, rev uint64
		for port, cn := range cs {
			f := &cn.rec.Flow
			fwd += cn.fwdOctets
			rev += cn.revOctets
			if cn.revOctets > bodyBytes+1000 || cn.fwdOctets < 100 || cn.fwdOctets > 1000 {
				t.Errorf("connection from port %d: %d octets forward, %d back; want 100–1,000 and %d–%d",
					port, cn.fwdOctets, cn.revOctets, bodyBytes, bodyBytes+1000)
			}
			checkNames(t, f, serverNames)
		}
		t.Logf("%d connections: %d octets forward, %d back (bodies %d)", len(cs), fwd, rev, requests*bodyBytes)

		// The denied client's connections: the policy named, Drop.
		waitFor(t, 2*time.Minute, "a record of the denied client naming the policy", func() (bool, string) {
			for _, r := range ipfix.Records() {
				f := &r.Flow
				if f.SourceIP.String() == deniedIP && f.DestinationPort == 8080 {
					if f.Ingress.Name == "server-ingress" && f.Ingress.RuleAction == 2 && f.SourcePodName == "denied" {
						return true, ""
					}
					return false, fmt.Sprintf("%+v", f.Ingress)
				}
			}
			return false, "no record"
		})
	})

	t.Run("flowrecords", func(t *testing.T) {
		c := c.with(t)
		// sluice get flowrecords, through the aggregator's Service.
		api := c.serviceURL(relNS, release, "api")
		var recs []map[string]any
		waitFor(t, time.Minute, "flow records of the client through the Service", func() (bool, string) {
			out, err := c.try(filepath.Join(c.repo, "bin", "sluice-linux-static"), "get", "flowrecords", "--server", api, "--srcip", clientIP, "-o", "json")
			if err != nil {
				return false, err.Error()
			}
			recs = nil
			if err := json.Unmarshal([]byte(out), &recs); err != nil {
				return false, err.Error()
			}
			return len(recs) > 0, ""
		})
		for _, r := range recs {
			for k, want := range map[string]string{"sourcePodName": "client", "sourcePodNamespace": appNS,
				"destinationPodNamespace": appNS, "destinationServicePortName": "demo/server:http",
				"sourceNodeName": nodeName, "destinationNodeName": nodeName, "ingressNetworkPolicyName": "server-ingress",
				"ingressNetworkPolicyNamespace": appNS} {
				if got := fmt.Sprint(r[k]); got != want {
					t.Errorf("flow record %v: %s %q, want %q", r["sourceTransportPort"], k, got, want)
				}
			}
			if !serverNames[fmt.Sprint(r["destinationPodName"])] {
				t.Errorf("flow record names destination Pod %v, not a server Pod", r["destinationPodName"])
			}
			if !strings.Contains(fmt.Sprint(r["sourcePodLabels"]), `"app":"client"`) ||
				!strings.Contains(fmt.Sprint(r["destinationPodLabels"]), `"tier":"backend"`) {
				t.Errorf("labels: %v / %v", r["sourcePodLabels"], r["destinationPodLabels"])
			}
		}
		t.Logf("%d flow records of the client through %s", len(recs), api)
	})

	t.Run("flowlog", func(t *testing.T) {
		c := c.with(t)
		agg := c.pods(relNS, "app.kubernetes.io/component=aggregator")[0]
		path := filepath.Join(c.dir, "kubelet", "root", "pods", string(agg.UID), "volumes", "kubernetes.io~empty-dir", "tmp", "antrea-flows.log")
		waitFor(t, time.Minute, "the client's connections in the flow log", func() (bool, string) {
			b, err := os.ReadFile(path)
			if err != nil {
				return false, err.Error()
			}
			n := 0
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, clientIP) && strings.Contains(line, ",client,") && strings.Contains(line, "server-ingress") {
					n++
				}
			}
			return n >= requests, fmt.Sprintf("%d lines", n)
		})
	})

	t.Run("clickhouse", func(t *testing.T) {
		waitFor(t, time.Minute, "the client's rows in ClickHouse", func() (bool, string) {
			n, err := ch.count(ctx, fmt.Sprintf("sourcePodName = 'client' AND destinationServicePortName = 'demo/server:http' AND sourceIP = '%s'", clientIP))
			if err != nil {
				return false, err.Error()
			}
			return n >= requests, fmt.Sprintf("%d rows", n)
		})
	})

	t.Run("nothing-lost", func(t *testing.T) {
		c := c.with(t)
		// What the exporter sent equals what the aggregator received, at a
		// moment when neither moves (the exporter sends every 5 s).
		exp := "http://127.0.0.1:10350/metrics"
		agg := c.serviceURL(relNS, release, "api") + "/metrics"
		waitFor(t, time.Minute, "the exporter's and the aggregator's counts to agree", func() (bool, string) {
			e1, err1 := httpGet(exp)
			a, err2 := httpGet(agg)
			e2, err3 := httpGet(exp)
			if err1 != nil || err2 != nil || err3 != nil {
				return false, fmt.Sprint(err1, err2, err3)
			}
			s1, _ := metric(e1, "sluice_exporter_records_exported_total")
			s2, _ := metric(e2, "sluice_exporter_records_exported_total")
			r, _ := metric(a, "sluice_collector_records_received_total")
			return s1 == s2 && s1 == r && s1 > 0, fmt.Sprintf("exporter %v→%v, aggregator %v", s1, s2, r)
		})
		e, _ := httpGet(exp)
		a, _ := httpGet(agg)
		for _, m := range []struct {
			page []byte
			name string
		}{{e, "sluice_exporter_records_dropped_total"}, {a, "sluice_collector_records_dropped_total"}} {
			if v, _ := metric(m.page, m.name); v != 0 {
				t.Errorf("%s = %v", m.name, v)
			}
		}
		// Over mutual TLS (gRPC, the chart's default), with the client
		// certificate the exporter fetched through the API.
		if v, ok := metric(e, "sluice_exporter_connected"); !ok || v != 1 {
			t.Errorf("sluice_exporter_connected = %v", v)
		}
		// The Node counts bytes in conntrack (the script set
		// nf_conntrack_acct), and the exporter says so.
		if v, ok := metric(e, "sluice_exporter_conntrack_accounting"); !ok || v != 1 {
			t.Errorf("sluice_exporter_conntrack_accounting = %v", v)
		}
	})

	t.Run("traceflow", func(t *testing.T) {
		c := c.with(t)
		c.apply(`
apiVersion: sluice.io/v1alpha1
kind: Traceflow
metadata: {name: client-to-server}
spec:
  source: {namespace: demo, pod: client}
  destination: {namespace: demo, service: server}
  packet: {transportHeader: {tcp: {dstPort: 80}}}
`)
		var out string
		waitFor(t, time.Minute, "the Traceflow to succeed", func() (bool, string) {
			out, _ = c.try(c.kubectlBin, "get", "traceflows.sluice.io", "client-to-server", "-o", "json")
			return strings.Contains(out, `"phase": "Succeeded"`), tail(out, 5)
		})
		var tf struct {
			Status struct {
				Results []struct {
					Node         string
					Observations []map[string]any
				}
			}
		}
		if err := json.Unmarshal([]byte(out), &tf); err != nil {
			t.Fatal(err)
		}
		var seen []string
		lb, policy, delivered := false, false, false
		for _, r := range tf.Status.Results {
			for _, o := range r.Observations {
				seen = append(seen, fmt.Sprint(o["component"], "/", o["action"]))
				switch o["component"] {
				case "LB":
					lb = serverNames[fmt.Sprint(o["pod"])] || strings.HasPrefix(fmt.Sprint(o["pod"]), "demo/server-")
				case "NetworkPolicy":
					policy = policy || strings.Contains(fmt.Sprint(o["networkPolicy"]), "server-ingress")
				case "Forwarding":
					delivered = delivered || o["action"] == "Delivered"
				}
			}
		}
		if !lb || !policy || !delivered {
			t.Errorf("observations %v: load-balanced to a server Pod %v, the policy named %v, delivered %v\n%s", seen, lb, policy, delivered, out)
		}
	})

	t.Run("ui", func(t *testing.T) { checkUI(t, c.with(t)) })

	t.Run("logs", func(t *testing.T) {
		c := c.with(t)
		// No error in `kubectl logs` of either component, after all of the
		// above.
		for _, sel := range []string{"app.kubernetes.io/component=aggregator", "app.kubernetes.io/component=exporter"} {
			out := c.kubectl("-n", relNS, "logs", "-l", sel, "--tail=-1", "--prefix")
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "level=ERROR") || strings.Contains(line, `"level":"ERROR"`) {
					t.Errorf("error logged: %s", line)
				}
			}
			if n := strings.Count(out, "\n"); n > 200 {
				t.Errorf("%s logged %d lines in a few minutes:\n%s", sel, n, tail(out, 20))
			}
		}
	})

	t.Run("upgrade-to-proxy", func(t *testing.T) { upgradeToProxy(t, c.with(t), ipfix) })

	t.Run("uninstall", func(t *testing.T) { uninstall(t, c.with(t)) })
}

// checkNames checks a record of the client's: both Pods, labels, the
// Service, the Node, the rule and its action.
func checkNames(t *testing.T, f *flow.Flow, servers map[string]bool) {
	t.Helper()
	bad := func(what string, got, want any) {
		t.Errorf("record %d→%s:%d: %s %v, want %v", f.SourcePort, f.DestinationIP, f.DestinationPort, what, got, want)
	}
	if f.SourcePodNamespace != appNS || f.SourcePodName != "client" {
		bad("source Pod", f.SourcePodNamespace+"/"+f.SourcePodName, "demo/client")
	}
	if f.DestinationPodNamespace != appNS || !servers[f.DestinationPodName] {
		bad("destination Pod", f.DestinationPodNamespace+"/"+f.DestinationPodName, "a server Pod")
	}
	if !strings.Contains(f.SourcePodLabels, `"app":"client"`) || !strings.Contains(f.DestinationPodLabels, `"tier":"backend"`) {
		bad("labels", f.SourcePodLabels+" "+f.DestinationPodLabels, `app=client, tier=backend`)
	}
	if f.DestinationServicePortName != "demo/server:http" || f.DestinationServicePort != 80 {
		bad("Service", fmt.Sprintf("%s port %d", f.DestinationServicePortName, f.DestinationServicePort), "demo/server:http port 80")
	}
	if f.SourceNodeName != nodeName || f.DestinationNodeName != nodeName {
		bad("Nodes", f.SourceNodeName+" "+f.DestinationNodeName, nodeName)
	}
	if f.Ingress.Namespace != appNS || f.Ingress.Name != "server-ingress" || f.Ingress.RuleAction != flow.ActionAllow {
		bad("ingress rule", fmt.Sprintf("%s/%s action %d", f.Ingress.Namespace, f.Ingress.Name, f.Ingress.RuleAction), "demo/server-ingress Allow")
	}
}
