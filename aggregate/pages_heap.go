//go:build !linux || race

package aggregate

// pageShift: where the slab's pages come from the Go heap (the race
// detector, or no huge-page mappings), pages stay small, so that a Store
// with few flows holds little.
const pageShift = 9
