package aggregator

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/config"
	"sluice/flow"
	"sluice/ring"
)

// TestDrainStopsASinkThatHoldsBackTheFlushUnreleased: a sink that read
// (nearly) everything but still holds records it could not send (the IPFIX
// sink's pending records when its collector went away mid-batch: it
// releases all but those) holds back the final flush, since a flush waits
// for releases, not reads. The drain must see it as behind and stop it, so
// that the flush goes on and the sink that keeps up gets every record;
// judged by what it has not read, it looks up to date, is left running,
// and the other sink is stopped with the flush unfinished.
func TestDrainStopsASinkThatHoldsBackTheFlushUnreleased(t *testing.T) {
	const capacity, total, hold = 8, 100, 4
	buf := ring.New[*flow.Flow](capacity)
	buf.Flushing()        // as at shutdown: every Produce waits for the sinks
	var logs bytes.Buffer // written by drain, on this goroutine
	a := &Aggregator{cfg: &config.Aggregator{}, log: slog.New(slog.NewTextHandler(&logs, nil)), buf: buf,
		sinks: []namedSink{{key: "held"}, {key: "keepsUp"}}}
	timeout := 300 * time.Millisecond
	a.cfg.Sluice.DrainTimeout.Duration = timeout

	var stages sync.WaitGroup
	// The IPFIX sink's pattern (ipfixout.run): read, send what it can,
	// release all but what waits for the collector; then wait for a
	// collector that does not come back until stopped.
	held := buf.Consumer()
	heldCtx, stopHeld := context.WithCancel(context.Background())
	heldDone := make(chan struct{})
	stages.Go(func() {
		defer close(heldDone)
		defer held.Close()
		var batch []*flow.Flow
		read := 0
		for read < 2*capacity {
			var ok bool
			batch, ok = held.Next(heldCtx, batch[:0], capacity)
			if !ok {
				return
			}
			read += len(batch)
			if read < 2*capacity {
				held.Release(0)
			}
		}
		held.Release(min(hold, len(batch)))
		<-heldCtx.Done()
	})
	keeps := buf.Consumer()
	keepsCtx, stopKeeps := context.WithCancel(context.Background())
	keepsDone := make(chan struct{})
	got, stopped := 0, false
	stages.Go(func() {
		defer close(keepsDone)
		defer keeps.Close()
		var batch []*flow.Flow
		for {
			var ok bool
			batch, ok = keeps.Next(keepsCtx, batch[:0], capacity)
			got += len(batch)
			keeps.Release(0)
			if !ok {
				// Stopped by the drain, rather than at the end of the
				// buffer with everything read.
				stopped = keepsCtx.Err() != nil
				return
			}
		}
	})
	modeDone := make(chan struct{})
	stages.Go(func() {
		defer close(modeDone)
		for range total {
			buf.Produce(&flow.Flow{})
		}
		buf.Close()
	})
	running := []runningSink{
		{stop: stopHeld, unread: held.Unread, behind: held.Behind, done: heldDone},
		{stop: stopKeeps, unread: keeps.Unread, behind: keeps.Behind, done: keepsDone},
	}
	a.drain(&stages, modeDone, running)
	if !strings.Contains(logs.String(), "sink=held ") || !strings.Contains(logs.String(), "held back the final flush") {
		t.Errorf("the drain did not stop the sink holding back the flush; it logged:\n%s", logs.String())
	}
	if stopped || got != total {
		t.Errorf("the sink that keeps up got %d of %d records (stopped by the drain: %v): the drain did not stop the sink holding back the flush",
			got, total, stopped)
	}
}
