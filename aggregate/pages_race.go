//go:build race

package aggregate

// Under the race detector the slab's pages come from the Go heap (see
// package bigmem): small, so that a test's Store holds little.
const pageShift = 9
