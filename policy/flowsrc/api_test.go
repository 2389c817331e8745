package flowsrc_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"sluice/api"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
	"sluice/policy/flowsrc"
)

// TestAPISource: records sent over IPFIX to a real aggregator in Aggregate
// mode, read back through its HTTP API, carry their addresses, ports,
// Pods and policy verdicts.
func TestAPISource(t *testing.T) {
	a := testagg.Start(t, `
mode: Aggregate
aggregatorTransportProtocol: tcp
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0"}
`)
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	names, _ := ipfixmap.AgentElements("v2.7", 4)
	els, err := tb.Elements(names)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, _ := ipfixmap.TemplateOf(256, els)
	conn, err := net.Dial("tcp", a.Addrs().IPFIX)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	enc.AddTemplate(1, tmpl)
	now := time.Now().Truncate(time.Second).UTC()
	sent := []flow.Flow{
		{StartTime: now.Add(-time.Minute), EndTime: now, SourceIP: netip.MustParseAddr("10.10.1.5"),
			DestinationIP: netip.MustParseAddr("10.10.2.6"), SourcePort: 40001, DestinationPort: 8443, Protocol: 6,
			FlowType: flow.FlowTypeInterNode, SourcePodNamespace: "web", SourcePodName: "frontend-1",
			SourceNodeName: "n1",
			Ingress:        flow.Policy{Name: "pay-api-from-cart", Namespace: "payments", RuleAction: flow.ActionDrop, Type: 1}},
		{StartTime: now.Add(-time.Minute), EndTime: now, SourceIP: netip.MustParseAddr("10.10.1.6"),
			DestinationIP: netip.MustParseAddr("203.0.113.9"), SourcePort: 40002, DestinationPort: 443, Protocol: 6,
			FlowType: flow.FlowTypeToExternal, SourcePodNamespace: "web", SourcePodName: "cart-1", SourceNodeName: "n1"},
	}
	for i := range sent {
		if err := ipfixmap.WriteRecord(enc.Begin(1, tmpl), els, &sent[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	src, err := flowsrc.Open("http://" + a.Addrs().API)
	if err != nil {
		t.Fatal(err)
	}
	var got map[uint16]flowsrc.Record
	testkit.WaitFor(t, "both records in the aggregator's store", func() bool {
		got = map[uint16]flowsrc.Record{}
		err := src.Read(context.Background(), time.Time{}, func(r *flowsrc.Record) error { got[r.SrcPort] = *r; return nil })
		if err != nil {
			t.Fatal(err)
		}
		return len(got) == 2
	})
	r := got[40001]
	if r.Src != sent[0].SourceIP || r.Dst != sent[0].DestinationIP || r.Proto != 6 || r.DstPort != 8443 ||
		r.SrcPod != "frontend-1" || r.SrcNamespace != "web" || !r.Denied() || r.Ingress.Name != "pay-api-from-cart" ||
		!r.End.Equal(now) {
		t.Errorf("denied record: %+v", r)
	}
	if r := got[40002]; r.Denied() || r.Dst != sent[1].DestinationIP || r.DstPort != 443 {
		t.Errorf("allowed record: %+v", r)
	}
	n := 0
	if err := src.Read(context.Background(), now.Add(time.Hour), func(*flowsrc.Record) error { n++; return nil }); err != nil || n != 0 {
		t.Errorf("since an hour ahead: %d records, %v", n, err)
	}
	down, err := flowsrc.Open("http://" + testkit.RefusedAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := down.Read(context.Background(), time.Time{}, func(*flowsrc.Record) error { return nil }); err == nil {
		t.Error("a refused API read without error")
	}
}

// TestAPISourceStreams: the API's answer is decoded record by record as
// it arrives, not read whole first (a million records as element maps
// would take gigabytes): the server holds back the rest of its answer
// until the first record has reached the callback.
func TestAPISourceStreams(t *testing.T) {
	first := make(chan struct{})
	streamed := make(chan bool, 1)
	rec := func(port int) string {
		return fmt.Sprintf(`{"sourceIPv4Address":"10.10.1.5","destinationIPv4Address":"10.10.2.6","sourceTransportPort":%d,"destinationTransportPort":8080,"protocolIdentifier":6}`, port)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.HeaderMatches, "3")
		fmt.Fprint(w, "["+rec(40001)+",")
		w.(http.Flusher).Flush()
		select {
		case <-first:
			streamed <- true
		case <-time.After(30 * time.Second):
			streamed <- false
		case <-r.Context().Done():
			streamed <- false
			return
		}
		fmt.Fprint(w, rec(40002)+"]")
	}))
	defer srv.Close()
	src := &flowsrc.API{Server: srv.URL}
	var ports []uint16
	err := src.Read(context.Background(), time.Time{}, func(r *flowsrc.Record) error {
		if len(ports) == 0 {
			close(first)
		}
		ports = append(ports, r.SrcPort)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !<-streamed {
		t.Error("the first record reached the callback only after the whole answer was read")
	}
	if len(ports) != 2 || ports[0] != 40001 || ports[1] != 40002 {
		t.Errorf("records %v", ports)
	}
	if !src.Truncated {
		t.Error("3 matches, 2 records: not marked truncated")
	}
	for _, body := range []string{`{"error":"x"}`, `[{"sourceIPv4Address":"nope"}]`, `[` + rec(1)} {
		bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, body) }))
		if err := (&flowsrc.API{Server: bad.URL}).Read(context.Background(), time.Time{}, func(*flowsrc.Record) error { return nil }); err == nil {
			t.Errorf("answer %q: no error", body)
		}
		bad.Close()
	}
}
