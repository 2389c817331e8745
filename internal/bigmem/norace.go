//go:build !race

package bigmem

const heapOnly = false
