//go:build linux && !race

package aggregate

// pageShift: the slab's pages are mapped in huge pages (see package
// bigmem); 65,536 entries of 352 bytes are 22 MiB, exactly 11 huge pages,
// so a page wastes none of its last huge page.
const pageShift = 16
