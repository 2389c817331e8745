// Package testkit holds what the project's tests share: waiting for a
// condition, a stub IPFIX collector, and an aggregator running in-process
// on free loopback ports. It is imported only by tests.
package testkit

import (
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
