package connstore

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"
	"unsafe"

	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/flow"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func tcp(id uint32, client, server string, pk, oc, rpk, roc uint64, state uint8) source.Conn {
	return source.Conn{ID: id, Proto: source.ProtoTCP, OrigSrc: ap(client), OrigDst: ap(server), ReplySrc: ap(server),
		ReplyDst: ap(client), Packets: pk, Bytes: oc, ReversePackets: rpk, ReverseBytes: roc, TCPState: state}
}

// run is a store with recording emit.
type run struct {
	t   *testing.T
	s   *Store[string]
	out []record.Record
}

func newRun(t *testing.T, o Options[string]) *run {
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &run{t: t, s: s}
}

func (r *run) poll(at time.Duration, conns ...source.Conn) []flow.Flow {
	r.out = r.s.Update(t0.Add(at), conns, r.out[:0])
	return record.Flows(nil, r.out)
}

func (r *run) expect(at time.Duration, got []flow.Flow, reasons ...uint8) {
	r.t.Helper()
	if len(got) != len(reasons) {
		r.t.Fatalf("at %v: %d records, want %d: %+v", at, len(got), len(reasons), got)
	}
	for i, f := range got {
		if f.EndReason != reasons[i] {
			r.t.Fatalf("at %v: record %d has end reason %d, want %d", at, i, f.EndReason, reasons[i])
		}
	}
}

func TestActiveIdleAndDeltas(t *testing.T) {
	r := newRun(t, Options[string]{})
	c := tcp(7, "10.0.1.2:40000", "10.0.2.3:80", 10, 1000, 8, 5000, source.TCPEstablished)
	r.expect(0, r.poll(0, c)) // first seen: nothing before the active timeout
	c.Packets, c.Bytes = 20, 2000
	r.expect(time.Second, r.poll(time.Second, c))
	got := r.poll(5*time.Second, c)
	r.expect(5*time.Second, got, ReasonActive)
	f := got[0]
	if f.Stats != (flow.Stats{PacketTotalCount: 20, OctetTotalCount: 2000, PacketDeltaCount: 20, OctetDeltaCount: 2000}) ||
		f.ReverseStats != (flow.Stats{PacketTotalCount: 8, OctetTotalCount: 5000, PacketDeltaCount: 8, OctetDeltaCount: 5000}) {
		t.Fatalf("first export stats %+v %+v", f.Stats, f.ReverseStats)
	}
	if f.TCPState != "ESTABLISHED" || f.SourcePort != 40000 || f.DestinationIP != netip.MustParseAddr("10.0.2.3") ||
		!f.StartTime.Equal(t0) || !f.EndTime.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("record %+v", f)
	}
	c.Bytes = 2500
	c.Packets = 25
	got = r.poll(10*time.Second, c)
	r.expect(10*time.Second, got, ReasonActive)
	if got[0].Stats.OctetDeltaCount != 500 || got[0].Stats.PacketDeltaCount != 5 || got[0].ReverseStats.OctetDeltaCount != 0 {
		t.Fatalf("second export deltas %+v %+v", got[0].Stats, got[0].ReverseStats)
	}
	// Unchanged: no record at the next active timeout...
	r.expect(15*time.Second, r.poll(15*time.Second, c))
	// ... one IDLE_TIMEOUT record 15 s after the last change, then silence.
	got = r.poll(25*time.Second, c)
	r.expect(25*time.Second, got, ReasonIdle)
	if got[0].Stats.OctetDeltaCount != 0 || got[0].Stats.OctetTotalCount != 2500 {
		t.Fatalf("idle record stats %+v", got[0].Stats)
	}
	for at := 30 * time.Second; at <= 60*time.Second; at += 5 * time.Second {
		r.expect(at, r.poll(at, c))
	}
	// New packets wake it up: exported again an active timeout later.
	c.Bytes = 3000
	r.expect(61*time.Second, r.poll(61*time.Second, c))
	got = r.poll(66*time.Second, c)
	r.expect(66*time.Second, got, ReasonActive)
	if got[0].Stats.OctetDeltaCount != 500 {
		t.Fatalf("delta after idle %d, want 500", got[0].Stats.OctetDeltaCount)
	}
}

