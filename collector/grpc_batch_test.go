package collector_test

import (
	"errors"
	"io"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/internal/testkit"
)

// TestGRPCOneFlowMessagesTravelInBatches: while the pipeline is full, the
// records of the one-flow messages that keep arriving join the batch
// waiting to go: every record arrives, in order, in a handful of batches
// rather than one per message.
func TestGRPCOneFlowMessagesTravelInBatches(t *testing.T) {
	h := newHarness(t, 1)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	st, ctx := exportStream(t, addr, b)
	const n = 300
	for i := range n {
		req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), flowtest.Wire(flowtest.Full(i, false), nil, nil))
		if err := st.SendMsg(req); err != nil {
			t.Fatal(err)
		}
	}
	// Nobody reads the pipeline yet: one batch fills its buffer, the
	// handler holds the next, and every later record waits in the third.
	testkit.WaitFor(t, "every record received", func() bool {
		return testutil.ToFloat64(h.m.Records.WithLabelValues("grpc", "127.0.0.1")) == n
	})
	var got []*flow.Flow
	batches := 0
	for len(got) < n {
		select {
		case bt := <-h.out:
			batches++
			got = append(got, bt.Flows...)
		case <-ctx.Done():
			t.Fatalf("%d of %d records", len(got), n)
		}
	}
	if batches > 3 {
		t.Errorf("%d records in %d batches, want at most 3", n, batches)
	}
	for i, f := range got {
		if want := "client-" + strconv.Itoa(i); f.SourcePodName != want {
			t.Fatalf("record %d is %q, want %q", i, f.SourcePodName, want)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var resp []byte
	if err := st.RecvMsg(&resp); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("Export: %v", err)
	}
}
