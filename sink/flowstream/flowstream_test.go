package flowstream_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"sluice/certs"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/flowtest"
	"sluice/ring"
	"sluice/sink/flowstream"
)

func TestFilter(t *testing.T) {
	f := flowtest.Full(1, false) // ns-a/client-1 10.10.0.1 → ns-b/server-1 10.10.1.1, inter-node, ns-b/server:http
	from, to := flowpb.FilterDirection_FILTER_DIRECTION_FROM, flowpb.FilterDirection_FILTER_DIRECTION_TO
	for _, c := range []struct {
		name   string
		filter *flowpb.FlowFilter
		want   bool
	}{
		{"empty", nil, true},
		{"namespace either", &flowpb.FlowFilter{Namespaces: []string{"x", "ns-b"}}, true},
		{"namespace from", &flowpb.FlowFilter{Namespaces: []string{"ns-b"}, Direction: from}, false},
		{"namespace to", &flowpb.FlowFilter{Namespaces: []string{"ns-b"}, Direction: to}, true},
		{"pod by name", &flowpb.FlowFilter{PodNames: []string{"client-1"}}, true},
		{"pod wrong namespace", &flowpb.FlowFilter{PodNames: []string{"ns-b/client-1"}}, false},
		{"labels", &flowpb.FlowFilter{PodLabelSelector: "app=server"}, true},
		{"labels set-based", &flowpb.FlowFilter{PodLabelSelector: "tier in (front),app=client", Direction: from}, true},
		{"labels no match", &flowpb.FlowFilter{PodLabelSelector: "app=db"}, false},
		{"service", &flowpb.FlowFilter{ServiceNames: []string{"ns-b/server"}}, true},
		{"service with port", &flowpb.FlowFilter{ServiceNames: []string{"ns-b/server:http"}}, true},
		{"other service", &flowpb.FlowFilter{ServiceNames: []string{"ns-b/db"}}, false},
		{"flow type", &flowpb.FlowFilter{FlowTypes: []flowpb.FlowType{flowpb.FlowType_FLOW_TYPE_INTER_NODE}}, true},
		{"other flow type", &flowpb.FlowFilter{FlowTypes: []flowpb.FlowType{flowpb.FlowType_FLOW_TYPE_TO_EXTERNAL}}, false},
		{"cidr", &flowpb.FlowFilter{IpAddresses: []string{"10.10.1.0/24"}}, true},
		{"cidr from", &flowpb.FlowFilter{IpAddresses: []string{"10.10.1.0/24"}, Direction: from}, false},
		{"address", &flowpb.FlowFilter{IpAddresses: []string{"10.10.0.1"}}, true},
		{"AND across", &flowpb.FlowFilter{Namespaces: []string{"ns-a"}, IpAddresses: []string{"192.0.2.0/24"}}, false},
	} {
		fl, err := flowstream.Compile(c.filter)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := fl.Match(f); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	for _, bad := range []*flowpb.FlowFilter{
		{PodLabelSelector: "app in ("}, {IpAddresses: []string{"10.0.0.300"}}, {ServiceNames: []string{"nons"}},
		{PodNames: []string{"a/b/c"}}, {Direction: 7}, {FlowTypes: []flowpb.FlowType{-1}},
	} {
		if _, err := flowstream.Compile(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// TestHistorySinceAndDropped: without follow, a stream sends the history
// (since filters it); a follower that cannot keep up is told how many
// flows it lost.
func TestHistorySinceAndDropped(t *testing.T) {
	b, err := certs.Ensure(t.TempDir(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	buf := ring.New[*flow.Flow](8)
	srv, err := flowstream.New(flowstream.Options{Buffer: buf, TLS: b.ServerTLS(false), BatchSize: 2,
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
	defer func() { cancel(); <-done }()
	for i := range 12 { // 4 overwritten before anyone reads
		buf.Produce(flowtest.Full(i, false))
	}
	get := func(req *flowpb.GetFlowsRequest, each func(*flowpb.GetFlowsResponse) error) (ids []string, dropped uint64) {
		err := flowstream.Get(ctx, ln.Addr().String(), b.ClientTLS("localhost"), req, func(r *flowpb.GetFlowsResponse) error {
			for _, f := range r.Flows {
				ids = append(ids, f.GetId())
			}
			dropped = r.GetDroppedCount()
			if each != nil {
				return each(r)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return ids, dropped
	}
	ids, _ := get(&flowpb.GetFlowsRequest{}, nil)
	if len(ids) != 8 || ids[0] != "flow-4" || ids[7] != "flow-11" {
		t.Errorf("history %v", ids)
	}
	// Full(i) ends at 12:00:30.5 + i s.
	since := time.Date(2026, 11, 1, 12, 0, 40, 0, time.UTC)
	ids, _ = get(&flowpb.GetFlowsRequest{Since: timestamppb.New(since)}, nil)
	if len(ids) != 2 || ids[0] != "flow-10" {
		t.Errorf("since: %v", ids)
	}
	ids, _ = get(&flowpb.GetFlowsRequest{MaxCount: 3}, nil)
	if len(ids) != 3 {
		t.Errorf("max_count: %v", ids)
	}
	// A follower that stalls on its first response while 20 flows pass.
	// By then the server has sent 2 to 8 of the history; the 8 newest of
	// the burst follow the loss, so 10 arrive however far it had got.
	first := true
	ids, dropped := get(&flowpb.GetFlowsRequest{Follow: true, MaxCount: 10, Filter: &flowpb.FlowFilter{IpAddresses: []string{"10.10.0.0/16"}}},
		func(r *flowpb.GetFlowsResponse) error {
			if first {
				first = false
				var burst []*flow.Flow
				for i := range 20 {
					f := flowtest.Full(100+i, false)
					f.SourceIP = netip.MustParseAddr("10.10.9.9")
					burst = append(burst, f)
				}
				buf.Produce(burst...) // at once: the stream cannot keep up
			}
			return nil
		})
	if dropped == 0 || len(ids) != 10 {
		t.Errorf("follow: %d flows, dropped %d", len(ids), dropped)
	}
}
