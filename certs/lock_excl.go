package certs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// lockPoll is how often a waiter retries a held lock.
const lockPoll = 20 * time.Millisecond

// exclStaleAfter is the age past which an exclusively created lock file is
// taken to be left over by a holder that died. Ensure holds the lock for
// well under a second.
const exclStaleAfter = 2 * time.Minute

// exclLock takes a lock by creating path with O_EXCL, waiting up to timeout
// while it exists, and removing it first when it is older than staleAfter.
// It is the fallback of lockDir for platforms without flock(2); unlike
// flock, a holder that dies leaves the lock held until it turns stale.
func exclLock(path string, timeout, staleAfter time.Duration) (unlock func(), err error) {
	deadline := time.Now().Add(timeout)
	for {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, _ = fmt.Fprintf(f, "pid %d\n", os.Getpid())
			_ = f.Close()
			return func() { _ = os.Remove(path) }, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("creating lock file: %w", err)
		}
		if fi, err := os.Stat(path); err == nil && time.Since(fi.ModTime()) > staleAfter {
			_ = os.Remove(path)
			continue
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s still held after %v", path, timeout)
		}
		time.Sleep(lockPoll)
	}
}
