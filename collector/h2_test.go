package collector_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/flow/flowpb"
	"sluice/flow/flowtest"
)

// TestGRPCManyMessagesArriveWhole: tens of thousands of one-flow
// messages on one stream, which the client packs into DATA frames with no
// regard for message boundaries, all arrive, in order, while a slow
// pipeline makes the stream's buffer fill and the windows close.
func TestGRPCManyMessagesArriveWhole(t *testing.T) {
	h := newHarness(t, 4)
	b := bundle(t)
	addr, _ := h.grpcServer(t, b)
	conn := dialCollector(t, addr, b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 30000
	got := make(chan error, 1)
	go func() {
		next := 0
		for next < n {
			select {
			case bt := <-h.out:
				for _, f := range bt.Flows {
					if want := "client-" + strconv.Itoa(next); f.SourcePodName != want {
						got <- errors.New("record " + strconv.Itoa(next) + " is " + f.SourcePodName)
						return
					}
					next++
				}
				if next < 10000 {
					time.Sleep(time.Millisecond) // a slow pipeline at first, not a synchronisation
				}
			case <-ctx.Done():
				got <- errors.New(strconv.Itoa(next) + " records")
				return
			}
		}
		got <- nil
	}()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, flowpb.FlowExportService_Export_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		req := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), flowtest.Wire(flowtest.Full(i, false), nil, nil))
		if err := st.SendMsg(req); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var resp []byte
	if err := st.RecvMsg(&resp); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("Export: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
