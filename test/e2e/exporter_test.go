package e2e

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/netns"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
)

// The two-Node cluster: a Pod behind a veth on each Node namespace, the
// Nodes joined by a veth "wire" and routing each other's Pod CIDR.
const (
	clientIP   = "10.10.1.2"
	serverIP   = "10.10.2.2"
	serverPort = 8080
	// deniedPort is a port the inventory's NetworkPolicy denies, and an
	// nftables rule on node-2 drops, as the CNI would.
	deniedPort = 9090
)

const inventory = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: node-1, uid: 00000000-0000-4000-8000-000000000001}
  spec: {podCIDR: 10.10.1.0/24, podCIDRs: [10.10.1.0/24]}
  status: {addresses: [{type: InternalIP, address: 192.168.77.1}]}
- apiVersion: v1
  kind: Node
  metadata: {name: node-2, uid: 00000000-0000-4000-8000-000000000002}
  spec: {podCIDR: 10.10.2.0/24, podCIDRs: [10.10.2.0/24]}
  status: {addresses: [{type: InternalIP, address: 192.168.77.2}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: client, namespace: shop, uid: 00000000-0000-4000-8000-000000000011, creationTimestamp: "2025-01-01T00:00:00Z"}
  spec: {nodeName: node-1}
  status: {podIP: 10.10.1.2, podIPs: [{ip: 10.10.1.2}]}
- apiVersion: v1
  kind: Pod
  metadata: {name: server, namespace: shop, uid: 00000000-0000-4000-8000-000000000012, creationTimestamp: "2025-01-01T00:00:00Z", labels: {app: server}}
  spec: {nodeName: node-2}
  status: {podIP: 10.10.2.2, podIPs: [{ip: 10.10.2.2}]}
# The server takes connections on its service port only: the policy model
# allows 8080 (named on node-2's records) and denies the rest.
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: server-ingress, namespace: shop}
  spec:
    podSelector: {matchLabels: {app: server}}
    policyTypes: [Ingress]
    ingress:
    - ports: [{protocol: TCP, port: 8080}]
