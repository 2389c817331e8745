//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package certs

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockDir takes an exclusive flock(2) on path, creating it if needed, and
// returns the function that releases it. flock locks belong to an open
// file description, so two calls in one process exclude each other just as
// two processes do, and a crashed holder's lock goes away with it. The
// file itself is left in place: removing it would let a waiter lock an
// unlinked file while a newcomer locks a new one.
func lockDir(path string, timeout time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock file: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("%s still held after %v", path, timeout)
		}
		time.Sleep(lockPoll)
	}
}
