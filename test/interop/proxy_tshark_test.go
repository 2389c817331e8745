package interop_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// proxyInventory lists a client and a server Pod for each of the first n
// sample flows (ipfixtest.SampleFlow), with labels.
func proxyInventory(n int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: List\nitems:\n")
	uid := 0
	pod := func(name, ip, labels string) {
		uid++
		fmt.Fprintf(&b, `- apiVersion: v1
  kind: Pod
  metadata: {name: %s, namespace: default, uid: %08x-2222-4333-8444-555555555555, creationTimestamp: "2025-01-01T00:00:00Z", labels: {%s}}
  spec: {nodeName: node-1}
  status: {podIP: %s, podIPs: [{ip: %s}]}
`, name, uid, labels, ip, ip)
	}
	for i := range n {
		f := ipfixtest.SampleFlow(i)
		pod(f.SrcPod, f.Src.String(), fmt.Sprintf(`app: client, tier: web, idx: "%d"`, i))
		pod(f.DstPod, f.Dst.String(), "app: server")
	}
	return b.String()
}

// proxyUDPCollector receives the aggregator's IPFIX datagrams and keeps
// them, counting the data records in them.
type proxyUDPCollector struct {
	conn *net.UDPConn
	mu   sync.Mutex
	msgs [][]byte
	recs int
	errs []error
	done chan struct{}
}

func proxyStartUDPCollector(t *testing.T) *proxyUDPCollector {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	c := &proxyUDPCollector{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{TemplateTTL: ipfix.DefaultUDPTemplateTTL}))
		buf := make([]byte, 65536)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			msg := bytes.Clone(buf[:n])
			recs := 0
			if err := d.Reset(msg, time.Now()); err == nil {
				for d.Next() {
					recs++
				}
			}
			c.mu.Lock()
			if err := d.Err(); err != nil {
				c.errs = append(c.errs, err)
			}
			c.msgs = append(c.msgs, msg)
			c.recs += recs
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close(); <-c.done })
	return c
}

func (c *proxyUDPCollector) port() int { return c.conn.LocalAddr().(*net.UDPAddr).Port }

func (c *proxyUDPCollector) state() (msgs [][]byte, recs int, errs []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.msgs...), c.recs, append([]error(nil), c.errs...)
}

// proxyTsharkFields are the fields read from tshark for each flow record.
var proxyTsharkFields = []string{
	"cflow.srcaddr", "cflow.dstaddr", "cflow.srcport", "cflow.dstport", "cflow.protocol",
	"cflow.packets", "cflow.octets",
	"cflow.original_exporter_ipv4_address", "cflow.original_observation_domain_id", "cflow.direction",
}

// TestProxyToTshark: an Antrea-v2.7-shaped exporter (our encoder) sends
// over TCP to the aggregator in Proxy mode, which labels the Pods from an
// inventory file and forwards over UDP to a socket of the test. The
// datagrams are written to a capture and dissected by tshark, which must
// read the 5-tuples, counters, the original exporter and observation
// domain, and the Pod labels (Antrea elements 143 and 144), with no
// malformed packet or expert warning.
func TestProxyToTshark(t *testing.T) {
	tshark := requirePeer(t, "tshark")
	ctx := testContext(t, 60*time.Second)
	const (
		n      = 6
		domain = 9
	)
	dir := t.TempDir()
	inv := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte(proxyInventory(n)), 0o644); err != nil {
		t.Fatal(err)
	}
	coll := proxyStartUDPCollector(t)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
