package interop_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
)

// proxyNfacctdPrimitives are custom nfacctd primitives for elements the
// aggregator adds in Proxy mode, plus Antrea's flowType.
const proxyNfacctdPrimitives = `name=orig_domain field_type=405 len=4 semantics=u_int
name=orig_exporter field_type=403 len=4 semantics=ip
name=flow_dir field_type=61 len=1 semantics=u_int
name=cluster_id field_type=56506:158 len=vlen semantics=str
name=flow_type field_type=56506:137 len=1 semantics=u_int
`

// proxyNfacctdFlow is one object of nfacctd's print plugin JSON output.
type proxyNfacctdFlow struct {
	Event        string `json:"event_type"`
	Src          string `json:"ip_src"`
	Dst          string `json:"ip_dst"`
	SrcPort      uint16 `json:"port_src"`
	DstPort      uint16 `json:"port_dst"`
	Proto        string `json:"ip_proto"`
	Packets      uint64 `json:"packets"`
	Bytes        uint64 `json:"bytes"`
	OrigDomain   string `json:"orig_domain"`
	OrigExporter string `json:"orig_exporter"`
	FlowDir      string `json:"flow_dir"`
	ClusterID    string `json:"cluster_id"`
	FlowType     string `json:"flow_type"`
}

// proxyStartNfacctd starts nfacctd on a free UDP port of 127.0.0.1 with
// its print plugin writing JSON to dir/out.json, and waits for its socket.
func proxyStartNfacctd(t *testing.T, dir string) (p *process, port int, out string) {
	t.Helper()
	nfacctd := requirePeer(t, "nfacctd")
	ctx := testContext(t, 60*time.Second)
	prims := filepath.Join(dir, "primitives.lst")
	if err := os.WriteFile(prims, []byte(proxyNfacctdPrimitives), 0o644); err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(dir, "out.json")
	for attempt := 0; ; attempt++ {
		port = freeUDPPort(t)
		conf := filepath.Join(dir, "nfacctd.conf")
		err := os.WriteFile(conf, []byte(fmt.Sprintf(`daemonize: false
nfacctd_ip: 127.0.0.1
nfacctd_port: %d
plugins: print[out]
aggregate_primitives: %s
aggregate[out]: src_host, dst_host, src_port, dst_port, proto, orig_domain, orig_exporter, flow_dir, cluster_id, flow_type
print_output[out]: json
print_output_file[out]: %s
print_output_file_append[out]: true
print_refresh_time[out]: 1
nfacctd_time_new: true
logfile: %s
`, port, prims, out, filepath.Join(dir, "nfacctd.log"))), 0o644)
		if err != nil {
			t.Fatal(err)
		}
		p = startProcess(t, ctx, nil, nfacctd, "-f", conf)
		var pollErr error
		err = poll(ctx, "nfacctd to bind its port", func() bool {
			_, found, err := udpSocketState(port)
			pollErr = err
			return found || err != nil || p.exited()
		})
		switch {
		case err != nil:
			t.Fatal(err)
		case pollErr != nil:
			t.Fatal(pollErr)
		case !p.exited():
			t.Cleanup(func() {
				if t.Failed() {
					log, _ := os.ReadFile(filepath.Join(dir, "nfacctd.log"))
					t.Logf("nfacctd.log:\n%s", log)
				}
			})
			return p, port, out
		case attempt == 2:
			log, _ := os.ReadFile(filepath.Join(dir, "nfacctd.log"))
			t.Fatalf("nfacctd exited at startup: %v\n%s\n%s", p.err, p.out.String(), log)
		}
	}
}

