package flowstream_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"sluice/certs"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
	"sluice/internal/testkit/recpool"
	"sluice/ring"
	"sluice/sink/flowstream"
)

// serve runs a flow stream server on buf until the test ends and returns
// its address and the client's TLS configuration.
func serve(t testing.TB, buf *ring.Buffer[*flow.Flow], batch int) (string, *certs.Bundle) {
	t.Helper()
	b, err := certs.Ensure(t.TempDir(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := flowstream.New(flowstream.Options{Buffer: buf, TLS: b.ServerTLS(false), BatchSize: batch,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String(), b
}

// counted is a GetFlowsResponse a countCodec reads: it counts the flows
// (without decoding them, and so without allocating).
type counted struct {
	flows   atomic.Uint64
	dropped atomic.Uint64
	poison  atomic.Bool
}

type countCodec struct{}

func (countCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	return mem.BufferSlice{mem.SliceBuffer(b)}, err
}

func (countCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c := v.(*counted)
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			if bytes.Contains(v, []byte(recpool.Poison)) {
				c.poison.Store(true)
			}
			c.flows.Add(1)
			b = b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			c.dropped.Store(v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return nil
}

func (countCodec) Name() string { return "proto" }

// follow opens a following stream and counts what it receives until the
// test ends.
func follow(t testing.TB, addr string, b *certs.Bundle) *counted {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(b.ClientTLS("localhost"))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, err := conn.NewStream(ctx, &flowpb.FlowStreamService_ServiceDesc.Streams[0], flowpb.FlowStreamService_GetFlows_FullMethodName,
		grpc.ForceCodecV2(countCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SendMsg(&flowpb.GetFlowsRequest{Follow: true}); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	c := &counted{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st.RecvMsg(c) == nil {
		}
	}()
	t.Cleanup(func() { cancel(); <-done; conn.Close() })
	return c
}

// open produces one record and waits for the stream to send it: it is
// then reading the buffer.
func open(t testing.TB, p *recpool.Producer, c *counted, f *flow.Flow) {
	p.Produce(context.Background(), []*flow.Flow{f})
	recpool.Until(t, "the stream to open", func() bool { return c.flows.Load() == 1 })
}

// TestStreamAllocatesNothingPerRecord: in Aggregate mode's steady state
// (records recycled once every reader released them), a following stream
// costs no allocation per record, its client's receiving included (a few
// per response); and no flow it sends is a recycled record.
func TestStreamAllocatesNothingPerRecord(t *testing.T) {
	p := recpool.New(8192)
	addr, b := serve(t, p.Buf, 100)
	c := follow(t, addr, b)
	recs := recpool.Records(2048)
	open(t, p, c, recs[0])
	want := uint64(1)
	round := func() {
		want += uint64(len(recs))
		p.Round(t, context.Background(), recs, 256, func() bool { return c.flows.Load() == want })
	}
	per := recpool.Measure(8, len(recs), round)
	t.Logf("%.4f allocations per record; %d records made, %d recycled; %d flows received, %d dropped", per, p.Made, p.Recycled,
		c.flows.Load(), c.dropped.Load())
	if per > recpool.PerRecordBound {
		t.Errorf("%.3f allocations per record, want none (but a few per response)", per)
	}
	if p.Recycled == 0 {
		t.Error("no record was recycled: the stream never released")
	}
	if c.poison.Load() {
		t.Error("the stream sent a recycled record")
	}
}

// TestLappedNeverSendsRecycled: a stream the producer laps again and
// again (a small buffer, records recycled as soon as released) never sends
// a record that was recycled under it.
func TestLappedNeverSendsRecycled(t *testing.T) {
	p := recpool.New(64)
	p.Quarantine = true
	addr, b := serve(t, p.Buf, 16)
	c := follow(t, addr, b)
	recs := recpool.Records(4096)
	open(t, p, c, recs[0])
	for range 10 {
		p.Round(t, context.Background(), recs, 64, func() bool { return true })
	}
	// Each response carries the count of flows lost so far.
	recpool.Until(t, "the stream to catch up", func() bool { return c.flows.Load()+c.dropped.Load() == 1+10*4096 })
	if c.poison.Load() {
		t.Fatal("the stream sent a recycled record")
	}
	t.Logf("%d flows, %d lost, %d recycled", c.flows.Load(), c.dropped.Load(), p.Recycled)
}

// TestStreamSendsFromFlowMessages: the client reads, with the generated
// types, the messages FromFlow makes, for Aggregate mode's records (the
// aggregation, labels) and for records of every field.
func TestStreamSendsFromFlowMessages(t *testing.T) {
	buf := ring.New[*flow.Flow](1024)
	addr, b := serve(t, buf, 7)
	var in []*flow.Flow
	in = append(in, recpool.Records(300)...)
	for i := range 300 {
		f := flowtest.Full(i, i%2 == 0)
		if i%10 == 0 {
			f.SourcePodLabels = `{"esc":"a\"b","u":"\u00e9"}` // labels not written as scanned
		}
		in = append(in, f)
	}
	bad := flowtest.Full(1000, true)
	bad.SourcePodLabels = "not json" // no Protobuf form: not sent, counted
	in = append(in, bad)
	buf.Produce(in...)
	var got []*flowpb.Flow
	err := flowstream.Get(context.Background(), addr, b.ClientTLS("localhost"), &flowpb.GetFlowsRequest{}, func(r *flowpb.GetFlowsResponse) error {
		got = append(got, r.Flows...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(in)-1 {
		t.Fatalf("%d flows, want %d", len(got), len(in)-1)
	}
	for i, f := range in[:len(in)-1] {
		want, err := flowproto.FromFlow(f)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got[i], protocmp.Transform()); d != "" {
			t.Fatalf("flow %d (-FromFlow +sent):\n%s", i, d)
		}
	}
}

// BenchmarkStream is one record through a following stream, from the
// producer to the client (which counts the flows without decoding them).
// warmRounds of 1024 records go through before the benchmark: 1.5 laps
// of its buffer.
const warmRounds = 12

func BenchmarkStream(b *testing.B) {
	p := recpool.New(8192)
	addr, bundle := serve(b, p.Buf, 100)
	c := follow(b, addr, bundle)
	recs := recpool.Records(1024)
	open(b, p, c, recs[0])
	want := uint64(1)
	for range warmRounds { // the buffer's first lap allocates its records
		want += uint64(len(recs))
		p.Round(b, context.Background(), recs, 256, func() bool { return c.flows.Load() == want })
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += len(recs) {
		chunk := recs[:min(len(recs), b.N-n)]
		want += uint64(len(chunk))
		p.Round(b, context.Background(), chunk, 256, func() bool { return c.flows.Load() == want })
	}
}
