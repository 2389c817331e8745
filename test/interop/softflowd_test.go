package interop_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/ipfix"
)

// runSoftflowd makes softflowd read pcap and export its flows as IPFIX to
// collector over transport ("udp" or "tcp"), and waits for it to exit. It
// returns softflowd's process ID, which it exports as meteringProcessId.
func runSoftflowd(t *testing.T, ctx context.Context, pcap, collector, transport string) int {
	t.Helper()
	softflowd := requirePeer(t, "softflowd")
	softflowctl := requirePeer(t, "softflowctl")
	dir := t.TempDir()
	ctl := filepath.Join(dir, "sf.ctl")
	p := startProcess(t, ctx, nil, softflowd,
		"-r", pcap, "-n", collector, "-v", "10", "-A", "milli", "-P", transport,
		"-d", "-p", filepath.Join(dir, "sf.pid"), "-c", ctl)

	// Reading a file, softflowd waits for a control command before each
	// read: the first command is answered before the capture is read,
	// the second after. "expire-all" then exports every flow, and at the
	// end of the capture softflowd exits.
	err := poll(ctx, "softflowd control socket", func() bool {
		fi, err := os.Stat(ctl)
		return p.exited() || err == nil && fi.Mode()&os.ModeSocket != 0
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.exited() {
		t.Fatalf("softflowd exited at startup: %v", p.err)
	}
	// The socket file exists from bind(), a moment before listen().
	err = poll(ctx, "softflowctl statistics", func() bool {
		_, err := run(ctx, nil, softflowctl, "-c", ctl, "statistics")
		return err == nil || p.exited()
	})
	if err != nil {
		t.Fatal(err)
	}
	out, err := run(ctx, nil, softflowctl, "-c", ctl, "expire-all")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Expired %d flows", numFlows); !strings.Contains(out, want) {
		t.Fatalf("softflowctl expire-all: %q, want %q", out, want)
	}
	if err := p.wait(ctx); err != nil {
		t.Fatalf("softflowd: %v", err)
	}
	return p.cmd.Process.Pid
}

// checkSoftflowdExport checks the decoded export of the synthetic capture
// against the counts computed when the capture was written.
func checkSoftflowdExport(t *testing.T, msgs []decodedMessage, want map[flowKey]*directionCount, pid int) {
	t.Helper()
	if len(msgs) == 0 {
		t.Fatal("softflowd sent no IPFIX message")
	}
	seen := map[flowKey]bool{}
	var n, multiSet, templateAndData int
	var pidSeen bool
	for i, m := range msgs {
		t.Logf("message %d: sequence number %d, sets %v, %d flow records, %d other records", i, m.seq, m.sets, len(m.records), m.other)
		if len(m.sets) > 1 {
			multiSet++
		}
		if hasSet(m.sets, isTemplateSet) && hasSet(m.sets, isDataSet) && len(m.records) > 0 {
			templateAndData++
		}
		if m.meteringPID != 0 {
			pidSeen = true
			if m.meteringPID != uint64(pid) {
				t.Errorf("message %d: options record meteringProcessId %d, want softflowd's PID %d", i, m.meteringPID, pid)
			}
		}
		for _, r := range m.records {
			n++
			t.Logf("  %v", r)
			w, ok := want[r.Key]
			if !ok {
				t.Errorf("unexpected flow %v", r)
				continue
			}
			if seen[r.Key] {
				t.Errorf("flow %v reported twice", r)
			}
			seen[r.Key] = true
			if r.Packets != w.Packets || r.Octets != w.Octets {
				t.Errorf("flow %v: want %d packets, %d octets", r, w.Packets, w.Octets)
			}
			// Without -b softflowd still tracks a connection as one
			// biflow and stamps both of its records with the times of
			// the connection's first and last packets.
			if !r.Start.Equal(w.ConnFirst) || !r.End.Equal(w.ConnLast) {
				t.Errorf("flow %v: want start %s, end %s", r, w.ConnFirst.Format(time.RFC3339Nano), w.ConnLast.Format(time.RFC3339Nano))
			}
		}
	}
	if n != len(want) {
		t.Errorf("decoded %d flow records, want %d (3 connections, one record per direction)", n, len(want))
	}
	for k := range want {
		if !seen[k] {
			t.Errorf("no record for %v", k)
		}
	}
	if multiSet == 0 {
		t.Error("no message held more than one set; softflowd sends templates and data together")
	}
	if templateAndData == 0 {
		t.Error("no message held both a template set and data decoded with it")
	}
	if !pidSeen {
		t.Error("no options record with meteringProcessId (scope field) was decoded")
	}
}

func checkSessionStats(t *testing.T, st ipfix.SessionStats, msgs []decodedMessage) {
	t.Helper()
	var recs uint64
	for _, m := range msgs {
		recs += uint64(len(m.records) + m.other)
	}
	if st.Messages != uint64(len(msgs)) || st.DataRecords != recs {
		t.Errorf("session stats %+v: want %d messages, %d data records", st, len(msgs), recs)
	}
	if st.TemplatesAdded == 0 || st.UnknownTemplateSets != 0 || st.ReservedSets != 0 {
		t.Errorf("session stats %+v: want templates added, no unknown-template or reserved sets", st)
	}
}

func TestSoftflowdUDP(t *testing.T) {
	requirePeer(t, "softflowd")
	requirePeer(t, "softflowctl")
	ctx := testContext(t, 30*time.Second)
	pcap := filepath.Join(t.TempDir(), "flows.pcap")
	want := writeFlowPcap(t, pcap)

	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	pid := runSoftflowd(t, ctx, pcap, conn.LocalAddr().String(), "udp")

	// softflowd has exited, so everything it sent over loopback is queued
	// on our socket: read until the socket has been idle for a while.
	type datagram struct {
		from netip.AddrPort
		msg  []byte
	}
	var got []datagram
	buf := make([]byte, 65536)
	for {
		deadline := time.Now().Add(300 * time.Millisecond)
		if len(got) == 0 {
			deadline, _ = ctx.Deadline() // as long as allowed for the first
		}
		if err := conn.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, datagram{from, bytes.Clone(buf[:n])})
	}

	// One session per exporter address and port (RFC 7011 §8.4).
	type udpSession struct {
		sess *ipfix.Session
		dec  *ipfix.Decoder
		msgs []decodedMessage
	}
	sessions := map[netip.AddrPort]*udpSession{}
	var all []decodedMessage
	for i, dg := range got {
		s := sessions[dg.from]
		if s == nil {
			s = &udpSession{sess: ipfix.NewSession(ipfix.SessionOptions{TemplateTTL: ipfix.DefaultUDPTemplateTTL})}
			s.dec = ipfix.NewDecoder(s.sess)
			sessions[dg.from] = s
		}
		m, err := decodeMessage(s.dec, dg.msg, time.Now())
		if err != nil {
			t.Fatalf("datagram %d from %v (%d octets): %v", i, dg.from, len(dg.msg), err)
		}
		s.msgs = append(s.msgs, m)
		all = append(all, m)
	}
	if len(sessions) != 1 {
		t.Errorf("datagrams came from %d source ports, want 1", len(sessions))
	}
	for from, s := range sessions {
		t.Logf("session %v: %+v", from, s.sess.Stats)
		checkSessionStats(t, s.sess.Stats, s.msgs)
	}
	checkSoftflowdExport(t, all, want, pid)
}

