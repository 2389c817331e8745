package aggregator_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/gob"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sluice/certs"
	"sluice/flow"
	"sluice/flow/flowproto"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit/ipfixgen"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
)

const (
	e2eAgents = 4
	e2eConns  = 10000 // connections per operation: two records each
)

// e2eFlows are agent a's records of operation op: for each connection
// whose source Pod is on a's Node, the source Node's record, and for each
// whose destination Pod is, the destination Node's record, as Antrea
// agents send them. Every operation has connections of its own.
func e2eFlows(op, a int) []flow.Flow {
	end := time.Now().Truncate(time.Second)
	var out []flow.Flow
	for i := range e2eConns {
		src, dst := i%e2eAgents, (i+1)%e2eAgents
		if a != src && a != dst {
			continue
		}
		f := flow.Flow{StartTime: end.Add(-10 * time.Second), EndTime: end, EndReason: 2,
			SourceIP:      netip.AddrFrom4([4]byte{10, byte(op), byte(i >> 8), byte(i)}),
			DestinationIP: netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}),
			SourcePort:    uint16(30000 + i%30000), DestinationPort: 8080, Protocol: 6, TCPState: "ESTABLISHED",
			FlowType: flow.FlowTypeInterNode}
		f.Stats.PacketTotalCount, f.Stats.OctetTotalCount, f.Stats.PacketDeltaCount, f.Stats.OctetDeltaCount = 100, 10000, 100, 10000
		f.ReverseStats.PacketTotalCount, f.ReverseStats.OctetTotalCount = 50, 5000
		if a == src {
			g := f
			g.SourcePodName, g.SourcePodNamespace, g.SourceNodeName = fmt.Sprintf("client-%d", i%500), "team-a", fmt.Sprintf("node-%d", src)
			out = append(out, g)
		}
		if a == dst {
			g := f
			g.DestinationPodName, g.DestinationPodNamespace, g.DestinationNodeName = fmt.Sprintf("server-%d", i%200), "team-b", fmt.Sprintf("node-%d", dst)
			out = append(out, g)
		}
	}
	return out
}

// e2eRequests are the same records as one-Flow ExportRequests, as an
// Antrea agent sends them: decoded from their IPFIX encoding (so that
// both transports carry what the collector reads) and marshalled once.
func e2eRequests(b *testing.B, msgs []byte) [][]byte {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		b.Fatal(err)
	}
	sess := ipfix.NewSession(ipfix.SessionOptions{})
	d := ipfix.NewDecoder(sess)
	norm := ipfixmap.NewNormalizer(table)
	var reqs [][]byte
	for rest := msgs; len(rest) > 0; {
		n := int(rest[2])<<8 | int(rest[3])
		if err := d.Reset(rest[:n], time.Now()); err != nil {
			b.Fatal(err)
		}
		for d.Next() {
			var f flow.Flow
			norm.Normalize(d.Record(), &f)
			p, err := flowproto.FromFlow(&f)
			if err != nil {
				b.Fatal(err)
			}
			raw, err := proto.Marshal(p)
			if err != nil {
				b.Fatal(err)
			}
			reqs = append(reqs, protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), raw))
		}
		rest = rest[n:]
	}
	return reqs
}

// e2eRawCodec sends pre-marshalled bytes as they are.
type e2eRawCodec struct{}

