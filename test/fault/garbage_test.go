package fault

import (
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sluice/internal/testkit"
)

// metric reads a counter of the aggregator's /metrics (the sum over the
// series whose line matches re's first group being the value).
func metric(t *testing.T, api string, re *regexp.Regexp) int {
	t.Helper()
	resp, err := http.Get("http://" + api + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += int(v)
	}
	return sum
}

// TestGarbageFlood is scenario 4: peers send random and truncated IPFIX
// as fast as they can while a well-behaved exporter sends at a steady
// rate. The good exporter loses nothing; every bad session is closed and
// counted.
func TestGarbageFlood(t *testing.T) {
	p := newPipeline(t, "tcp", "5s")
	agg := p.startAggregator()
	good := p.startExporter("node-1", "tcp", 300)

	ctx, stop := context.WithCancel(context.Background())
	var sessions, bytesSent atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			buf := make([]byte, 4096)
			for ctx.Err() == nil {
				c, err := net.Dial("tcp", p.ipfix)
				if err != nil {
					continue
				}
				sessions.Add(1)
				n := 16 + rng.IntN(len(buf)-16)
				for i := range buf[:n] {
					buf[i] = byte(rng.Uint32())
				}
				if w%2 == 0 {
					// A plausible IPFIX header whose length promises more
					// than follows (truncated), or less than a header.
					binary.BigEndian.PutUint16(buf[0:], 10)
					binary.BigEndian.PutUint16(buf[2:], uint16(n+100+rng.IntN(1000)))
					if rng.IntN(2) == 0 {
						binary.BigEndian.PutUint16(buf[2:], uint16(rng.IntN(16)))
					}
				}
				_ = c.SetWriteDeadline(time.Now().Add(time.Second))
				if _, err := c.Write(buf[:n]); err == nil {
					bytesSent.Add(int64(n))
				}
				c.Close()
			}
		})
	}
	decodeErrors := regexp.MustCompile(`(?m)^sluice_collector_decode_errors_total\{[^}]*\} (\S+)$`)
	testkit.WaitFor(t, "1,000 bad sessions", func() bool { return sessions.Load() >= 1000 })
	testkit.WaitFor(t, "good records while the flood goes on", func() bool { return p.coll.Len() >= 3000 })
	stop()
	wg.Wait()
	// Each bad session is closed and counted: as malformed, truncated (it
	// ended inside a message) or refused. A session whose bytes never
	// reached the aggregator (a write that failed) has nothing to count,
	// hence the margin.
	refused := regexp.MustCompile(`(?m)^sluice_collector_sessions_refused_total\{[^}]*\} (\S+)$`)
	var errorsCounted int
	testkit.WaitFor(t, "the bad sessions counted", func() bool {
		errorsCounted = metric(t, p.api, decodeErrors) + metric(t, p.api, refused)
		return errorsCounted >= int(sessions.Load())*95/100
	})

	good.signal(t, syscall.SIGTERM)
	e := good.line("exporter stopped", nil)
	if e == nil {
		t.Fatal("the exporter did not log its totals")
	}
	produced := num(t, e, "records")
	lost := num(t, e, "dropped_buffer-full") + num(t, e, "dropped_encode-error") + num(t, e, "unsent")
	testkit.WaitFor(t, "every good record at the collector", func() bool { return p.coll.Len() >= produced })
	agg.signal(t, syscall.SIGTERM)
	t.Logf("%d bad sessions (%d bytes of garbage), %d decode errors counted; good exporter: %d produced, %d delivered, %d counted lost",
		sessions.Load(), bytesSent.Load(), errorsCounted, produced, p.coll.Len(), lost)
	if lost != 0 || p.coll.Len() != produced {
		t.Errorf("the good exporter produced %d, %d delivered, %d counted lost", produced, p.coll.Len(), lost)
	}
}