func TestTCPCloseIsEndOfFlowOnceThenTombstone(t *testing.T) {
	r := newRun(t, Options[string]{})
	c := tcp(1, "10.0.1.2:40000", "10.0.2.3:80", 5, 500, 4, 300, source.TCPEstablished)
	r.expect(0, r.poll(0, c))
	c.TCPState, c.Bytes = source.TCPTimeWait, 900
	got := r.poll(time.Second, c) // before the active timeout: ended flows go at once
	r.expect(time.Second, got, ReasonEnd)
	if got[0].Stats.OctetTotalCount != 900 || got[0].Stats.OctetDeltaCount != 900 || got[0].TCPState != "TIME_WAIT" {
		t.Fatalf("end record %+v", got[0])
	}
	// The entry lingers in TIME_WAIT: remembered, never exported again.
	for at := 2 * time.Second; at < 40*time.Second; at += 5 * time.Second {
		r.expect(at, r.poll(at, c))
	}
	if st := r.s.Stats(); st.Connections != 1 || st.Ended != 1 {
		t.Fatalf("stats %+v, want one tombstone", st)
	}
	r.expect(41*time.Second, r.poll(41*time.Second)) // leaves the table: forgotten quietly
	if st := r.s.Stats(); st.Connections != 0 {
		t.Fatalf("stats %+v after the entry left", st)
	}
}

func TestGoneAndDyingAreEndOfFlow(t *testing.T) {
	r := newRun(t, Options[string]{})
	a := tcp(1, "10.0.1.2:40000", "10.0.2.3:80", 5, 500, 4, 300, source.TCPEstablished)
	u := source.Conn{ID: 2, Proto: source.ProtoUDP, OrigSrc: ap("10.0.1.2:5353"), OrigDst: ap("10.0.2.9:53"),
		ReplySrc: ap("10.0.2.9:53"), ReplyDst: ap("10.0.1.2:5353"), Packets: 1, Bytes: 60}
	r.expect(0, r.poll(0, a, u))
	u.Dying, u.ReversePackets, u.ReverseBytes = true, 1, 120
	got := r.poll(time.Second, a, u)
	r.expect(time.Second, got, ReasonEnd)
	if got[0].Protocol != source.ProtoUDP || got[0].TCPState != "" || got[0].Present.Has(flow.TCPState) || got[0].ReverseStats.OctetTotalCount != 120 {
		t.Fatalf("UDP end record %+v", got[0])
	}
	got = r.poll(2 * time.Second) // both gone; only the TCP one is new news
	r.expect(2*time.Second, got, ReasonEnd)
	if got[0].Protocol != source.ProtoTCP || got[0].Stats.OctetTotalCount != 500 || !got[0].EndTime.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("gone record %+v", got[0])
	}
}

func TestDeltasClampAtZero(t *testing.T) {
	r := newRun(t, Options[string]{ActiveTimeout: time.Second, IdleTimeout: time.Minute})
	c := tcp(1, "10.0.1.2:40000", "10.0.2.3:80", 100, 10000, 50, 5000, source.TCPEstablished)
	r.poll(0, c)
	r.expect(time.Second, r.poll(time.Second, c), ReasonActive)
	c.Packets, c.Bytes, c.ReverseBytes = 10, 100, 6000 // someone zeroed the counters (conntrack -Z)
	got := r.poll(2*time.Second, c)
	r.expect(2*time.Second, got, ReasonActive)
	if got[0].Stats.OctetDeltaCount != 0 || got[0].Stats.PacketDeltaCount != 0 || got[0].ReverseStats.OctetDeltaCount != 1000 {
		t.Fatalf("deltas %+v %+v, want clamped to 0 and 1000", got[0].Stats, got[0].ReverseStats)
	}
	c.Bytes = 400
	got = r.poll(3*time.Second, c)
	if got[0].Stats.OctetDeltaCount != 300 {
		t.Fatalf("delta after the reset %d, want 300", got[0].Stats.OctetDeltaCount)
	}
}

