package exporter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"sluice/certs"
	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/connstore"
	"sluice/exporter/grpcsend"
	"sluice/exporter/ipfixsend"
	"sluice/exporter/queue"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/traceflow/cluster"
	"sluice/traceflow/pipeline"
)

// table is an in-memory connection table whose counters grow at every
// dump, so every connection has news at every poll.
type table struct{ conns []source.Conn }

func (t *table) Dump(_ context.Context, dst []source.Conn) ([]source.Conn, error) {
	for i := range t.conns {
		c := &t.conns[i]
		c.Packets += 3
		c.Bytes += 1500
		c.ReversePackets += 2
		c.ReverseBytes += 9000
	}
	return append(dst, t.conns...), nil
}

func (t *table) Close() error { return nil }

// newTable makes n TCP connections from the local Pods 10.10.0.0/16 to
// Pods on other Nodes, the shape of Antrea's benchmark.
func newTable(n int) *table {
	t := &table{conns: make([]source.Conn, n)}
	for i := range t.conns {
		src := netip.AddrFrom4([4]byte{10, 10, byte(i >> 8), byte(i)})
		dst := netip.AddrFrom4([4]byte{10, 20, byte(i >> 8), byte(i)})
		t.conns[i] = source.Conn{ID: uint32(i + 1), Proto: source.ProtoTCP, TCPState: source.TCPEstablished,
			OrigSrc: netip.AddrPortFrom(src, uint16(30000+i%30000)), OrigDst: netip.AddrPortFrom(dst, 443),
			ReplySrc: netip.AddrPortFrom(dst, 443), ReplyDst: netip.AddrPortFrom(src, uint16(30000+i%30000)),
			Start: time.Unix(1_700_000_000, 0)}
	}
	return t
}

// newAttributedTable is newTable's shape for the attribution benchmarks:
// 250 client Pods, each connection to an address outside the cluster's
// Pod CIDRs, so that the model finds an egress rule and an Egress for
// every connection (every verdict cached: 500 keys).
func newAttributedTable(n int) *table {
	t := &table{conns: make([]source.Conn, n)}
	for i := range t.conns {
		src := netip.AddrFrom4([4]byte{10, 10, 0, byte(i % 250)})
		dst := netip.AddrFrom4([4]byte{10, 20, 0, byte(i % 250)})
		sport, dport := uint16(30000+i%30000), uint16(443+i/30000)
		t.conns[i] = source.Conn{ID: uint32(i + 1), Proto: source.ProtoTCP, TCPState: source.TCPEstablished,
			OrigSrc: netip.AddrPortFrom(src, sport), OrigDst: netip.AddrPortFrom(dst, dport),
			ReplySrc: netip.AddrPortFrom(dst, dport), ReplyDst: netip.AddrPortFrom(src, sport),
			Start: time.Unix(1_700_000_000, 0)}
	}
	return t
}

// benchAttributor models two Nodes, the 250 client Pods of
// newAttributedTable on node-1 with an Egress, and a NetworkPolicy that
// allows their egress to 10.20.0.0/16.
func benchAttributor(b *testing.B) *attribution.Attributor {
	var y strings.Builder
	y.WriteString(`apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Namespace, metadata: {name: bench}}
- apiVersion: v1
  kind: Node
  metadata: {name: node-1}
  spec: {podCIDR: 10.10.0.0/16, podCIDRs: [10.10.0.0/16]}
  status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
- apiVersion: v1
  kind: Node
  metadata: {name: node-2}
  spec: {podCIDR: 10.30.0.0/16, podCIDRs: [10.30.0.0/16]}
  status: {addresses: [{type: InternalIP, address: 192.168.0.2}]}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: clients-out, namespace: bench}
  spec:
    podSelector: {matchLabels: {app: client}}
    policyTypes: [Egress]
    egress:
    - to: [{ipBlock: {cidr: 10.20.0.0/16}}]
- apiVersion: crd.antrea.io/v1beta1
  kind: Egress
  metadata: {name: bench-out, creationTimestamp: "2026-01-01T00:00:00Z"}
  spec:
    appliedTo: {podSelector: {matchLabels: {app: client}}}
    egressIP: 192.168.0.100
  status: {egressNode: node-2, egressIP: 192.168.0.100}
`)
	for i := range 250 {
		fmt.Fprintf(&y, `- apiVersion: v1
  kind: Pod
  metadata: {name: client-%d, namespace: bench, labels: {app: client}}
  spec: {nodeName: node-1}
  status: {phase: Running, podIP: 10.10.0.%d, podIPs: [{ip: 10.10.0.%d}]}
`, i, i, i)
	}
	objs, err := cluster.ParseObjects([]byte(y.String()), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	a := attribution.New(attribution.Options{})
	l := attribution.NewLoader(a, func(context.Context) ([]cluster.Object, error) { return objs, nil }, pipeline.DefaultConfig())
	if _, err := l.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	return a
}

func benchPods(n int) enrich.Store {
	pods := make([]enrich.Pod, 0, 256)
	for i := range min(n, 256) {
		pods = append(pods, enrich.Pod{Namespace: "bench", Name: "client-" + string(rune('a'+i%26)), NodeName: "node-1",
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 10, byte(i >> 8), byte(i)})}})
	}
	return enrich.NewStatic(pods, nil, nil)
}

