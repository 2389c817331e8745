// Package testkit holds what the project's tests share and needs nothing
// of the project itself, so that any package's tests can import it: waiting
// for a condition, a log buffer. Its sub-packages stubcollector (a stub
// IPFIX collector) and testagg (an aggregator in-process on free loopback
// ports) build on the project. Imported only by tests.
package testkit

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// WaitTimeout is how long WaitFor waits. Generous, because the suite must
// pass on a machine busy with other work.
const WaitTimeout = 30 * time.Second

// WaitFor polls cond until it holds, and fails the test when it still does
// not after WaitTimeout. Tests use it instead of reading a counter or a
// state right after the operation that should change it returns.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s", WaitTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// LogBuffer is a bytes.Buffer safe for a logger and a test to share.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