func TestKeyUsesReplyTupleForServices(t *testing.T) {
	r := newRun(t, Options[string]{ActiveTimeout: time.Second})
	// Client dials ClusterIP 10.96.0.10:80; the endpoint 10.0.2.3:8080 answers.
	c := source.Conn{ID: 3, Proto: source.ProtoTCP, OrigSrc: ap("10.0.1.2:40000"), OrigDst: ap("10.96.0.10:80"),
		ReplySrc: ap("10.0.2.3:8080"), ReplyDst: ap("10.0.1.2:40000"), Packets: 3, Bytes: 180, TCPState: source.TCPEstablished}
	r.poll(0, c)
	got := r.poll(time.Second, c)
	r.expect(time.Second, got, ReasonActive)
	f := got[0]
	if f.DestinationIP != netip.MustParseAddr("10.0.2.3") || f.DestinationPort != 8080 {
		t.Fatalf("destination %v:%d, want the endpoint 10.0.2.3:8080", f.DestinationIP, f.DestinationPort)
	}
	// SNAT (proxySnat*) is the connection's metadata: podmeta's tests.
}

func TestNewEntryOnSameTupleEndsTheOld(t *testing.T) {
	r := newRun(t, Options[string]{})
	c := tcp(1, "10.0.1.2:40000", "10.0.2.3:80", 5, 500, 4, 300, source.TCPEstablished)
	r.poll(0, c)
	n := tcp(2, "10.0.1.2:40000", "10.0.2.3:80", 1, 60, 0, 0, source.TCPSynSent)
	got := r.poll(time.Second, n)
	r.expect(time.Second, got, ReasonEnd)
	if got[0].Stats.OctetTotalCount != 500 {
		t.Fatalf("the old connection's end record carries %d octets, want 500", got[0].Stats.OctetTotalCount)
	}
	n.TCPState, n.Bytes = source.TCPEstablished, 120
	got = r.poll(6*time.Second, n)
	r.expect(6*time.Second, got, ReasonActive)
	if got[0].Stats.OctetDeltaCount != 120 || !got[0].StartTime.Equal(t0.Add(time.Second)) {
		t.Fatalf("the new connection's record %+v", got[0])
	}
}

// TestSameTupleTwiceInOneDump: a dump that lists one tuple twice (two
// conntrack entries, in different zones, say) keeps the first: the second
// neither ends it nor is tracked. Taking the second for a new connection
// made each end the other on every poll, with END_OF_FLOW records of live
// connections; two entries seen first in the same poll even gave two
// identical records (no counts, started and ended at that poll).
func TestSameTupleTwiceInOneDump(t *testing.T) {
	r := newRun(t, Options[string]{ActiveTimeout: 2 * time.Second, IdleTimeout: 2 * time.Second})
	a := tcp(1, "10.0.1.2:40000", "10.0.2.3:80", 0, 0, 0, 0, source.TCPEstablished)
	b := tcp(2, "10.0.1.2:40000", "10.0.2.3:80", 0, 0, 0, 0, source.TCPEstablished)
	var all []flow.Flow
	for i := range 6 {
		at := time.Duration(i) * time.Second
		a.Packets, a.Bytes = uint64(10*i), uint64(1000*i)
		b.Packets, b.Bytes = uint64(3*i), uint64(300*i)
		all = append(all, r.poll(at, a, b)...)
	}
	// The first entry's: active records at 2 s and 4 s.
	r.expect(5*time.Second, all, ReasonActive, ReasonActive)
	for _, f := range all {
		if f.Stats.OctetTotalCount != f.Stats.PacketTotalCount*100 {
			t.Errorf("a record of the second entry: %+v", f.Stats)
		}
	}
	// The first ends and leaves: its end record, then the second is
	// taken up as a new connection.
	r.expect(6*time.Second, r.poll(6*time.Second, b), ReasonEnd)
	got := r.poll(8*time.Second, b)
	r.expect(8*time.Second, got, ReasonActive)
	if got[0].Stats.OctetDeltaCount != 1500 || !got[0].StartTime.Equal(t0.Add(6*time.Second)) {
		t.Errorf("the second entry's first record %+v (start %v)", got[0].Stats, got[0].StartTime)
	}
}