func TestSoftflowdTCP(t *testing.T) {
	requirePeer(t, "softflowd")
	requirePeer(t, "softflowctl")
	ctx := testContext(t, 30*time.Second)
	pcap := filepath.Join(t.TempDir(), "flows.pcap")
	want := writeFlowPcap(t, pcap)

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	type result struct {
		msgs [][]byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { done <- r }()
		c, err := ln.Accept()
		if err != nil {
			r.err = err
			return
		}
		defer c.Close()
		if d, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(d)
		}
		mr := ipfix.NewMessageReader(c)
		for {
			m, err := mr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				r.err = err
				return
			}
			r.msgs = append(r.msgs, bytes.Clone(m))
		}
	}()

	pid := runSoftflowd(t, ctx, pcap, ln.Addr().String(), "tcp")
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("softflowd exited but the TCP connection did not end")
	}
	if r.err != nil {
		t.Fatalf("reading the TCP stream after %d messages: %v", len(r.msgs), r.err)
	}

	// A TCP connection is one session; templates never expire.
	sess := ipfix.NewSession(ipfix.SessionOptions{})
	dec := ipfix.NewDecoder(sess)
	var msgs []decodedMessage
	for i, b := range r.msgs {
		m, err := decodeMessage(dec, b, time.Now())
		if err != nil {
			t.Fatalf("message %d (%d octets): %v", i, len(b), err)
		}
		msgs = append(msgs, m)
	}
	t.Logf("session: %+v", sess.Stats)
	checkSessionStats(t, sess.Stats, msgs)
	checkSoftflowdExport(t, msgs, want, pid)
}
