package aggregator

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sluice/internal/testkit"
)

// With a Go memory limit, the flow table's mapped bytes come off it as the
// table grows, never below an eighth of it, and the limit is restored at
// the end. (The limit is the process's: this test sets and restores it.)
func TestKeepMemoryLimit(t *testing.T) {
	const base = 1 << 30
	prev := debug.SetMemoryLimit(base)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	var table atomic.Int64
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		keepMemoryLimit(ctx, log, table.Load, time.Millisecond)
	}()
	limit := func() int64 { return debug.SetMemoryLimit(-1) }
	table.Store(300 << 20)
	testkit.WaitFor(t, "the limit less the table", func() bool { return limit() == base-300<<20 })
	table.Store(2 << 30)
	testkit.WaitFor(t, "the limit's floor", func() bool { return limit() == base/8 })
	mu.Lock()
	warned := strings.Contains(logs.String(), "takes most of GOMEMLIMIT")
	mu.Unlock()
	if !warned {
		t.Errorf("no warning at the floor; log: %s", logs.String())
	}
	table.Store(0)
	testkit.WaitFor(t, "the whole limit again", func() bool { return limit() == base })
	table.Store(22 << 20)
	testkit.WaitFor(t, "the limit less the table", func() bool { return limit() == base-22<<20 })
	stop()
	<-done
	if l := limit(); l != base {
		t.Errorf("limit %d after the end, want %d restored", l, base)
	}
}

// Without a limit there is nothing to keep.
func TestKeepMemoryLimitWithoutLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetMemoryLimit(prev) })
	called := false
	keepMemoryLimit(context.Background(), slog.New(slog.DiscardHandler), func() int64 { called = true; return 1 << 30 }, time.Millisecond)
	if called || debug.SetMemoryLimit(-1) != math.MaxInt64 {
		t.Errorf("without a limit: table read %v, limit %d", called, debug.SetMemoryLimit(-1))
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
