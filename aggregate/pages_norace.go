//go:build !race

package aggregate

// pageShift: 65,536 entries of 352 bytes are 22 MiB, exactly 11 huge
// pages, so a mapped page wastes none of its last huge page.
const pageShift = 16
