package interop

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"sluice/aggregator"
	"sluice/config"
	"sluice/ipfix"
)

// proxyInventory is the minimal inventory the aggregator needs to run
// without a Kubernetes API server.
const proxyInventory = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: client-0, namespace: default, uid: 11111111-2222-4333-8444-555555555555, creationTimestamp: "2025-01-01T00:00:00Z", labels: {app: client}}
  spec: {nodeName: node-1}
  status: {podIP: 10.244.1.2, podIPs: [{ip: 10.244.1.2}]}
`

// startSluiceProxy runs a Sluice aggregator in Proxy mode in process,
// receiving IPFIX over TCP and forwarding to collectorAddr over TCP, and
// returns its IPFIX address. extra is appended to the top-level YAML.
func startSluiceProxy(tb testing.TB, collectorAddr, extra string) string {
	tb.Helper()
	dir := tb.TempDir()
	inv := filepath.Join(dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte(proxyInventory), 0o644); err != nil {
		tb.Fatal(err)
	}
	yaml := fmt.Sprintf(`
mode: Proxy
aggregatorTransportProtocol: tcp
clusterID: test-cluster
flowCollector: {enable: true, address: "%s:tcp", observationDomainID: 77}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  inventory: %s
%s`, collectorAddr, inv, extra)
	cfg, err := config.Parse([]byte(yaml), "proxy.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	// The gRPC collector always runs: give it a free port and its own
	// certificates.
	cfg.Sluice.GRPCAddress = "127.0.0.1:0"
	if cfg.Sluice.TLS.CertDir == "" && cfg.Sluice.TLS.CertFile == "" {
		cfg.Sluice.TLS.CertDir = tb.TempDir()
	}
	a, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	return a.Addrs().IPFIX
}

// rawCollector is an external IPFIX collector over TCP that decodes with
// Sluice and keeps every data record as raw values by "pen:id".
type rawCollector struct {
	ln   net.Listener
	mu   sync.Mutex
	recs []map[string][]byte
}

func newRawCollector(tb testing.TB) *rawCollector {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c := &rawCollector{ln: ln}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
				mr := ipfix.NewMessageReader(conn)
				for {
					m, err := mr.Next()
					if err != nil {
						return
					}
					if d.Reset(m, time.Now()) != nil {
						return
					}
					for d.Next() {
						r := d.Record()
						raw := map[string][]byte{}
						for i := range r.NumFields() {
							f := r.Field(i)
							raw[fmt.Sprintf("%d:%d", f.EnterpriseID, f.ID)] = bytes.Clone(r.Bytes(i))
						}
						c.mu.Lock()
						c.recs = append(c.recs, raw)
						c.mu.Unlock()
					}
				}
			}()
		}
	}()
	return c
}

func (c *rawCollector) records() []map[string][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]map[string][]byte(nil), c.recs...)
}

// elemKey is the "pen:id" key of a registry element.
func elemKey(name string) string {
	ie := ipfix.DefaultRegistry().MustByName(name)
	return fmt.Sprintf("%d:%d", ie.EnterpriseID, ie.ID)
}

// rawUint reads a big-endian unsigned value of any reduced length.
func rawUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 8 {
		return 0, false
	}
	var buf [8]byte
	copy(buf[8-len(b):], b)
	return binary.BigEndian.Uint64(buf[:]), true
}

// TestGoIPFIXExporterThroughProxy: go-ipfix's ExportingProcess sends
// Antrea v2.7 records over TCP, as an Antrea agent does, to a Sluice
// aggregator in Proxy mode, which forwards them over TCP to a collector;
// every record arrives with its values and the Proxy-mode elements naming
// the original exporter.
func TestGoIPFIXExporterThroughProxy(t *testing.T) {
	coll := newRawCollector(t)
	addr := startSluiceProxy(t, coll.ln.Addr().String(), "")
	flows := sampleAntreaFlows(interopRecords, false)
	exportWithGoIPFIX(t, "tcp", addr, false, buffered, flows)

	deadline := time.Now().Add(15 * time.Second)
	for len(coll.records()) < len(flows) {
		if time.Now().After(deadline) {
			t.Fatalf("the collector received %d of %d records", len(coll.records()), len(flows))
		}
		time.Sleep(20 * time.Millisecond)
	}
	recs := coll.records()
	if len(recs) != len(flows) {
		t.Fatalf("the collector received %d records, sent %d", len(recs), len(flows))
	}

	kPod := elemKey("sourcePodName")
	bySrcPod := map[string]map[string][]byte{}
	for i, r := range recs {
		name := string(r[kPod])
		if _, dup := bySrcPod[name]; dup {
			t.Errorf("record %d: sourcePodName %q received twice", i, name)
		}
		bySrcPod[name] = r
	}
	kSrc, kDst := elemKey("sourceIPv4Address"), elemKey("destinationIPv4Address")
	kSPort, kDPort := elemKey("sourceTransportPort"), elemKey("destinationTransportPort")
	kProto, kOctets := elemKey("protocolIdentifier"), elemKey("octetTotalCount")
	kExp, kDom := elemKey("originalExporterIPv4Address"), elemKey("originalObservationDomainId")
	for i := range flows {
		f := &flows[i]
		r, ok := bySrcPod[f.SrcPod]
		if !ok {
			t.Errorf("flow %d: no record with sourcePodName %q", i, f.SrcPod)
			continue
		}
		if a := f.Src.As4(); !bytes.Equal(r[kSrc], a[:]) {
			t.Errorf("flow %d: sourceIPv4Address %v, want %v", i, r[kSrc], f.Src)
		}
		if a := f.Dst.As4(); !bytes.Equal(r[kDst], a[:]) {
			t.Errorf("flow %d: destinationIPv4Address %v, want %v", i, r[kDst], f.Dst)
		}
		for _, u := range []struct {
			key  string
			name string
			want uint64
		}{
			{kSPort, "sourceTransportPort", uint64(f.SrcPort)},
			{kDPort, "destinationTransportPort", uint64(f.DstPort)},
			{kProto, "protocolIdentifier", uint64(f.Proto)},
			{kOctets, "octetTotalCount", f.Octets},
			{kDom, "originalObservationDomainId", interopDomain},
		} {
			if got, ok := rawUint(r[u.key]); !ok || got != u.want {
				t.Errorf("flow %d: %s = %x, want %d", i, u.name, r[u.key], u.want)
			}
		}
		if !bytes.Equal(r[kExp], []byte{127, 0, 0, 1}) {
			t.Errorf("flow %d: originalExporterIPv4Address = %v, want 127.0.0.1", i, r[kExp])
		}
	}
}
