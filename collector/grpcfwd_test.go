package collector_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/certs"
	"sluice/collector"
	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/ipfix"
	"sluice/proxy"
	"sluice/ring"
)

// fastPath is Proxy mode's fast path as the aggregator sets it up for an
// IPFIX export: a Forwarding, its sampler for a view, and a second
// Proxy and Exporter that write records the normal way, for comparison.
type fastPath struct {
	fw      *proxy.Forwarding
	sample  *ring.Buffer[*flow.Flow]
	sampler flow.Sampler
	p       *proxy.Proxy
	ex      *ipfixmap.Exporter
	enc     *ipfix.Encoder
}

func newFastPath(t *testing.T) *fastPath {
	t.Helper()
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	newEx := func() *ipfixmap.Exporter {
		ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
	ip := netip.MustParseAddr
	store := enrich.NewStatic([]enrich.Pod{{Namespace: "ns-b", Name: "db-0", NodeName: "node-b",
		IPs: []netip.Addr{ip("10.10.1.7")}, Created: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}}, nil, nil)
	opts := proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: store, ClusterID: "c1"})}
	fp := &fastPath{p: proxy.New(opts), ex: newEx(), sample: ring.New[*flow.Flow](64)}
	if fp.fw, err = proxy.NewForwarding(proxy.New(opts), table, newEx()); err != nil || fp.fw == nil {
		t.Fatal(fp.fw, err)
	}
	fp.sampler = fp.fw.Sample(fp.sample, 5)
	fp.enc, _ = ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	return fp
}

// fastPathServer is newFastPath and a collector serving gRPC through it,
// its pipeline holding depth batches, sampling for the view if sample.
func fastPathServer(t *testing.T, depth int, sample bool) (fp *fastPath, h *harness, b *certs.Bundle, addr string, stop func()) {
	t.Helper()
	fp = newFastPath(t)
	o := collector.Options{Forwarder: fp.fw.NewForwarder, Records: flow.NewPool()}
	if sample {
		o.Sample = fp.sampler
	}
	h = newHarnessWith(t, depth, o)
	b = bundle(t)
	addr, stop = h.grpcServer(t, b)
	return fp, h, b, addr, stop
}

