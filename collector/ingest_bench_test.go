package collector_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sluice/certs"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
)

// cpuTime is the CPU time the process has used (user and system), which
// a loaded machine disturbs much less than the wall-clock rate.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report adds records/s, the process's CPU time per record (the sending
// side's included) and allocations per record (both sides).
func report(b *testing.B, cpu0 time.Duration, perOp int) {
	records := float64(perOp * b.N)
	b.ReportMetric(records/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(cpuTime(b)-cpu0)/records, "cpu-ns/record")
}

// BenchmarkIngest measures records per second from an exporter's socket
// into the pipeline's batch channel: IPFIX over TCP (no TLS) next to gRPC
// (mutual TLS, as it always is), with the same 4096 Antrea v2.7 records,
// pre-encoded, so that the sending side costs only the writes. gRPC runs
// with one record per message (what Antrea agents send) and 100.
// See docs/performance.md.
func BenchmarkIngest(b *testing.B) {
	const n = 4096
	msgs := antrea(b, n, 0, 65535)

	// The same records, as the collector reads them, in Protobuf.
	h0 := newHarness(b, 64)
	conn, err := net.Dial("tcp", h0.tcp(b))
	if err != nil {
		b.Fatal(err)
	}
	for _, m := range msgs {
		conn.Write(m)
	}
	flows := h0.collect(b, n)
	conn.Close()
	var pb [][]byte
	for _, f := range flows {
		p, err := flowproto.FromFlow(f)
		if err != nil {
			b.Fatal(err)
		}
		raw, _ := proto.Marshal(p)
		pb = append(pb, raw)
	}
	requests := func(per int) [][]byte {
		var reqs [][]byte
		for i := 0; i < len(pb); i += per {
			var r []byte
			for _, f := range pb[i:min(i+per, len(pb))] {
				r = protowire.AppendBytes(protowire.AppendTag(r, 1, protowire.BytesType), f)
			}
			reqs = append(reqs, r)
		}
		return reqs
	}

	// drain counts records out of the pipeline until want arrived.
	drain := func(b *testing.B, h *harness, want int) {
		got := 0
		timeout := time.After(5 * time.Minute)
		for got < want {
			select {
			case bt := <-h.out:
				got += len(bt.Flows)
			case <-timeout:
				b.Fatalf("%d of %d records", got, want)
			}
		}
	}

	b.Run("ipfix-tcp", func(b *testing.B) {
		h := newHarness(b, 64)
		conn, err := net.Dial("tcp", h.tcp(b))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		b.ResetTimer()
		cpu0 := cpuTime(b)
		go func() {
			for range b.N {
				for _, m := range msgs {
					if _, err := conn.Write(m); err != nil {
						return
					}
				}
			}
		}()
		drain(b, h, n*b.N)
		report(b, cpu0, n)
	})
	// In a cluster the agents are other processes on other Nodes: the
	// agent-process variant sends from a child process (this test binary
	// again), so that what it reports — CPU and allocations per record —
	// is the collector's alone.
	b.Run("grpc-1-per-message-agent-process", func(b *testing.B) {
		h := newHarness(b, 64)
		dir := b.TempDir()
		bd, err := certs.Ensure(dir, certs.Options{})
		if err != nil {
			b.Fatal(err)
		}
		addr, _ := h.grpcServer(b, bd)
		var file []byte
		for _, r := range requests(1) {
			file = protowire.AppendBytes(file, r)
		}
		reqFile := filepath.Join(dir, "requests")
		if err := os.WriteFile(reqFile, file, 0o600); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%s|%d", agentEnv, addr, dir, reqFile, b.N))
		cmd.Stderr = os.Stderr
		b.ResetTimer()
		cpu0 := cpuTime(b)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		drain(b, h, n*b.N)
		b.StopTimer()
		report(b, cpu0, n)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("agent process: %v", err)
		}
	})
	for _, per := range []int{1, 100} {
		reqs := requests(per)
		name := "grpc-1-per-message"
		if per > 1 {
			name = "grpc-100-per-message"
		}
		b.Run(name, func(b *testing.B) {
			h := newHarness(b, 64)
			bd := bundle(b)
			addr, _ := h.grpcServer(b, bd)
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(bd.ClientTLS("localhost"))))
			if err != nil {
				b.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, "/antrea_io.antrea.pkg.apis.flow.v1alpha1.FlowExportService/Export", grpc.ForceCodec(rawCodec{}))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			cpu0 := cpuTime(b)
			go func() {
				for range b.N {
					for _, r := range reqs {
						if err := st.SendMsg(r); err != nil {
							return
						}
					}
				}
			}()
			drain(b, h, n*b.N)
			report(b, cpu0, n)
		})
	}
}

// agentEnv, when set, makes the test binary an agent sending pre-encoded
// ExportRequests: "address|certificate directory|requests file|rounds".
const agentEnv = "SLUICE_INGEST_AGENT"

func TestMain(m *testing.M) {
	if spec := os.Getenv(agentEnv); spec != "" {
		if err := runAgent(spec); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runAgent sends the requests file's messages, rounds times over, on one
// Export stream, one gRPC message each, as an Antrea agent does.
func runAgent(spec string) error {
	parts := strings.Split(spec, "|")
	if len(parts) != 4 {
		return fmt.Errorf("bad %s %q", agentEnv, spec)
	}
	rounds, err := strconv.Atoi(parts[3])
	if err != nil {
		return err
	}
	bd, err := certs.Ensure(parts[1], certs.Options{})
	if err != nil {
		return err
	}
	file, err := os.ReadFile(parts[2])
	if err != nil {
		return err
	}
	var reqs []any
	for len(file) > 0 {
		r, n := protowire.ConsumeBytes(file)
		if n < 0 {
			return errors.New("bad requests file")
		}
		reqs = append(reqs, r)
		file = file[n:]
	}
	cc, err := grpc.NewClient(parts[0], grpc.WithTransportCredentials(credentials.NewTLS(bd.ClientTLS("localhost"))))
	if err != nil {
		return err
	}
	defer cc.Close()
	st, err := cc.NewStream(context.Background(), &grpc.StreamDesc{ClientStreams: true}, flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	for range rounds {
		for _, r := range reqs {
			if err := st.SendMsg(r); err != nil {
				return err
			}
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	var resp []byte
	return st.RecvMsg(&resp)
}
