package bigmem

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapHuge maps size bytes (rounded up to HugePage) of zeroed private
// memory aligned to HugePage and advises huge pages for it. Nothing is
// committed until it is written.
func mapHuge(size uintptr) (unsafe.Pointer, uintptr, error) {
	size = (size + HugePage - 1) &^ (HugePage - 1)
	// Over-map by one huge page and trim, so that the region starts on a
	// huge-page boundary: only aligned 2 MiB ranges can be huge pages.
	// MAP_NORESERVE: the mapping reserves address space, not memory (it is
	// committed as it is written).
	p, err := unix.MmapPtr(-1, 0, nil, size+HugePage, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, 0, fmt.Errorf("bigmem: mmap %d bytes: %w", size+HugePage, err)
	}
	start := uintptr(p)
	aligned := (start + HugePage - 1) &^ (HugePage - 1)
	if head := aligned - start; head > 0 {
		_ = unix.MunmapPtr(p, head)
	}
	if tail := start + size + HugePage - (aligned + size); tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(p, aligned-start+size), tail)
	}
	base := unsafe.Add(p, aligned-start)
	// Without transparent huge pages (or with them off) the advice fails or
	// is ignored, and the memory is ordinary: still correct.
	_ = unix.Madvise(unsafe.Slice((*byte)(base), size), unix.MADV_HUGEPAGE)
	return base, size, nil
}

func unmap(r region) { _ = unix.MunmapPtr(r.base, r.size) }

// resident counts the bytes of r that are in memory, by mincore(2).
func resident(r region) (int, error) {
	page := uintptr(unix.Getpagesize())
	vec := make([]byte, (r.size+page-1)/page)
	// x/sys has no wrapper for mincore on Linux.
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(r.base), r.size, uintptr(unsafe.Pointer(unsafe.SliceData(vec)))); e != 0 {
		return 0, fmt.Errorf("bigmem: mincore: %w", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n * int(page), nil
}
