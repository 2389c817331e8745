//go:build race

package bigmem

// heapOnly: the race detector checks only memory the Go runtime allocated.
const heapOnly = true
