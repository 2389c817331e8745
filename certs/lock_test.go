package certs

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// testLock checks mutual exclusion and timeout for one lock implementation.
func testLock(t *testing.T, lock func(path string, timeout time.Duration) (func(), error)) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lock(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock(path, 50*time.Millisecond); err == nil || !strings.Contains(err.Error(), "still held") {
		t.Fatalf("second lock: %v, want a timeout", err)
	}
	unlock()
	unlock2, err := lock(path, time.Second)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	unlock2()

	// Holders never overlap.
	var mu sync.Mutex
	inside, maxInside := 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				u, err := lock(path, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				maxInside = max(maxInside, inside)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				inside--
				mu.Unlock()
				u()
			}
		})
	}
	wg.Wait()
	if maxInside != 1 {
		t.Errorf("%d holders at once", maxInside)
	}
}

func TestLockDir(t *testing.T) { testLock(t, lockDir) }

func TestExclLock(t *testing.T) {
	testLock(t, func(path string, timeout time.Duration) (func(), error) {
		return exclLock(path, timeout, exclStaleAfter)
	})
}

func TestExclLockBreaksStaleLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	if err := os.WriteFile(path, []byte("pid 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	unlock, err := exclLock(path, 50*time.Millisecond, time.Minute)
	if err != nil {
		t.Fatalf("stale lock not broken: %v", err)
	}
	unlock()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("lock file left after release: %v", err)
	}
}