// drain is a TCP collector that reads and discards; with serverTLS, over
// TLS.
func drain(b *testing.B, serverTLS *tls.Config) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	if serverTLS != nil {
		ln = tls.NewListener(ln, serverTLS)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	return ln.Addr().String()
}

// rawCodec hands gRPC messages over as bytes, undecoded.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = data
	return nil
}
func (rawCodec) Name() string { return "proto" }

// grpcDrain is a gRPC server with mutual TLS that takes any client stream
// (FlowExportService.Export among them) and discards its messages without
// decoding them, as drain does for IPFIX: the figure is the sender's cost.
func grpcDrain(b *testing.B, serverTLS *tls.Config) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)), grpc.ForceServerCodec(rawCodec{}),
		grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			var m []byte
			for {
				if err := st.RecvMsg(&m); err != nil {
					if errors.Is(err, io.EOF) {
						return st.SendMsg(&[]byte{})
					}
					return err
				}
			}
		}))
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// BenchmarkPollExport50k is one export cycle of 50,000 connections that
// all changed: dump, store update, Pod metadata (resolved once per
// connection), queueing, and encoding and sending over loopback until the
// aggregator side has taken every record: IPFIX over TCP, IPFIX over TLS,
// or gRPC (mutual TLS). Compare with the reference agent's ~8.4 ms per
// cycle (docs/performance.md).
func BenchmarkPollExport50k(b *testing.B) {
	const n = 50_000
	for _, mode := range []string{"store", "store+ipfix-tcp", "store+ipfix-tls", "store+grpc", "store+attribution", "store+attribution+ipfix-tcp"} {
		b.Run(mode, func(b *testing.B) {
			tbl := newTable(n)
			var attr *attribution.Attributor
			if strings.Contains(mode, "+attribution") {
				tbl, attr = newAttributedTable(n), benchAttributor(b)
				mode = strings.Replace(mode, "+attribution", "", 1)
			}
			o := Options{Attributor: attr, Node: "node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")},
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, Source: tbl, Store: benchPods(n),
				ActiveTimeout: 5 * time.Second, IdleTimeout: 15 * time.Second, BufferSize: n,
				Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			var bundle *certs.Bundle
			if mode != "store" && mode != "store+ipfix-tcp" {
				var err error
				if bundle, err = certs.Ensure(b.TempDir(), certs.Options{}); err != nil {
					b.Fatal(err)
				}
			}
			var err error
			switch mode {
			case "store":
				o.Transport = nopTransport{}
			case "store+ipfix-tcp", "store+ipfix-tls":
				var serverTLS, clientTLS *tls.Config
				if bundle != nil {
					serverTLS, clientTLS = bundle.ServerTLS(true), bundle.ClientTLS("localhost")
				}
				o.Transport, err = ipfixsend.New(ipfixsend.Options{Address: drain(b, serverTLS), Proto: "tcp", TLS: clientTLS,
					ObservationDomainID: 1, Log: o.Log, Batch: 4096})
			case "store+grpc":
				// As the exporter builds it: default batch size.
				o.Transport, err = grpcsend.New(grpcsend.Options{Address: grpcDrain(b, bundle.ServerTLS(true)),
					TLS: bundle.ClientTLS("localhost"), ObservationDomainID: 1, Log: o.Log})
			}
			if err != nil {
				b.Fatal(err)
			}
			e, err := New(o)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = e.transport.Run(ctx, e.q) }()
			defer func() { cancel(); <-done }()
			var conns []source.Conn
			var batch []record.Record
			now := time.Unix(1_700_000_000, 0)
			conns, batch = e.Poll(ctx, now, conns[:0], batch[:0]) // first sight: tracked, nothing due
			if st := e.store.Stats(); st.Connections != n {
				b.Fatalf("%d connections tracked", st.Connections)
			}
			if attr != nil {
				if st := attr.Stats(); st.Computed == 0 || st.Errors != 0 {
					b.Fatalf("attribution: %+v", st)
				}
			}
			// One untimed export cycle, so that the record slices and the
			// queue have reached their steady state: the figure is the
			// cost of a cycle in a running exporter, not of growing. It
			// takes Poll's batch, to check the records.
			now = now.Add(5 * time.Second)
			conns, batch = e.Poll(ctx, now, conns[:0], batch[:0])
			if len(batch) != n {
				b.Fatalf("%d records in a cycle, want %d", len(batch), n)
			}
			if v := batch[0].Verdict; attr != nil && (v == nil || batch[0].Attr != record.AttrEgressPolicy|record.AttrEgress ||
				v.EgressName != "bench-out" || v.Egress.Name != "clients-out") {
				b.Fatalf("no attribution: %+v", batch[0])
			}
			if mode == "store" {
				e.q.Ack(e.q.Head() + uint64(e.q.Len()))
			}
			for e.q.Len() > 0 {
				time.Sleep(50 * time.Microsecond)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				now = now.Add(5 * time.Second) // every connection reaches its active timeout
				exported := e.store.Stats().Exported
				// As Run polls: the records go straight into the queue.
				conns = e.poll(ctx, now, conns[:0], nil)
				if d := e.store.Stats().Exported[connstore.ReasonActive] - exported[connstore.ReasonActive]; d != n {
					b.Fatalf("%d records in a cycle, want %d", d, n)
				}
				if mode == "store" {
					if e.q.Len() != n {
						b.Fatalf("%d records queued, want %d", e.q.Len(), n)
					}
					e.q.Ack(e.q.Head() + uint64(e.q.Len()))
				}
				for e.q.Len() > 0 {
					time.Sleep(50 * time.Microsecond)
				}
			}
			b.StopTimer()
			if e.q.Dropped() != 0 {
				b.Fatalf("%d records dropped", e.q.Dropped())
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/conn")
		})
	}
}