`

// need returns the path of a program the test needs, or skips (fails
// with SLUICE_REQUIRE_PEERS=1, as in CI) when it is missing.
func need(t *testing.T, prog string) string {
	t.Helper()
	p, err := exec.LookPath(prog)
	if err != nil {
		if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
			t.Fatalf("%s is not installed (scripts/install-deps.sh installs it)", prog)
		}
		t.Skipf("%s is not installed; run scripts/install-deps.sh", prog)
	}
	return p
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

type cluster struct {
	n1, n2, p1, p2 string
}

// newCluster builds the namespaces; t.Cleanup deletes them whatever
// happens.
func newCluster(t *testing.T, tag string) *cluster {
	t.Helper()
	ip := need(t, "ip")
	nft := need(t, "nft")
	sweepStale(ip)
	pfx := fmt.Sprintf("slx%d-%s", os.Getpid(), tag)
	c := &cluster{n1: pfx + "-n1", n2: pfx + "-n2", p1: pfx + "-p1", p2: pfx + "-p2"}
	for _, ns := range []string{c.n1, c.n2, c.p1, c.p2} {
		if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
			if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
				t.Fatalf("ip netns add: %v: %s", err, out)
			}
			t.Skipf("network namespaces are not available here (ip netns add: %v: %s)", err, bytes.TrimSpace(out))
		}
		t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	}
	x := func(ns string, args ...string) { run(t, append([]string{ip, "netns", "exec", ns}, args...)...) }
	run(t, ip, "link", "add", "eth0", "netns", c.p1, "type", "veth", "peer", "name", "pod0", "netns", c.n1)
	run(t, ip, "link", "add", "eth0", "netns", c.p2, "type", "veth", "peer", "name", "pod0", "netns", c.n2)
	run(t, ip, "link", "add", "node0", "netns", c.n1, "type", "veth", "peer", "name", "node0", "netns", c.n2)
	for _, l := range []struct{ ns, dev, addr string }{
		{c.p1, "eth0", clientIP + "/24"}, {c.n1, "pod0", "10.10.1.1/24"},
		{c.p2, "eth0", serverIP + "/24"}, {c.n2, "pod0", "10.10.2.1/24"},
		{c.n1, "node0", "192.168.77.1/24"}, {c.n2, "node0", "192.168.77.2/24"},
	} {
		x(l.ns, ip, "addr", "add", l.addr, "dev", l.dev)
		x(l.ns, ip, "link", "set", l.dev, "up")
	}
	for _, ns := range []string{c.n1, c.n2, c.p1, c.p2} {
		x(ns, ip, "link", "set", "lo", "up")
	}
	x(c.p1, ip, "route", "add", "default", "via", "10.10.1.1")
	x(c.p2, ip, "route", "add", "default", "via", "10.10.2.1")
	x(c.n1, ip, "route", "add", "10.10.2.0/24", "via", "192.168.77.2")
	x(c.n2, ip, "route", "add", "10.10.1.0/24", "via", "192.168.77.1")
	for _, ns := range []string{c.n1, c.n2} {
		// A rule that uses conntrack makes the namespace track
		// connections at all; accounting gives the counters.
		x(ns, nft, "add", "table", "inet", "sluice")
		x(ns, nft, "add chain inet sluice track { type filter hook forward priority 0; policy accept; }")
		x(ns, nft, "add", "rule", "inet", "sluice", "track", "ct", "state", "new", "counter")
		x(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.netfilter.nf_conntrack_acct=1", "net.netfilter.nf_conntrack_timestamp=1")
	}
	return c
}

var ownNetns = regexp.MustCompile(`^slx(\d+)-`)

// sweepStale deletes the namespaces of earlier runs that died before their
// cleanup ran (a test binary killed at its timeout).
func sweepStale(ip string) {
	out, _ := exec.Command(ip, "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		m := ownNetns.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		if pid, _ := strconv.Atoi(m[1]); pid != os.Getpid() {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
				_ = exec.Command(ip, "netns", "del", name).Run()
			}
		}
	}
}

// inNetns runs fn on a thread inside the named namespace.
var inNetns = netns.Do

// buildSluice builds the command once per test binary.
var buildOnce struct {
	sync.Once
	path string
	err  error
	out  []byte
}

func sluiceBinary(t *testing.T) string {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-e2e-")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.path = filepath.Join(dir, "sluice")
		cmd := exec.Command("go", "build", "-o", buildOnce.path, "sluice/cmd/sluice")
		buildOnce.out, buildOnce.err = cmd.CombinedOutput()
	})
	if buildOnce.err != nil {
		t.Fatalf("go build: %v\n%s", buildOnce.err, buildOnce.out)
	}
	return buildOnce.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildOnce.path != "" {
		os.RemoveAll(filepath.Dir(buildOnce.path))
	}
	os.Exit(code)
}

func startExporter(t *testing.T, bin string, args ...string) *testkit.LogBuffer {
	t.Helper()
	var logs testkit.LogBuffer
	cmd := exec.Command(bin, append([]string{"exporter"}, args...)...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("exporter %v:\n%s", args, logs.String())
		}
	})
	return &logs
}

// conn is one test connection and what the kernel counted for it.
type conn struct {
	port                  uint16
	sent, received        int
	witness, witnessReply [2]uint64 // packets, octets from `conntrack -L`
}

func transfer(t *testing.T, c *cluster, n int) []*conn {
	t.Helper()
	var ln net.Listener
	if err := inNetns(c.p2, func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf("%s:%d", serverIP, serverPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer s.Close()
				// The request says how much to send back.
				r := bufio.NewReader(s)
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				want, _ := strconv.Atoi(strings.TrimSpace(line))
				_, _ = io.Copy(io.Discard, r)
				_, _ = s.Write(bytes.Repeat([]byte("r"), want))
			}()
		}
	}()
	out := make([]*conn, n)
	errs := make(chan error, n)
	for i := range n {
		req, resp := 1000+3777*i, 20000+15013*i
		var d net.Conn
		if err := inNetns(c.p1, func() (err error) {
			d, err = net.DialTimeout("tcp", fmt.Sprintf("%s:%d", serverIP, serverPort), 5*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		out[i] = &conn{port: uint16(d.LocalAddr().(*net.TCPAddr).Port), sent: req, received: resp}
		go func() {
			defer d.Close()
			head := fmt.Sprintf("%d\n", resp)
			body := bytes.Repeat([]byte("q"), req-len(head))
			if _, err := d.Write(append([]byte(head), body...)); err != nil {
				errs <- err
				return
			}
			d.(*net.TCPConn).CloseWrite()
			got, err := io.Copy(io.Discard, d)
			if err == nil && int(got) != resp {
				err = fmt.Errorf("read %d of %d", got, resp)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return out
}

var ctCounters = regexp.MustCompile(`packets=(\d+) bytes=(\d+)`)

// witness reads the kernel's counters for each connection with the
// conntrack tool, independently of Sluice's netlink code.
func witness(t *testing.T, ns string, conns []*conn) {
	ct := need(t, "conntrack")
	for _, c := range conns {
		out := run(t, "ip", "netns", "exec", ns, ct, "-L", "-p", "tcp", "--sport", strconv.Itoa(int(c.port)), "-o", "extended")
		m := ctCounters.FindAllStringSubmatch(out, -1)
		if len(m) != 2 {
			t.Fatalf("conntrack -L for port %d in %s: no counters in %q (is accounting on?)", c.port, ns, out)
		}
		for i, dst := range []*[2]uint64{&c.witness, &c.witnessReply} {
			dst[0], _ = strconv.ParseUint(m[i][1], 10, 64)
			dst[1], _ = strconv.ParseUint(m[i][2], 10, 64)
		}
	}
}

// TestTwoNodeCluster: real connections between Pods on two Nodes, one
// exporter per Node reading that Node's conntrack, the aggregator in
// Aggregate mode: one correlated record per connection, with both Pods and
// the octet counts the kernel counted. Over gRPC (the default transport),
// then over IPFIX, and again over IPFIX with Node 1's exporter on an older
// element set than the aggregator expects.
func TestTwoNodeCluster(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
			t.Fatal("this test needs root (network namespaces, conntrack)")
		}
		t.Skip("needs root: it creates network namespaces and reads conntrack")
	}
	need(t, "ip")
	need(t, "nft")
	need(t, "conntrack")
	bin := sluiceBinary(t)
	for i, v := range []struct{ transport, profile string }{
		{"grpc", ""}, // the default transport: every field, no element set
		{"ipfix", "v2.7"},
		{"ipfix", "v1.13"},
	} {
		name := v.transport
		if v.profile != "" {
			name += " node-1 " + v.profile
		}
		t.Run(name, func(t *testing.T) { twoNodes(t, bin, strconv.Itoa(i), v.transport, v.profile) })
	}
}

// twoNodes runs the exporters with transport, ipfix (over TCP; node-1 with
// the element set of profile1) or grpc (mutual TLS, the aggregator's IPFIX
// collector off).
func twoNodes(t *testing.T, bin, tag, transport, profile1 string) {
	c := newCluster(t, tag)
	dir := t.TempDir()
	inv := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte(inventory), 0o644); err != nil {
		t.Fatal(err)
	}
	out := stubcollector.New(t)
	ipfixTransport := "tcp"
	if transport == "grpc" {
		ipfixTransport = "none"
	}
	certDir := t.TempDir()
	agg := testagg.Start(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: %s
flowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", grpcAddress: "127.0.0.1:0", tls: {certDir: %q}}
`, ipfixTransport, out.Addr(), certDir))
	common := []string{"--source", "conntrack", "--inventory", inv, "--poll-interval", "1s",
		"--metrics-address", "127.0.0.1:0", "--log-level", "debug"}
	var node1 []string
	if transport == "grpc" {
		// The aggregator's generated directory, as docs/tls.md has it
		// copied to exporters.
		common = append(common, "--collector", agg.Addrs().GRPC+":grpc", "--tls-cert-dir", certDir, "--tls-server-name", "localhost")
	} else {
		common = append(common, "--collector", agg.Addrs().IPFIX+":tcp")
		node1 = []string{"--ie-profile", profile1}
	}
	startExporter(t, bin, append(append([]string{"--netns", c.n1, "--node", "node-1", "--pod-cidr", "10.10.1.0/24"}, node1...), common...)...)
	startExporter(t, bin, append([]string{"--netns", c.n2, "--node", "node-2", "--pod-cidr", "10.10.2.0/24"}, common...)...)

	const n = 6
	conns := transfer(t, c, n)
	time.Sleep(500 * time.Millisecond) // let the last ACKs pass before reading the witness
	witness(t, c.n1, conns)
	n2 := make([]*conn, len(conns))
	for i, cn := range conns {
		cp := *cn
		n2[i] = &cp
	}
	witness(t, c.n2, n2)

	byPort := map[uint16]*conn{}
	for i, cn := range conns {
		byPort[cn.port] = cn
		if cn.witness != n2[i].witness || cn.witnessReply != n2[i].witnessReply {
			t.Errorf("port %d: the Nodes' kernels disagree: %v/%v vs %v/%v", cn.port, cn.witness, cn.witnessReply, n2[i].witness, n2[i].witnessReply)
		}
		// Octets are layer-3: payload plus headers, so at least the payload.
		if cn.witness[1] < uint64(cn.sent) || cn.witnessReply[1] < uint64(cn.received) {
			t.Errorf("port %d: kernel counted %d/%d octets for %d/%d of payload", cn.port, cn.witness[1], cn.witnessReply[1], cn.sent, cn.received)
		}
	}
	ours := func() []stubcollector.Record {
		var recs []stubcollector.Record
		for _, r := range out.Records() {
			if r.Flow.DestinationPort == serverPort && byPort[r.Flow.SourcePort] != nil {
				recs = append(recs, r)
			}
		}
		return recs
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && len(ours()) < n {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // anything more would be a duplicate
	recs := ours()
	if len(recs) != n {
		for _, r := range recs {
			t.Logf("record: %+v", r.Flow)
		}
		t.Fatalf("%d aggregated records for %d connections", len(recs), n)
	}
	seen := map[uint16]bool{}
	for _, r := range recs {
		f := r.Flow
		// The per-Node counters, 64-bit elements of PEN 56506.
		raw := func(name string) uint64 {
			if b := r.ByName[name]; len(b) == 8 {
				return binary.BigEndian.Uint64(b)
			}
			return 0
		}
		cn := byPort[f.SourcePort]
		seen[f.SourcePort] = true
		if f.SourceIP.String() != clientIP || f.DestinationIP.String() != serverIP || f.Protocol != 6 {
			t.Errorf("port %d: tuple %v → %v proto %d", cn.port, f.SourceIP, f.DestinationIP, f.Protocol)
		}
		if f.SourcePodName != "client" || f.SourcePodNamespace != "shop" || f.DestinationPodName != "server" ||
			f.DestinationPodNamespace != "shop" || f.SourceNodeName != "node-1" || f.DestinationNodeName != "node-2" {
			t.Errorf("port %d: not correlated: %s/%s on %q → %s/%s on %q", cn.port, f.SourcePodNamespace, f.SourcePodName,
				f.SourceNodeName, f.DestinationPodNamespace, f.DestinationPodName, f.DestinationNodeName)
		}
		if f.FlowType != flow.FlowTypeInterNode || f.EndReason != 3 || f.TCPState != "TIME_WAIT" {
			t.Errorf("port %d: flowType %d, end reason %d, tcpState %q; want inter-Node, END_OF_FLOW, TIME_WAIT", cn.port, f.FlowType, f.EndReason, f.TCPState)
		}
		if f.Stats.OctetTotalCount != cn.witness[1] || f.Stats.PacketTotalCount != cn.witness[0] ||
			f.ReverseStats.OctetTotalCount != cn.witnessReply[1] || f.ReverseStats.PacketTotalCount != cn.witnessReply[0] {
			t.Errorf("port %d: counts %d pkts/%d octets, reverse %d/%d; the kernel counted %v, reverse %v", cn.port,
				f.Stats.PacketTotalCount, f.Stats.OctetTotalCount, f.ReverseStats.PacketTotalCount, f.ReverseStats.OctetTotalCount,
				cn.witness, cn.witnessReply)
		}
		if raw("octetTotalCountFromSourceNode") != cn.witness[1] || raw("octetTotalCountFromDestinationNode") != cn.witness[1] ||
			raw("reverseOctetTotalCountFromSourceNode") != cn.witnessReply[1] || raw("reverseOctetTotalCountFromDestinationNode") != cn.witnessReply[1] {
			t.Errorf("port %d: per-Node octets %v; the kernel counted %d, reverse %d", cn.port, r.ByName, cn.witness[1], cn.witnessReply[1])
		}
		// node-2's side of the attribution: the rule that allowed it.
		if f.Ingress.Name != "server-ingress" || f.Ingress.Namespace != "shop" || f.Ingress.Type != 1 || f.Ingress.RuleAction != flow.ActionAllow ||
			f.Egress.RuleAction != flow.ActionNone {
			t.Errorf("port %d: ingress policy %+v, egress %+v; want shop/server-ingress (K8s) Allow, no egress rule", cn.port, f.Ingress, f.Egress)
		}
		if f.Stats.OctetDeltaCount != cn.witness[1] {
			t.Errorf("port %d: delta %d octets, want all %d (one record per connection)", cn.port, f.Stats.OctetDeltaCount, cn.witness[1])
		}
	}
	if len(seen) != n {
		t.Errorf("%d distinct connections in %d records", len(seen), len(recs))
	}
}

// TestTwoNodeDenied: a connection that node-2 drops (an nftables rule, as
// the CNI enforcing the inventory's NetworkPolicy would) stays unanswered
// in node-1's conntrack; node-1's exporter finds the same denial in the
// policy model and exports it as a denied connection; the aggregator's
// output names the policy with the action Drop.
func TestTwoNodeDenied(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
			t.Fatal("this test needs root (network namespaces, conntrack)")
		}
		t.Skip("needs root: it creates network namespaces and reads conntrack")
	}
	nft := need(t, "nft")
	bin := sluiceBinary(t)
	c := newCluster(t, "d")
	run(t, "ip", "netns", "exec", c.n2, nft, "add", "rule", "inet", "sluice", "track",
		"ip", "daddr", serverIP, "tcp", "dport", strconv.Itoa(deniedPort), "drop")
	inv := filepath.Join(t.TempDir(), "inventory.yaml")
	if err := os.WriteFile(inv, []byte(inventory), 0o644); err != nil {
		t.Fatal(err)
	}
	out := stubcollector.New(t)
	// An ingress Drop still waits for the other Node's record (the
	// reference's correlation rule); short timeouts make the one-sided
	// export come soon.
	agg := testagg.Start(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: tcp
activeFlowRecordTimeout: 1s
inactiveFlowRecordTimeout: 10s
flowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", grpcAddress: "127.0.0.1:0", tls: {certDir: %q}}
`, out.Addr(), t.TempDir()))
	common := []string{"--source", "conntrack", "--inventory", inv, "--poll-interval", "1s", "--active-timeout", "1s",
		"--metrics-address", "127.0.0.1:0", "--log-level", "debug", "--collector", agg.Addrs().IPFIX + ":tcp"}
	startExporter(t, bin, append([]string{"--netns", c.n1, "--node", "node-1", "--pod-cidr", "10.10.1.0/24"}, common...)...)
	startExporter(t, bin, append([]string{"--netns", c.n2, "--node", "node-2", "--pod-cidr", "10.10.2.0/24"}, common...)...)

	const localPort = 45001
	err := inNetns(c.p1, func() error {
		d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP), Port: localPort}}
		cn, err := d.Dial("tcp", net.JoinHostPort(serverIP, strconv.Itoa(deniedPort)))
		if err == nil {
			cn.Close()
			return fmt.Errorf("connected to %s:%d through the drop rule", serverIP, deniedPort)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var rec *stubcollector.Record
	testkit.WaitFor(t, "the denied connection's record", func() bool {
		for _, r := range out.Records() {
			if r.Flow.SourcePort == localPort && r.Flow.DestinationPort == deniedPort {
				rec = &r
				return true
			}
		}
		return false
	})
	f := &rec.Flow
	// The same from the wire's octets, by Antrea's element IDs, without
	// the record model: ingressNetworkPolicyName (56506/110) and
	// ingressNetworkPolicyRuleAction (56506/139, 2 = Drop).
	if name, action := rec.Raw["56506:110"], rec.Raw["56506:139"]; string(name) != "server-ingress" || !bytes.Equal(action, []byte{2}) {
		t.Errorf("on the wire: ingressNetworkPolicyName %q, ingressNetworkPolicyRuleAction %v; want server-ingress, [2]", name, action)
	}
	if f.Ingress.Name != "server-ingress" || f.Ingress.Namespace != "shop" || f.Ingress.Type != 1 || f.Ingress.RuleAction != flow.ActionDrop {
		t.Errorf("ingress policy %+v; want shop/server-ingress (K8s NetworkPolicy) Drop", f.Ingress)
	}
	if f.FlowType != flow.FlowTypeInterNode || f.SourcePodName != "client" || f.SourceNodeName != "node-1" {
		t.Errorf("flow type %d, source %s on %q; want inter-Node from client on node-1", f.FlowType, f.SourcePodName, f.SourceNodeName)
	}
	if f.Stats.PacketTotalCount == 0 || f.ReverseStats.PacketTotalCount != 0 {
		t.Errorf("counters %d packets, %d reverse; want the SYNs seen and no reply", f.Stats.PacketTotalCount, f.ReverseStats.PacketTotalCount)
	}
}