func (e2eRawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (e2eRawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (e2eRawCodec) Name() string { return "proto" }

func e2eCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// e2eCounter reads a counter of reg (summed over its series).
func e2eCounter(b *testing.B, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// BenchmarkEndToEnd is the path users run: four agents, each a Node's and
// each a process of its own (this test binary again), send the two halves
// of 10,000 inter-Node connections per operation to an aggregator in
// Aggregate mode (in this process), which correlates them and exports
// IPFIX over TCP to a receiver that decodes and counts. Agents send
// pre-encoded bytes (their own encoding is not measured): IPFIX over TCP,
// or gRPC over mutual TLS with one Flow per ExportRequest, as Antrea
// agents do. An operation ends when the correlation store has taken all
// its records; the export (on the active timeout, 1 s) is checked after
// the clock stops: every connection reaches the receiver correlated, and
// no sink drops anything. The inactive timeout (2 s) bounds the store, so
// an operation costs the same whatever b.N. Reported: records/s in, this
// process's CPU time per record from the start until every connection
// of the timed operations is out (the aggregator, its export and the
// receiver's decoding), and the agents' (their writes). See
// docs/performance.md.
func BenchmarkEndToEnd(b *testing.B) {
	for _, transport := range []string{"ipfix-tcp", "grpc-1-per-request"} {
		b.Run(transport, func(b *testing.B) { benchEndToEnd(b, "Aggregate", transport) })
	}
}

// BenchmarkEndToEndProxy is BenchmarkEndToEnd in Proxy mode: every
// record is forwarded, so an operation ends when the receiver has both
// records of each of its connections, and the CPU per record is what
// ingest and re-export cost without the store.
func BenchmarkEndToEndProxy(b *testing.B) {
	for _, transport := range []string{"ipfix-tcp", "grpc-1-per-request"} {
		b.Run(transport, func(b *testing.B) { benchEndToEnd(b, "Proxy", transport) })
	}
}

func benchEndToEnd(b *testing.B, mode, transport string) {
	dir := b.TempDir()
	coll := stubcollector.NewCounting(b)
	a := testagg.Start(b, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: tcp
activeFlowRecordTimeout: 1s
inactiveFlowRecordTimeout: 2s
recordBufferSize: 262144
flowCollector: {enable: true, address: "%s:tcp"}
sluice:
  ipfixAddress: "127.0.0.1:0"
  grpcAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  tls: {certDir: %s}
  aggregate: {maxFlows: 10000000}
`, mode, coll.Addr(), filepath.Join(dir, "certs")))
	ops := b.N + 1 // operation 0 warms up, untimed
	addr := a.Addrs().IPFIX
	if transport != "ipfix-tcp" {
		addr = a.Addrs().GRPC
	}
	agents := make([]*e2eAgentProc, e2eAgents)
	perOp := 0
	for ag := range e2eAgents {
		var payloads [][][]byte
		for op := range ops {
			msgs := ipfixgen.Messages(b, uint32(ag+1), e2eFlows(op, ag))
			if transport == "ipfix-tcp" {
				payloads = append(payloads, [][]byte{msgs})
			} else {
				payloads = append(payloads, e2eRequests(b, msgs))
			}
		}
		perOp += len(e2eFlows(0, ag))
		agents[ag] = startE2EAgent(b, filepath.Join(dir, fmt.Sprintf("agent-%d", ag)), transport, addr, filepath.Join(dir, "certs"), payloads)
	}
	reg := a.Registry()
	// exported waits until the receiver has the connections of ops
	// operations (the export runs on the 1 s active timeout).
	// In Proxy mode each connection arrives as its two records.
	perConn := 1
	if mode == "Proxy" {
		perConn = 2
	}
	exported := func(ops int) {
		deadline := time.Now().Add(2 * time.Minute)
		for coll.Len() < perConn*e2eConns*ops {
			if time.Now().After(deadline) {
				b.Fatalf("%d records at the receiver, want %d", coll.Len(), perConn*e2eConns*ops)
			}
			time.Sleep(5 * time.Millisecond) // polling the receiver's count, not a synchronisation
		}
	}
	run := func(op int) (agentCPU time.Duration) {
		for _, ag := range agents {
			ag.start(b, op)
		}
		for _, ag := range agents {
			agentCPU += ag.done(b)
		}
		if mode == "Proxy" {
			exported(op + 1)
			return agentCPU
		}
		want := float64(perOp * (op + 1))
		deadline := time.Now().Add(2 * time.Minute)
		for e2eCounter(b, reg, "sluice_aggregate_records_total") < want {
			if time.Now().After(deadline) {
				b.Fatalf("the store took %v of %v records", e2eCounter(b, reg, "sluice_aggregate_records_total"), want)
			}
			// Polling the store's counter, not a synchronisation. Each
			// poll gathers the whole registry (about 0.15 ms of CPU):
			// a coarse poll keeps that out of the measure, and its
			// latency weighs on the faster runs, not the slower.
			time.Sleep(10 * time.Millisecond)
		}
		return agentCPU
	}
	run(0)
	exported(1) // the warm-up's export is not in the measure
	b.ResetTimer()
	var mem0 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	cpu0 := e2eCPU(b)
	var agentCPU time.Duration
	for op := 1; op < ops; op++ {
		agentCPU += run(op)
	}
	b.StopTimer()
	records := float64(perOp * b.N)
	b.ReportMetric(records/b.Elapsed().Seconds(), "records/s")
	// The CPU time is counted until every connection is out, so that it
	// holds the whole export of the operations' records, however many
	// of the 1 s export sweeps fell while the clock ran.
	exported(ops)
	b.ReportMetric(float64(e2eCPU(b)-cpu0)/records, "cpu-ns/record")
	// Allocations do not depend on the machine's load as CPU time does:
	// this process's (the aggregator's and the receiver's), per record.
	var mem1 runtime.MemStats
	runtime.ReadMemStats(&mem1)
	b.ReportMetric(float64(mem1.Mallocs-mem0.Mallocs)/records, "allocs/record")
	b.ReportMetric(float64(mem1.TotalAlloc-mem0.TotalAlloc)/records, "B/record")
	b.ReportMetric(float64(mem1.NumGC-mem0.NumGC), "GCs")
	b.ReportMetric(float64(agentCPU)/records, "agent-cpu-ns/record")
	for _, ag := range agents {
		ag.stop(b)
	}

	// Every connection out, correlated, nothing dropped.
	if mode == "Proxy" {
		if n := coll.Len(); n != 2*e2eConns*ops {
			b.Fatalf("%d records at the receiver, want %d", n, 2*e2eConns*ops)
		}
	} else if c := e2eCounter(b, reg, "sluice_aggregate_correlated_total"); c != float64(e2eConns*ops) {
		b.Fatalf("%v connections correlated, want %d", c, e2eConns*ops)
	}
	if d := e2eCounter(b, reg, "sluice_sink_records_dropped_total"); d != 0 {
		b.Fatalf("the sink dropped %v records", d)
	}
}

// e2eAgentEnv, when set, makes the test binary an end-to-end agent:
// "transport|address|certificate directory|payload file". It reads
// operation numbers from stdin, one a line, sends that operation's
// messages, and answers each with its CPU time so far (ns) on stdout.
const e2eAgentEnv = "SLUICE_E2E_AGENT"

func TestMain(m *testing.M) {
	if spec := os.Getenv(e2eAgentEnv); spec != "" {
		if err := runE2EAgent(spec); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// e2eAgentProc is an agent process and its command pipes.
type e2eAgentProc struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	cpu0 time.Duration
}

func startE2EAgent(b *testing.B, file, transport, addr, certDir string, payloads [][][]byte) *e2eAgentProc {
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(payloads); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), e2eAgentEnv+"="+strings.Join([]string{transport, addr, certDir, file}, "|"))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &e2eAgentProc{cmd: cmd, in: in, out: bufio.NewReader(out)}
	b.Cleanup(func() { _ = in.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return p
}

func (p *e2eAgentProc) start(b *testing.B, op int) {
	if _, err := fmt.Fprintln(p.in, op); err != nil {
		b.Fatalf("agent: %v", err)
	}
}

// done waits for the operation's messages to be written and returns the
// agent's CPU time spent on it.
func (p *e2eAgentProc) done(b *testing.B) time.Duration {
	line, err := p.out.ReadString('\n')
	if err != nil {
		b.Fatalf("agent: %v", err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		b.Fatalf("agent said %q", line)
	}
	d := time.Duration(ns) - p.cpu0
	p.cpu0 = time.Duration(ns)
	return d
}

func (p *e2eAgentProc) stop(b *testing.B) {
	_ = p.in.Close()
	if err := p.cmd.Wait(); err != nil {
		b.Fatalf("agent process: %v", err)
	}
}

func runE2EAgent(spec string) error {
	parts := strings.Split(spec, "|")
	if len(parts) != 4 {
		return fmt.Errorf("bad %s %q", e2eAgentEnv, spec)
	}
	transport, addr, certDir, file := parts[0], parts[1], parts[2], parts[3]
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var payloads [][][]byte
	if err := gob.NewDecoder(bytes.NewReader(raw)).Decode(&payloads); err != nil {
		return fmt.Errorf("reading %s: %w", file, err)
	}
	var send func(msgs [][]byte) error
	finish := func() error { return nil }
	if transport == "ipfix-tcp" {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		send = func(msgs [][]byte) error {
			for _, m := range msgs {
				if _, err := c.Write(m); err != nil {
					return err
				}
			}
			return nil
		}
	} else {
		bd, err := certs.Ensure(certDir, certs.Options{})
		if err != nil {
			return err
		}
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(bd.ClientTLS("localhost"))))
		if err != nil {
			return err
		}
		defer cc.Close()
		st, err := cc.NewStream(context.Background(), &grpc.StreamDesc{ClientStreams: true}, "/antrea_io.antrea.pkg.apis.flow.v1alpha1.FlowExportService/Export", grpc.ForceCodec(e2eRawCodec{}))
		if err != nil {
			return err
		}
		send = func(msgs [][]byte) error {
			for _, m := range msgs {
				if err := st.SendMsg(m); err != nil {
					return err
				}
			}
			return nil
		}
		finish = func() error {
			if err := st.CloseSend(); err != nil {
				return err
			}
			var resp []byte
			return st.RecvMsg(&resp) // the server's answer once it has read the whole stream
		}
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		op, err := strconv.Atoi(in.Text())
		if err != nil || op < 0 || op >= len(payloads) {
			return fmt.Errorf("bad operation %q", in.Text())
		}
		if err := send(payloads[op]); err != nil {
			return err
		}
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return err
		}
		fmt.Println(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if err := in.Err(); err != nil {
		return err
	}
	return finish()
}