// normal is the export record the normal path (decoding into a flow
// record, Process, then the Exporter) writes for an encoded Flow received
// over gRPC from 127.0.0.1.
func (fp *fastPath) normal(t *testing.T, wire []byte) string {
	t.Helper()
	f := new(flow.Flow)
	if _, err := flowproto.NewDecoder().Decode(wire, f); err != nil {
		t.Fatal(err)
	}
	f.Origin = flow.Origin{Exporter: netip.MustParseAddr("127.0.0.1"), Transport: "grpc"}
	fp.p.Process(f)
	tm, _, err := fp.ex.Template(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := fp.enc.EncodeRecord(tm, func(b ipfix.RecordBuilder) error { return fp.ex.Write(b, tm, f) })
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// grpcFlow is record i as sent: an inter-Node half naming its source Pod
// (the destination's is in the store), without the L7 elements unless l7.
func grpcFlow(i int, l7 bool) *flow.Flow {
	f := flowtest.Full(i, false)
	f.DestinationIP = netip.MustParseAddr("10.10.1.7")
	f.DestinationPodName, f.DestinationPodNamespace, f.DestinationNodeName = "", "", ""
	f.Origin = flow.Origin{}
	if !l7 {
		f.AppProtocolName, f.HTTPVals = "", ""
		f.Present.Clear(flow.AppProtocolName)
		f.Present.Clear(flow.HTTPVals)
	}
	return f
}

// sendEach sends each request as its own message on one Export stream,
// then ends it and returns its final error.
func sendEach(t *testing.T, addr string, b *certs.Bundle, reqs ...[]byte) error {
	t.Helper()
	st, _ := exportStream(t, addr, b)
	for _, req := range reqs {
		if err := st.SendMsg(req); err != nil {
			break // the server ended the stream: RecvMsg says why
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var resp []byte
	if err := st.RecvMsg(&resp); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// request is an ExportRequest of the given encoded Flows.
func request(flows ...[]byte) []byte {
	var req []byte
	for _, f := range flows {
		req = protowire.AppendBytes(protowire.AppendTag(req, 1, protowire.BytesType), f)
	}
	return req
}

// TestGRPCFastPath: with Proxy mode's fast path, a gRPC stream writes each
// record it can as an export record on its own goroutine: the batches
// carry export records, counted as rebuilt, octet for octet what the
// normal path writes; records with elements to pass through go on as flow
// records. The records' arenas are counted right: each goes back exactly
// when its last record is released. The view gets enriched samples.
func TestGRPCFastPath(t *testing.T) {
	fp, h, b, addr, _ := fastPathServer(t, 1024, true)

	const n = 2000 // several arenas' worth
	want := map[string]int{}
	var reqs [][]byte
	l7 := 0
	for i := range n {
		withL7 := i%100 == 7
		wire := flowtest.Wire(grpcFlow(i, withL7), nil, nil)
		if withL7 {
			l7++
		} else {
			want[fp.normal(t, wire)]++
		}
		reqs = append(reqs, request(wire))
	}
	c := fp.sample.Consumer() // before the records: it reads what comes after
	if err := sendEach(t, addr, b, reqs...); err != nil {
		t.Fatalf("Export: %v", err)
	}
	// The stream has ended: every record is in a batch, and the stream
	// no longer holds a share of an arena.
	var encoded []ipfix.EncodedRecord
	var flows []*flow.Flow
	deadline := time.After(10 * time.Second)
	for len(encoded)+len(flows) < n {
		select {
		case bt := <-h.out:
			if bt.Rebuilt != len(bt.Encoded) || len(bt.EncodeErrs) != 0 {
				t.Fatalf("a batch of %d export records says %d rebuilt, %d errors", len(bt.Encoded), bt.Rebuilt, len(bt.EncodeErrs))
			}
			encoded = append(encoded, bt.Encoded...)
			flows = append(flows, bt.Flows...)
		case <-deadline:
			t.Fatalf("%d export and %d flow records of %d", len(encoded), len(flows), n)
		}
	}
	if len(flows) != l7 {
		t.Errorf("%d flow records, want the %d with L7 elements", len(flows), l7)
	}
	for _, f := range flows {
		if f.AppProtocolName == "" || f.DestinationPodName != "" {
			t.Fatalf("a flow record without L7 elements, or enriched already: %+v", f)
		}
	}
	for i, r := range encoded {
		if want[string(r.Data)] == 0 {
			t.Fatalf("export record %d is none of the normal path's: % x", i, r.Data)
		}
		want[string(r.Data)]--
	}
	arenas := map[*ipfix.Arena]int{}
	for _, r := range encoded {
		if r.Arena == nil {
			t.Fatal("an export record without its arena")
		}
		arenas[r.Arena]++
	}
	if len(arenas) < 2 {
		t.Errorf("%d records in %d arena(s): the test wants several", len(encoded), len(arenas))
	}
	for i, r := range encoded {
		arenas[r.Arena]--
		last := arenas[r.Arena] == 0
		if back := r.Arena.Release(1); back != last {
			t.Fatalf("record %d: its arena went back %v, its last record %v", i, back, last)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, ok := c.Next(ctx, nil, 1)
	if !ok || len(got) == 0 {
		t.Fatal("no sample for the view")
	}
	if s := got[0]; s.ClusterID != "c1" || s.DestinationPodName != "db-0" || s.FlowDirection != flow.DirectionEgress {
		t.Errorf("a sample not enriched as exported: %+v", s)
	}
}

// TestGRPCFastPathMalformedMessage: a message whose second Flow does not
// decode ends the stream, and its first Flow, already written as an export
// record, is taken back: none of the message is handed on. The records of
// the messages before it are.
func TestGRPCFastPathMalformedMessage(t *testing.T) {
	fp, h, b, addr, _ := fastPathServer(t, 16, false)
	good := flowtest.Wire(grpcFlow(1, false), nil, nil)
	err := sendEach(t, addr, b, request(good), request(flowtest.Wire(grpcFlow(2, false), nil, nil), []byte{0xff, 0xff, 0xff}))
	if status.Code(err) != codes.Internal {
		t.Fatalf("a malformed message: %v, want Internal", err)
	}
	wantData := fp.normal(t, good)
	var got []ipfix.EncodedRecord
	deadline := time.After(5 * time.Second)
	for len(got) < 1 {
		select {
		case bt := <-h.out:
			got = append(got, bt.Encoded...)
		case <-deadline:
			t.Fatal("no record")
		}
	}
	// Anything more would be in the channel already: the stream ended.
	for {
		select {
		case bt := <-h.out:
			got = append(got, bt.Encoded...)
			continue
		default:
		}
		break
	}
	if len(got) != 1 || !bytes.Equal(got[0].Data, []byte(wantData)) {
		t.Fatalf("%d records handed on, want the first message's one", len(got))
	}
	if !got[0].Arena.Release(1) {
		t.Error("the arena did not go back with its one record released: the taken-back record is still counted")
	}
}

// TestGRPCFastPathStreamHoldsItsArena: records handed on and released
// while their stream is still open do not give their arena back: the
// stream still writes into it.
func TestGRPCFastPathStreamHoldsItsArena(t *testing.T) {
	_, h, b, addr, _ := fastPathServer(t, 16, false)
	st, ctx := exportStream(t, addr, b)
	for round := range 3 {
		const n = 10
		for i := range n {
			if err := st.SendMsg(request(flowtest.Wire(grpcFlow(round*n+i, false), nil, nil))); err != nil {
				t.Fatal(err)
			}
		}
		var got []ipfix.EncodedRecord
		for len(got) < n {
			select {
			case bt := <-h.out:
				got = append(got, bt.Encoded...)
			case <-ctx.Done():
				t.Fatalf("round %d: %d of %d records", round, len(got), n)
			}
		}
		for i, r := range got {
			if r.Arena.Release(1) {
				t.Fatalf("round %d, record %d: its arena went back while its stream writes into it", round, i)
			}
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var resp []byte
	if err := st.RecvMsg(&resp); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
}

// TestGRPCFastPathShutdownReleasesOnce: records a stream could not hand on
// because the collector stopped are released once, not twice (send
// discarded them already): their arena's count ends at zero, not below.
func TestGRPCFastPathShutdownReleasesOnce(t *testing.T) {
	_, h, b, addr, stop := fastPathServer(t, 1, false)
	st, _ := exportStream(t, addr, b)
	// The first record's batch fills the pipeline (a channel of one)...
	if err := st.SendMsg(request(flowtest.Wire(grpcFlow(1, false), nil, nil))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the first batch in the pipeline", func() bool { return len(h.out) == 1 })
	// ...so the next three wait in the stream, which ends and waits to
	// hand them on, until the collector stops.
	var three [][]byte
	for i := range 3 {
		three = append(three, flowtest.Wire(grpcFlow(2+i, false), nil, nil))
	}
	if err := st.SendMsg(request(three...)); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the stream to count its four records", func() bool {
		return testutil.ToFloat64(h.m.Records.WithLabelValues("grpc", "127.0.0.1")) == 4
	})
	stop()
	first := <-h.out
	if len(first.Encoded) != 1 {
		t.Fatalf("the first batch has %d export records", len(first.Encoded))
	}
	a := first.Encoded[0].Arena
	if c := cap(a.Buf); c > 64<<10 {
		// An agent opens a stream per export: each one's records pin
		// their arena while they wait in the pipeline.
		t.Errorf("a stream's first arena holds %d KiB, want a small one", c>>10)
	}
	a.Release(1)
	if left := a.Left(); left != 0 {
		t.Errorf("the stream's arena is held by %d after every record was released once and the stream ended (want 0)", left)
	}
}

// TestGRPCFastPathErrorsOnlyBatch: a stream whose only record cannot be
// written ends while the pipeline is full: the error still reaches the
// mode (to be counted and logged), in a batch of its own.
func TestGRPCFastPathErrorsOnlyBatch(t *testing.T) {
	_, h, b, addr, _ := fastPathServer(t, 1, false)
	if err := sendEach(t, addr, b, request(flowtest.Wire(grpcFlow(1, false), nil, nil))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the first batch in the pipeline", func() bool { return len(h.out) == 1 })
	big := grpcFlow(2, false)
	big.SourcePodName = strings.Repeat("x", 70000) // more than an IPFIX message holds
	done := make(chan error, 1)
	go func() { done <- sendEach(t, addr, b, request(flowtest.Wire(big, nil, nil))) }()
	var errs []error
	deadline := time.After(10 * time.Second)
	for len(errs) == 0 {
		select {
		case bt := <-h.out:
			errs = append(errs, bt.EncodeErrs...)
		case <-deadline:
			t.Fatal("the encoding error never reached the mode")
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("Export: %v", err)
	}
	if !strings.Contains(errs[0].Error(), "sourcePodName") {
		t.Errorf("error %v, want one naming sourcePodName", errs[0])
	}
}

// TestGRPCFastPathDeclinedRecordsAreSampled: records the stream's
// forwarder declines (elements to pass through) leave the view's budget
// to the mode's run, which samples them: the stream does not spend it.
func TestGRPCFastPathDeclinedRecordsAreSampled(t *testing.T) {
	fp, h, b, addr, _ := fastPathServer(t, 16, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		fp.fw.Run(runCtx, h.out, ring.New[ipfix.EncodedRecord](1024), func(err error) { t.Error(err) })
	}()
	defer func() { stopRun(); <-runDone }()
	c := fp.sample.Consumer()
	var wires [][]byte
	for i := range 10 { // more than the budget of 5 a second, all with L7 elements
		wires = append(wires, flowtest.Wire(grpcFlow(i, true), nil, nil))
	}
	if err := sendEach(t, addr, b, request(wires...)); err != nil {
		t.Fatal(err)
	}
	got, ok := c.Next(ctx, nil, 100)
	if !ok || len(got) == 0 {
		t.Fatal("the view got no sample of records the stream's forwarder declined")
	}
	if got[0].AppProtocolName != "http" || got[0].ClusterID != "c1" {
		t.Errorf("a sample not enriched as exported: %+v", got[0])
	}
}
