package interop_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// startNfcapd starts nfcapd on a free UDP port of 127.0.0.1, writing to
// dir, and waits until its socket is bound. It retries with another port
// if the one it picked was taken in the meantime.
func startNfcapd(t *testing.T, ctx context.Context, nfcapd, dir string) (*process, int) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		port := freeUDPPort(t)
		p := startProcess(t, ctx, []string{"TZ=UTC"}, nfcapd, "-b", "127.0.0.1", "-p", fmt.Sprint(port), "-w", dir, "-t", "60")
		var pollErr error
		err := poll(ctx, "nfcapd to bind its port", func() bool {
			_, found, err := udpSocketState(port)
			pollErr = err
			return found || err != nil || p.exited()
		})
		switch {
		case err != nil:
			t.Fatal(err)
		case pollErr != nil:
			t.Fatal(pollErr)
		case !p.exited():
			return p, port
		case attempt == 2:
			t.Fatalf("nfcapd exited at startup: %v\n%s", p.err, p.out.String())
		}
		t.Logf("nfcapd exited at startup on port %d, retrying: %s", port, p.out.String())
	}
}

// nfdumpFlow is a flow record of "nfdump -o json".
type nfdumpFlow struct {
	Type      string `json:"type"`
	First     string `json:"first"`
	Last      string `json:"last"`
	InPackets uint64 `json:"in_packets"`
	InBytes   uint64 `json:"in_bytes"`
	Proto     uint8  `json:"proto"`
	SrcPort   uint16 `json:"src_port"`
	DstPort   uint16 `json:"dst_port"`
	Src       string `json:"src4_addr"`
	Dst       string `json:"dst4_addr"`
	Router    string `json:"ip4_router"`
}

// nfdumpTimeLayout is how nfdump prints first and last with TZ=UTC.
const nfdumpTimeLayout = "2006-01-02T15:04:05.000"

func (f nfdumpFlow) record() (flowRecord, error) {
	src, err1 := netip.ParseAddr(f.Src)
	dst, err2 := netip.ParseAddr(f.Dst)
	first, err3 := time.Parse(nfdumpTimeLayout, f.First)
	last, err4 := time.Parse(nfdumpTimeLayout, f.Last)
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			return flowRecord{}, err
		}
	}
	return flowRecord{
		Key:     flowKey{Src: src, Dst: dst, SrcPort: f.SrcPort, DstPort: f.DstPort, Proto: f.Proto},
		Packets: f.InPackets, Octets: f.InBytes, Start: first, End: last,
	}, nil
}

func TestEncoderToNfcapd(t *testing.T) {
	nfcapd := requirePeer(t, "nfcapd")
	nfdump := requirePeer(t, "nfdump")
	ctx := testContext(t, 30*time.Second)
	flows := sampleFlows()
	msgs := encodeFlows(t, flows)

	dir := t.TempDir()
	p, port := startNfcapd(t, ctx, nfcapd, dir)
	conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The first message carries the template, so nfcapd learns it before
	// the data that needs it.
	for i, m := range msgs {
		if _, err := conn.Write(m); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	// Stop nfcapd only once it has read every datagram from its socket.
	var pollErr error
	err = poll(ctx, "nfcapd to read its socket", func() bool {
		rx, found, err := udpSocketState(port)
		pollErr = err
		return err != nil || !found || rx == 0
	})
	if err != nil {
		t.Fatal(err)
	}
	if pollErr != nil {
		t.Fatal(pollErr)
	}
	if err := p.stop(ctx); err != nil {
		t.Fatalf("stopping nfcapd: %v", err)
	}
	// nfcapd's own summary: every flow arrived, and our sequence numbers
	// (records sent before each message) are what it expects.
	summary := p.out.String()
	if !strings.Contains(summary, fmt.Sprintf("Flows: %d,", len(flows))) || !strings.Contains(summary, "Sequence Errors: 0,") ||
		!strings.Contains(summary, "Bad Packets: 0") {
		t.Errorf("nfcapd summary does not report %d flows without sequence errors or bad packets:\n%s", len(flows), summary)
	}

	out, err := run(ctx, []string{"TZ=UTC"}, nfdump, "-R", dir, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got []nfdumpFlow
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("nfdump JSON: %v\n%s", err, out)
	}
	if len(got) != len(flows) {
		t.Fatalf("nfdump shows %d flows, want %d:\n%s", len(got), len(flows), out)
	}
	// nfdump lists flows in the order they were received.
	for i, f := range got {
		r, err := f.record()
		if err != nil {
			t.Fatalf("nfdump flow %d %+v: %v", i, f, err)
		}
		if f.Type != "FLOW" || !r.equal(flows[i].flowRecord) {
			t.Errorf("nfdump flow %d: %s %v, want %v", i, f.Type, r, flows[i].flowRecord)
		}
		if f.Router != "127.0.0.1" {
			t.Errorf("nfdump flow %d: exporter %s, want 127.0.0.1", i, f.Router)
		}
	}
}