func TestCapKeepFilterAndMetadata(t *testing.T) {
	described := 0
	r := newRun(t, Options[string]{MaxConnections: 2, ActiveTimeout: time.Second,
		Keep: func(c *source.Conn) bool { return c.OrigSrc.Addr().Is4() },
		Describe: func(c *source.Conn, start time.Time) (string, bool) {
			described++
			if !start.Equal(t0.Add(-time.Minute)) {
				t.Errorf("Describe got start %v", start)
			}
			return "pod-for-" + c.OrigSrc.Addr().String(), false
		},
		Fill: func(r *record.Record, m *string) { r.Meta = &record.Meta{SrcPod: &enrich.Pod{Name: *m}} },
	})
	var conns []source.Conn
	for i := range 4 {
		c := tcp(uint32(i+1), "10.0.1."+string(rune('2'+i))+":40000", "10.0.2.3:80", 1, 60, 0, 0, source.TCPEstablished)
		c.Start = t0.Add(-time.Minute)
		conns = append(conns, c)
	}
	v6 := source.Conn{ID: 9, Proto: source.ProtoTCP, OrigSrc: ap("[fd00::2]:1"), ReplySrc: ap("[fd00::3]:2")}
	conns = append(conns, v6)
	r.poll(0, conns...)
	st := r.s.Stats()
	if st.Connections != 2 || st.Dropped != 2 || st.Seen != 4 {
		t.Fatalf("stats %+v, want 2 held, 2 dropped, 4 seen (IPv6 filtered out)", st)
	}
	got := r.poll(time.Second, conns...)
	r.expect(time.Second, got, ReasonActive, ReasonActive)
	if described != 2 {
		t.Fatalf("Describe called %d times, want once per tracked connection", described)
	}
	for _, f := range got {
		if f.SourcePodName != "pod-for-"+f.SourceIP.String() || !f.StartTime.Equal(t0.Add(-time.Minute)) {
			t.Fatalf("record %+v", f)
		}
	}
	if st := r.s.Stats(); st.Dropped != 4 {
		t.Fatalf("Dropped %d after a second full poll, want 4", st.Dropped)
	}
}

func TestBadOptions(t *testing.T) {
	if _, err := New(Options[int]{ActiveTimeout: -1}); err == nil {
		t.Fatal("a negative timeout was accepted")
	}
}

// TestEmitInRuns checks that Emit gets the records of an Update in runs
// of EmitEvery while it goes on, then the rest, that what it drops is not
// returned, and that the order is the one Update returns.
func TestEmitInRuns(t *testing.T) {
	var runs []int
	var emitted []uint16
	s, err := New(Options[string]{ActiveTimeout: time.Second, EmitEvery: 3,
		Emit: func(recs []record.Record) []record.Record {
			runs = append(runs, len(recs))
			kept := recs[:0]
			for _, r := range recs {
				emitted = append(emitted, r.SrcPort)
				if r.SrcPort%2 == 0 { // drop the odd ports
					kept = append(kept, r)
				}
			}
			return kept
		}})
	if err != nil {
		t.Fatal(err)
	}
	var conns []source.Conn
	for i := range 8 {
		conns = append(conns, tcp(uint32(i+1), fmt.Sprintf("10.0.1.2:%d", 40000+i), "10.0.2.3:80", 1, 60, 0, 0, source.TCPEstablished))
	}
	if out := s.Update(t0, conns, nil); len(out) != 0 || len(runs) != 0 {
		t.Fatalf("first sight: %d records, runs %v", len(out), runs)
	}
	for i := range conns {
		conns[i].Packets++
	}
	out := s.Update(t0.Add(time.Second), conns, nil)
	if !slices.Equal(runs, []int{3, 3, 2}) {
		t.Fatalf("runs %v, want [3 3 2]", runs)
	}
	var got []uint16
	for _, r := range out {
		got = append(got, r.SrcPort)
	}
	if !slices.Equal(got, []uint16{40000, 40002, 40004, 40006}) || len(emitted) != 8 {
		t.Fatalf("kept %v of emitted %v", got, emitted)
	}
}

