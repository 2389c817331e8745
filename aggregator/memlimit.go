package aggregator

import (
	"context"
	"log/slog"
	"math"
	"runtime/debug"
	"time"
)

// memoryLimitInterval is how often keepMemoryLimit looks at the table:
// often enough that a new slab page (22 MiB) or a doubled index is
// accounted for before much more is allocated.
const memoryLimitInterval = 100 * time.Millisecond

// keepMemoryLimit keeps Go's soft memory limit (GOMEMLIMIT, as a Deployment
// sets it from its container's limit) a bound on the whole process, while
// Aggregate mode's flow table lives outside the Go heap, where the runtime
// does not count it: every interval the limit becomes the one the process
// started with less the table's size (table), never less than an eighth
// of it. The limit is restored when ctx ends (the aggregator's Run
// returns). Without a limit it does nothing.
//
// The limit is the process's: one aggregator per process sets it, and
// nothing else in Sluice does.
func keepMemoryLimit(ctx context.Context, log *slog.Logger, table func() int64, interval time.Duration) {
	base := debug.SetMemoryLimit(-1)
	if base == math.MaxInt64 {
		return
	}
	defer debug.SetMemoryLimit(base)
	t := time.NewTicker(interval)
	defer t.Stop()
	set := base
	for {
		if want := max(base-table(), base/8); want != set {
			debug.SetMemoryLimit(want)
			if want == base/8 && set != base/8 {
				log.Warn("the flow table takes most of GOMEMLIMIT: the Go heap is left an eighth of it",
					"gomemlimit_bytes", base, "table_bytes", table())
			}
			set = want
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