type nopTransport struct{}

func (nopTransport) Run(ctx context.Context, _ *queue.Queue) error { <-ctx.Done(); return nil }

// BenchmarkHeapPerConnection reports the heap the exporter holds per
// tracked connection (store entry, index, metadata and cached verdict),
// after the first poll of 50,000 connections, with and without policy
// attribution. The connection slice of the dump is the caller's and not
// counted; the queue is kept at one record.
func BenchmarkHeapPerConnection(b *testing.B) {
	const n = 50_000
	for _, mode := range []string{"pods", "pods+attribution"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				tbl := newTable(n)
				var attr *attribution.Attributor
				if mode == "pods+attribution" {
					tbl, attr = newAttributedTable(n), benchAttributor(b)
				}
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				before := ms.HeapAlloc
				e, err := New(Options{Node: "node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")},
					ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, Source: tbl, Store: benchPods(n),
					Attributor: attr, BufferSize: 1, Transport: nopTransport{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				conns, _ := e.Poll(context.Background(), time.Unix(1_700_000_000, 0), nil, nil)
				if e.store.Stats().Connections != n {
					b.Fatal("not every connection tracked")
				}
				runtime.GC()
				runtime.ReadMemStats(&ms)
				held := int64(ms.HeapAlloc) - int64(before) - int64(cap(conns))*int64(unsafe.Sizeof(source.Conn{}))
				b.ReportMetric(float64(held)/n, "heapB/conn")
				runtime.KeepAlive(e)
				runtime.KeepAlive(conns)
			}
		})
	}
}