// TestEntrySize keeps an entry at 152 octets and its metadata (24 octets
// in the exporter): the store walks every entry on every poll.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(entry[[3]uint64]{}); n > 176 {
		t.Errorf("an entry is %d octets", n)
	}
}

// TestUpdateEmitAsUpdate runs the same snapshots through Update and
// through UpdateEmit, whose Buffer gives runs shorter than EmitEvery,
// and checks both make the same records in the same order, each handed
// to Emit once.
func TestUpdateEmitAsUpdate(t *testing.T) {
	var emitted []record.Record
	var bufs int
	direct, err := New(Options[string]{EmitEvery: 5,
		Buffer: func(n int) []record.Record {
			bufs++
			return make([]record.Record, min(n, 1+bufs%4)) // 2, 3, 4, 1, ... records
		},
		Emit: func(recs []record.Record) []record.Record {
			emitted = append(emitted, recs...)
			return recs
		}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := New(Options[string]{EmitEvery: 5})
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]source.Conn, 40)
	for i := range conns {
		conns[i] = tcp(uint32(i+1), fmt.Sprintf("10.0.1.%d:40000", i), "10.0.2.3:80", 1, 100, 1, 100, source.TCPEstablished)
	}
	var out []record.Record
	for step := range 6 {
		at := t0.Add(time.Duration(step) * 6 * time.Second)
		for i := range conns {
			if i%(step+2) == 0 {
				conns[i].Packets++
			}
		}
		if step == 3 {
			conns = conns[5:] // gone: END_OF_FLOW
		}
		emitted = emitted[:0]
		direct.UpdateEmit(at, conns)
		out = batch.Update(at, conns, out[:0])
		if step > 0 && len(out) == 0 {
			t.Fatalf("step %d: no records", step)
		}
		if !slices.Equal(emitted, out) {
			t.Fatalf("step %d: UpdateEmit made %d records, Update %d, or others", step, len(emitted), len(out))
		}
	}
}