clusterID: tshark-cluster
recordContents: {podLabels: true}
flowCollector: {enable: true, address: "127.0.0.1:%d:udp", observationDomainID: 1234}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  inventory: %s
`, coll.port(), inv))

	conn, err := net.Dial("tcp", a.Addrs().IPFIX)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(domain, tmpl); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := ipfixtest.WriteAntreaV27(enc, domain, tmpl, ipfixtest.SampleFlow(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	proxyWait(t, 10*time.Second, fmt.Sprintf("%d records from the aggregator", n), func() bool { _, r, _ := coll.state(); return r >= n })
	time.Sleep(100 * time.Millisecond)
	msgs, recs, errs := coll.state()
	if len(errs) > 0 || recs != n {
		t.Fatalf("received %d records in %d datagrams (want %d records), decode errors %v", recs, len(msgs), n, errs)
	}

	const port = 4739
	pcap := filepath.Join(dir, "proxy.pcap")
	writeUDPPcap(t, pcap, port, msgs)
	env := []string{"TZ=UTC", "LC_ALL=C"}
	decodeAs := fmt.Sprintf("udp.port==%d,cflow", port)

	args := []string{"-r", pcap, "-d", decodeAs, "-T", "fields",
		"-E", "header=n", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=;"}
	for _, f := range proxyTsharkFields {
		args = append(args, "-e", f)
	}
	out, err := run(ctx, env, tshark, args...)
	if err != nil {
		t.Fatal(err)
	}
	// One row per record, from every frame.
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		cols := strings.Split(line, "\t")
		if len(cols) != len(proxyTsharkFields) {
			t.Fatalf("tshark line %q: %d columns, want %d", line, len(cols), len(proxyTsharkFields))
		}
		if cols[0] == "" {
			continue // a template-only frame
		}
		// cflow.packets and cflow.octets occur twice per record: the
		// forward delta, then the reverse one (RFC 5103, PEN 29305).
		vals := make([][]string, len(cols))
		for i, c := range cols {
			vals[i] = strings.Split(c, ";")
			if len(vals[i])%len(vals[0]) != 0 {
				t.Fatalf("tshark line %q: %d values of %s for %d records", line, len(vals[i]), proxyTsharkFields[i], len(vals[0]))
			}
		}
		for j := range vals[0] {
			row := make([]string, len(cols))
			for i := range cols {
				per := len(vals[i]) / len(vals[0])
				row[i] = strings.Join(vals[i][per*j:per*j+per], ";")
			}
			rows = append(rows, row)
		}
	}
	if len(rows) != n {
		t.Fatalf("tshark dissected %d flow records, want %d:\n%s", len(rows), n, out)
	}
	for i, row := range rows {
		f := ipfixtest.SampleFlow(i)
		want := []string{f.Src.String(), f.Dst.String(), fmt.Sprint(f.SrcPort), fmt.Sprint(f.DstPort), fmt.Sprint(f.Proto),
			// WriteAntreaV27 sends a tenth of the totals as the deltas.
			fmt.Sprintf("%d;%d", f.Packets/10, f.RevPackets/10), fmt.Sprintf("%d;%d", f.Octets/10, f.RevOctets/10),
			"127.0.0.1", fmt.Sprint(domain), "255"} // both Pods named: direction unknown
		for k := range want {
			if row[k] != want[k] {
				t.Errorf("record %d: %s = %q, want %q", i, proxyTsharkFields[k], row[k], want[k])
			}
		}
	}

	// The whole dissection: Antrea elements by ID, no malformed packet.
	out, err = run(ctx, env, tshark, "-r", pcap, "-d", decodeAs, "-T", "pdml")
	if err != nil {
		t.Fatal(err)
	}
	frames, err := parsePDML(out)
	if err != nil {
		t.Error(err)
	}
	var flows []pdmlFlow
	for _, fr := range frames {
		flows = append(flows, fr...)
	}
	if len(flows) != n {
		t.Fatalf("PDML has %d flow records, want %d", len(flows), n)
	}
	for i, fl := range flows {
		f := ipfixtest.SampleFlow(i)
		want := map[string]string{
			"sourcePodName": f.SrcPod, "sourcePodNamespace": f.Namespace, "sourceNodeName": f.SrcNode,
			"destinationPodName": f.DstPod, "destinationPodNamespace": f.Namespace,
			"sourcePodLabels":      fmt.Sprintf(`{"app":"client","idx":"%d","tier":"web"}`, i), // keys sorted
			"destinationPodLabels": `{"app":"server"}`,
			"clusterId":            "tshark-cluster",
		}
		for name, w := range want {
			ie := ipfix.DefaultRegistry().MustByName(name)
			if got := fl.antrea[int(ie.ID)]; got != w {
				t.Errorf("record %d: %s (Antrea element %d) is %q, want %q", i, name, ie.ID, got, w)
			}
		}
		if fl.src != f.Src.String() {
			t.Errorf("record %d: PDML source %s, want %s", i, fl.src, f.Src)
		}
	}
}
