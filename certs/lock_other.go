//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package certs

import "time"

// lockDir takes the lock with an exclusively created file where flock(2)
// is not available.
func lockDir(path string, timeout time.Duration) (unlock func(), err error) {
	return exclLock(path, timeout, exclStaleAfter)
}