// TestUpdateEmitOverwritesOldRecords: export does not clear a slot
// before writing it, so every field of a record must be written. Buffer
// gives slots holding an old record with every field set; the records
// made must be Update's, field for field.
func TestUpdateEmitOverwritesOldRecords(t *testing.T) {
	old := record.Record{Start: 1, End: 2, Counts: [8]uint64{1, 2, 3, 4, 5, 6, 7, 8},
		Src: record.AddrFrom(netip.MustParseAddr("fd00::9")), Dst: record.AddrFrom(netip.MustParseAddr("fd00::8")),
		SrcPort: 9, DstPort: 9, Proto: 99, EndReason: 9, TCPState: 9, FlowType: 9, Attr: 9,
		Meta: &record.Meta{Node: "old"}, Verdict: &attribution.Verdict{EgressName: "old"}}
	v := reflect.ValueOf(old)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("the old record leaves %s zero: set it", v.Type().Field(i).Name)
		}
	}
	var emitted []record.Record
	direct, err := New(Options[string]{ActiveTimeout: time.Second,
		Buffer: func(n int) []record.Record {
			b := make([]record.Record, min(n, 3))
			for i := range b {
				b[i] = old
			}
			return b
		},
		Emit: func(recs []record.Record) []record.Record {
			emitted = append(emitted, recs...)
			return recs
		}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := New(Options[string]{ActiveTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	conns := []source.Conn{
		tcp(1, "10.0.1.2:40000", "10.0.2.3:80", 1, 100, 0, 0, source.TCPEstablished),
		tcp(2, "[fd00::2]:40000", "[fd00::3]:80", 1, 100, 1, 60, source.TCPEstablished),
		{ID: 3, Proto: source.ProtoUDP, OrigSrc: ap("10.0.1.2:5353"), ReplySrc: ap("10.0.2.9:53"), Packets: 1, Bytes: 60},
		tcp(4, "10.0.1.4:40000", "[::ffff:10.0.2.3]:80", 5, 500, 4, 300, source.TCPEstablished),
	}
	var out []record.Record
	for step := range 3 {
		at := t0.Add(time.Duration(step) * time.Second)
		for i := range conns {
			conns[i].Packets++
		}
		emitted = emitted[:0]
		direct.UpdateEmit(at, conns)
		out = batch.Update(at, conns, out[:0])
		if step > 0 && len(out) != len(conns) {
			t.Fatalf("step %d: %d records", step, len(out))
		}
		if !slices.Equal(emitted, out) {
			t.Fatalf("step %d: over old records\n%+v\nwant\n%+v", step, emitted, out)
		}
	}
}

// TestGoneWhileAnotherArrives: the store looks for gone entries only
// when the snapshot saw fewer than it holds; a connection that leaves in
// the poll another arrives in must still end.
func TestGoneWhileAnotherArrives(t *testing.T) {
	r := newRun(t, Options[string]{})
	a := tcp(1, "10.0.1.2:40000", "10.0.2.3:80", 5, 500, 4, 300, source.TCPEstablished)
	b := tcp(2, "10.0.1.2:40001", "10.0.2.3:80", 5, 500, 4, 300, source.TCPEstablished)
	c := tcp(3, "10.0.1.2:40002", "10.0.2.3:80", 5, 500, 4, 300, source.TCPEstablished)
	r.expect(0, r.poll(0, a, b))
	got := r.poll(time.Second, a, c, c) // b gone, c new (listed twice)
	r.expect(time.Second, got, ReasonEnd)
	if got[0].SourcePort != 40001 || !got[0].EndTime.Equal(t0.Add(time.Second)) {
		t.Fatalf("end record %+v, want b's at 1 s", got[0])
	}
	if st := r.s.Stats(); st.Connections != 2 || st.Seen != 3 {
		t.Fatalf("stats %+v, want 2 held, 3 seen", st)
	}
	// Nothing gone: the next poll exports nothing and forgets nothing.
	r.expect(2*time.Second, r.poll(2*time.Second, c, a))
	if st := r.s.Stats(); st.Connections != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRedescribe: metadata Describe says is pending is completed by
// Redescribe at each later poll that sees the connection open, before
// its record, until Redescribe says it is done; other connections, and a
// connection's tombstone, are never redescribed.
func TestRedescribe(t *testing.T) {
	type call struct {
		port       uint16
		start, now time.Duration
	}
	var calls []call
	r := newRun(t, Options[string]{ActiveTimeout: time.Second,
		Describe: func(c *source.Conn, start time.Time) (string, bool) {
			return "unknown", c.OrigSrc.Port() != 1
		},
		Redescribe: func(c *source.Conn, start, now time.Time, m *string) bool {
			calls = append(calls, call{c.OrigSrc.Port(), start.Sub(t0), now.Sub(t0)})
			if now.Sub(t0) >= 2*time.Second {
				*m = "named"
				return false
			}
			return true
		},
		Fill: func(r *record.Record, m *string) { r.Meta = &record.Meta{SrcPod: &enrich.Pod{Name: *m}} },
	})
	named := tcp(1, "10.0.1.2:1", "10.0.2.3:80", 1, 60, 0, 0, source.TCPEstablished)
	pending := tcp(2, "10.0.1.2:2", "10.0.2.3:80", 1, 60, 0, 0, source.TCPEstablished)
	pending.Start = t0.Add(-time.Second)
	over := tcp(3, "10.0.1.2:3", "10.0.2.3:80", 1, 60, 0, 0, source.TCPTimeWait)
	r.poll(0, named, pending, over)
	if len(calls) != 0 {
		t.Fatalf("Redescribe at first sight: %+v", calls)
	}
	for _, at := range []time.Duration{time.Second, 2 * time.Second, 3 * time.Second} {
		named.Packets++
		pending.Packets++
		for _, f := range r.poll(at, named, pending, over) {
			if want := map[bool]string{true: "named", false: "unknown"}[f.SourcePort == 2 && at >= 2*time.Second]; f.SourcePodName != want {
				t.Errorf("at %v, port %d: %q, want %q", at, f.SourcePort, f.SourcePodName, want)
			}
		}
	}
	want := []call{{2, -time.Second, time.Second}, {2, -time.Second, 2 * time.Second}}
	if !slices.Equal(calls, want) {
		t.Errorf("calls %+v, want %+v", calls, want)
	}
}
