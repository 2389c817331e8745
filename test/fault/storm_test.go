package fault

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/certs"
	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/ipfixgen"
)

// oneRecord is an IPFIX message stream of a template and one record from
// the exporter numbered i.
func oneRecord(t *testing.T, i int) []byte {
	t.Helper()
	return ipfixgen.Messages(t, uint32(i), []flow.Flow{{StartTime: time.Now().Truncate(time.Second), EndTime: time.Now().Truncate(time.Second),
		SourceIP: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), DestinationIP: netip.MustParseAddr("10.244.200.1"),
		SourcePort: uint16(i), DestinationPort: 443, Protocol: 6, FlowType: flow.FlowTypeIntraNode}})
}

// TestConnectionStorm is scenario 3: many exporters connect within about a
// second, each sends a record and stays connected; all are served (every
// record delivered) within a bounded time, none starves, and once they
// leave the aggregator's goroutines and open files return to where they
// were.
func TestConnectionStorm(t *testing.T) {
	for _, c := range []struct {
		transport string
		peers     int
	}{{"tcp", 1000}, {"tls", 300}, {"udp", 1000}} {
		t.Run(c.transport, func(t *testing.T) { testStorm(t, c.transport, c.peers) })
	}
}

func testStorm(t *testing.T, transport string, peers int) {
	p := newPipeline(t, transport, "5s")
	agg := p.startAggregator()
	goroutines := regexp.MustCompile(`(?m)^go_goroutines (\S+)$`)
	fds := regexp.MustCompile(`(?m)^process_open_fds (\S+)$`)
	baseG, baseF := metric(t, p.api, goroutines), metric(t, p.api, fds)
	var clientTLS *tls.Config
	if transport == "tls" {
		b, err := certs.Ensure(p.certDir, certs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		clientTLS = b.ClientTLS("localhost")
	}
	msgs := make([][]byte, peers)
	for i := range msgs {
		msgs[i] = oneRecord(t, i+1)
	}
	network := "tcp"
	if transport == "udp" {
		network = "udp"
	}
	conns := make([]net.Conn, peers)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []error
	started := time.Now()
	for i := range peers {
		wg.Go(func() {
			c, err := net.DialTimeout(network, p.ipfix, 10*time.Second)
			if err == nil && clientTLS != nil {
				tc := tls.Client(c, clientTLS)
				_ = tc.SetDeadline(time.Now().Add(20 * time.Second))
				if err = tc.Handshake(); err == nil {
					_ = tc.SetDeadline(time.Time{})
				}
				c = tc
			}
			if err == nil {
				_, err = c.Write(msgs[i])
			}
			if err != nil {
				mu.Lock()
				failed = append(failed, fmt.Errorf("peer %d: %w", i, err))
				mu.Unlock()
				return
			}
			conns[i] = c
		})
	}
	wg.Wait()
	connected := time.Since(started)
	if len(failed) > 0 {
		t.Fatalf("%d of %d peers failed, first: %v", len(failed), peers, failed[0])
	}
	// Over UDP a burst may outrun the socket's buffer (the kernel drops
	// datagrams) or the pipeline (the collector drops records rather than
	// stop reading): both must be counted. Each datagram holds one record.
	kernel := regexp.MustCompile(`(?m)^sluice_collector_udp_datagrams_dropped_total (\S+)$`)
	pipelineFull := regexp.MustCompile(`(?m)^sluice_collector_records_dropped_total\{reason="pipeline-full",transport="udp"\} (\S+)$`)
	var kernelDropped int
	testkit.WaitFor(t, "a record from every peer (or its datagram counted as dropped)", func() bool {
		kernelDropped = max(metric(t, p.api, kernel), 0) + max(metric(t, p.api, pipelineFull), 0)
		return p.coll.Len()+kernelDropped >= peers
	})
	served := time.Since(started)
	seen := map[uint16]bool{}
	for _, r := range p.coll.Records() {
		seen[r.Flow.SourcePort] = true
	}
	if len(seen)+kernelDropped != peers {
		t.Errorf("records from %d distinct peers and %d datagrams counted as dropped, want %d in all", len(seen), kernelDropped, peers)
	}
	peakG, peakF := metric(t, p.api, goroutines), metric(t, p.api, fds)
	for _, c := range conns {
		c.Close()
	}
	// UDP peers have no connection to close: the aggregator forgets them
	// after its template lifetime, so only TCP and TLS sessions must end.
	var nowG, nowF int
	if transport != "udp" {
		testkit.WaitFor(t, "goroutines and open files back to the baseline", func() bool {
			nowG, nowF = metric(t, p.api, goroutines), metric(t, p.api, fds)
			return nowG <= baseG+10 && nowF <= baseF+5
		})
	}
	t.Logf("%s: %d peers connected and sent in %v, all served in %v (%d records dropped by the kernel or for room in the pipeline, counted); goroutines %d → %d → %d, open files %d → %d → %d",
		transport, peers, connected.Round(time.Millisecond), served.Round(time.Millisecond), kernelDropped, baseG, peakG, nowG, baseF, peakF, nowF)
	if served > 30*time.Second {
		t.Errorf("serving %d peers took %v", peers, served)
	}
	agg.signal(t, syscall.SIGTERM)
}