// TestProxySoftflowdToNfacctd: softflowd exports the deterministic
// capture over UDP to the aggregator (Proxy mode, UDP), which forwards
// over UDP to pmacct's nfacctd. nfacctd must show each direction of each
// connection of the capture once, with its packet and octet counts, and
// the elements the aggregator added: the original exporter and
// observation domain, the cluster ID and the flow direction (unknown: a
// softflowd record names no Pod).
func TestProxySoftflowdToNfacctd(t *testing.T) {
	requirePeer(t, "softflowd")
	requirePeer(t, "softflowctl")
	requirePeer(t, "nfacctd")
	ctx := testContext(t, 60*time.Second)
	dir := t.TempDir()
	pcap := filepath.Join(dir, "flows.pcap")
	want := writeFlowPcap(t, pcap)

	nf, port, out := proxyStartNfacctd(t, dir)
	a := testagg.Start(t, fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: udp
clusterID: softflowd-cluster
flowCollector: {enable: true, address: "127.0.0.1:%d:udp", observationDomainID: 31}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
`, port))

	// softflowd sends through a relay that notes the observation domain
	// of its messages, so the originalObservationDomainId nfacctd shows
	// can be checked against what softflowd actually used.
	relay, domains := proxyUDPRelay(t, a.Addrs().UDP)
	runSoftflowd(t, ctx, pcap, relay, "udp")
	// softflowd has exited: everything it sent is in the aggregator's
	// socket. Wait for the sink to send it on (it flushes within 1 s).
	var received, exported float64
	err := poll(ctx, "the aggregator to forward softflowd's records", func() bool {
		m := proxyMetrics(t, a.Addrs().API)
		received = proxyMetricSum(m, "sluice_collector_records_received_total", `transport="udp"`)
		exported = proxyMetricSum(m, "sluice_sink_records_exported_total", `sink="flowCollector"`)
		return received >= float64(len(want)) && exported == received
	})
	if err != nil {
		t.Fatalf("%v: received %v, exported %v", err, received, exported)
	}
	m := proxyMetrics(t, a.Addrs().API)
	for _, name := range []string{"sluice_collector_decode_errors_total", "sluice_sink_records_dropped_total", "sluice_collector_records_dropped_total"} {
		if v := proxyMetricSum(m, name); v != 0 {
			t.Errorf("%s = %v", name, v)
		}
	}

	// nfacctd writes its cache every second: wait until its output holds
	// every flow of the capture, then stop it with SIGINT, which also
	// writes what it still holds. The wait is bounded: output that never
	// gets there is what the checks below describe.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	_ = poll(wctx, "nfacctd to write every flow", func() bool {
		data, err := os.ReadFile(out)
		if err != nil {
			return false
		}
		got, _, _ := proxyParseNfacctd(data)
		for k, w := range want {
			if g := got[k]; g == nil || g.Packets != w.Packets || g.Bytes != w.Octets {
				return false
			}
		}
		return true
	})
	cancel()
	if err := nf.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := nf.wait(ctx); err != nil {
		t.Logf("nfacctd: %v", err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("nfacctd wrote no output: %v", err)
	}

	got, zeroFlows, bad := proxyParseNfacctd(data)
	for _, b := range bad {
		t.Error(b)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("nfacctd output:\n%s", data)
		}
	})
	for k, w := range want {
		g := got[k]
		if g == nil {
			t.Errorf("nfacctd has no flow %v", k)
			continue
		}
		if g.Packets != w.Packets || g.Bytes != w.Octets {
			t.Errorf("flow %v: nfacctd counts %d packets, %d bytes; the capture has %d, %d", k, g.Packets, g.Bytes, w.Packets, w.Octets)
		}
		if g.OrigExporter != "127.0.0.1" {
			t.Errorf("flow %v: originalExporterIPv4Address %q, want 127.0.0.1", k, g.OrigExporter)
		}
		if g.ClusterID != "softflowd-cluster" {
			t.Errorf("flow %v: clusterId %q", k, g.ClusterID)
		}
		if g.FlowDir != "255" {
			t.Errorf("flow %v: flowDirection %q, want 255 (unknown: no Pod names)", k, g.FlowDir)
		}
		if g.FlowType != "0" {
			t.Errorf("flow %v: flowType %q, want 0 (unset)", k, g.FlowType)
		}
		if doms := domains(); len(doms) != 1 || g.OrigDomain != fmt.Sprint(doms[0]) {
			t.Errorf("flow %v: originalObservationDomainId %q; softflowd sent in domains %v", k, g.OrigDomain, doms)
		}
	}
	for k := range got {
		if want[k] == nil {
			t.Errorf("nfacctd has a flow %v the capture does not", k)
		}
	}

	// softflowd also sends an options record (meteringProcessId and
	// exporter statistics); it is not a flow and must not be forwarded.
	received = proxyMetricSum(proxyMetrics(t, a.Addrs().API), "sluice_collector_records_received_total", `transport="udp"`)
	if received != float64(len(want)) || zeroFlows > 0 {
		if received == float64(len(want)+1) && zeroFlows == 1 {
			t.Errorf("the aggregator counted %v flow records from softflowd "+
				"(it sent %d flows and 1 options record) and nfacctd shows one all-zero flow", received, len(want))
			return
		}
		t.Errorf("the aggregator took %v records from softflowd as flows, want %d; nfacctd shows %d all-zero flows", received, len(want), zeroFlows)
	}
}

// proxyUDPRelay forwards every datagram it receives to dst, from one
// socket, and notes the observation domains of the IPFIX headers.
func proxyUDPRelay(t *testing.T, dst string) (addr string, domains func() []uint32) {
	t.Helper()
	in, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	out, err := net.Dial("udp4", dst)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[uint32]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, err := in.Read(buf)
			if err != nil {
				return
			}
			if n >= ipfix.HeaderLen {
				if h, err := ipfix.ParseHeader(buf[:n]); err == nil {
					mu.Lock()
					seen[h.ObservationDomainID] = true
					mu.Unlock()
				}
			}
			_, _ = out.Write(buf[:n])
		}
	}()
	t.Cleanup(func() { in.Close(); <-done; out.Close() })
	return in.LocalAddr().String(), func() []uint32 {
		mu.Lock()
		defer mu.Unlock()
		var ds []uint32
		for d := range seen {
			ds = append(ds, d)
		}
		slices.Sort(ds)
		return ds
	}
}

// proxyParseNfacctd reads nfacctd's JSON lines: the flows by key, how
// many all-zero flows there are, and the lines that are not flows of the
// capture.
func proxyParseNfacctd(data []byte) (got map[flowKey]*proxyNfacctdFlow, zeroFlows int, bad []string) {
	// The print plugin purges its cache each time it writes it, so every
	// line holds what arrived since the last write: add lines up per flow.
	got = map[flowKey]*proxyNfacctdFlow{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var f proxyNfacctdFlow
		if err := json.Unmarshal([]byte(line), &f); err != nil {
			bad = append(bad, fmt.Sprintf("nfacctd line %q: %v", line, err))
			continue
		}
		if f.Src == "0.0.0.0" && f.Dst == "0.0.0.0" && f.Proto == "0" && f.Packets == 0 && f.Bytes == 0 {
			zeroFlows++ // softflowd's options record, forwarded as a flow
			continue
		}
		src, err1 := netip.ParseAddr(f.Src)
		dst, err2 := netip.ParseAddr(f.Dst)
		if err1 != nil || err2 != nil || f.Proto != "tcp" {
			bad = append(bad, "nfacctd flow that is not one of the capture's: "+line)
			continue
		}
		k := flowKey{Src: src, Dst: dst, SrcPort: f.SrcPort, DstPort: f.DstPort, Proto: 6}
		if g := got[k]; g != nil {
			g.Packets += f.Packets
			g.Bytes += f.Bytes
			continue
		}
		got[k] = &f
	}
	return got, zeroFlows, bad
}
