package fault

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/internal/testkit"
	"sluice/internal/testkit/ipfixgen"
	"sluice/internal/testkit/stubcollector"
)

// collected waits until every connection to coll ended and was read to
// its end (its senders are gone), then counts from one snapshot the
// records received and the distinct ones among them. Counting distinct
// records while they still arrive and all of them later took what arrived
// in between for duplicates: TestAggregatorKilled reported up to 169
// "duplicates" over IPFIX that were late records.
func collected(t *testing.T, coll *stubcollector.Collector) (all, distinct int) {
	t.Helper()
	testkit.WaitFor(t, "the senders' connections to the collector to be read to their end", func() bool { return coll.Open() == 0 })
	fs := coll.FlowsSince(0)
	seen := make(map[recordKey]bool, len(fs))
	for i := range fs {
		seen[keyOf(&fs[i])] = true
	}
	return len(fs), len(seen)
}

// TestCollected: records that arrive after most are in still count as
// delivered, not as duplicates, and a record received twice counts once
// as a duplicate.
func TestCollected(t *testing.T) {
	coll := stubcollector.New(t)
	conn, err := net.Dial("tcp", coll.Addr())
	if err != nil {
		t.Fatal(err)
	}
	// Open counts a connection once its reading started.
	testkit.WaitFor(t, "the collector to read the connection", func() bool { return coll.Open() == 1 })
	now := time.Now().Truncate(time.Millisecond)
	fs := make([]flow.Flow, 140)
	for i := range fs {
		f := &fs[i]
		// One connection's successive records: the same 5-tuple, growing
		// counters.
		*f = flow.Flow{StartTime: now.Add(-time.Minute), EndTime: now.Add(time.Duration(i) * time.Second),
			SourceIP: netip.MustParseAddr("10.244.1.2"), DestinationIP: netip.MustParseAddr("10.244.1.3"),
			SourcePort: 40000, DestinationPort: 443, Protocol: 6, EndReason: 2}
		f.Stats.PacketTotalCount, f.Stats.OctetTotalCount = uint64(10*(i+1)), uint64(1000*(i+1))
	}
	first := ipfixgen.Messages(t, 1, fs[:100])
	// The last 40, and 10 of the first sent again.
	late := ipfixgen.Messages(t, 1, append(append([]flow.Flow(nil), fs[100:]...), fs[:10]...))
	sent := make(chan error, 1)
	go func() {
		// The sender goes on once the first records are in: collected,
		// already waiting, must not settle for them.
		defer conn.Close()
		if _, err := conn.Write(first); err != nil {
			sent <- err
			return
		}
		deadline := time.Now().Add(testkit.WaitTimeout)
		for coll.Len() < 100 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		_, err := conn.Write(late)
		sent <- err
	}()
	var r struct{ all, distinct int }
	r.all, r.distinct = collected(t, coll)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if r.all != 150 || r.distinct != 140 {
		t.Errorf("collected %d records, %d distinct (%d duplicates), want 150, 140 distinct (10 duplicates)", r.all, r.distinct, r.all-r.distinct)
	}
}
