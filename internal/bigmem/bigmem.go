// Package bigmem makes large arrays of pointer-free values in anonymous
// memory outside the Go heap, asking the kernel to back them with
// transparent huge pages.
//
// Why: a table of a million flows is some 350 MB, and each new flow
// writes an entry at a new place in it. With 4 KiB pages nearly every such
// access misses the TLB (86,000 pages; the TLB holds a few thousand), and
// each miss is a page walk, two-dimensional in a VM; with 2 MiB pages the
// whole table is about 170 TLB entries, and there are 512 times fewer page
// faults (though the kernel's zeroing of new memory costs the same). The
// garbage collector does not scan pointer-free memory anyway, so keeping
// it off the heap loses nothing, and the table no longer inflates the heap
// goal.
//
// HugePage is the x86-64 and arm64 (4 KiB base pages) huge-page size; on a
// system with other sizes the alignment is merely larger than needed, or
// the advice has no effect: still correct.
//
// Under the race detector every array comes from the Go heap instead, so
// that accesses to it stay checked (the detector ignores memory it did not
// allocate). Elsewhere an array comes from the heap when it is smaller than
// a huge page, when the platform has no anonymous mappings, or when the
// mapping fails.
package bigmem

import (
	"fmt"
	"reflect"
	"sync/atomic"
	"unsafe"
)

// HugePage is the huge-page size arrays are aligned to and rounded up to.
const HugePage = 2 << 20

// Owner holds the mappings of the arrays made through it, until Free or
// FreeAll. The zero Owner is ready to use. An Owner is not safe for
// concurrent use, but for Mapped and Failed.
type Owner struct {
	regions []region
	mapped  atomic.Int64
	failed  atomic.Int64
	// mapFn replaces mapHuge in tests.
	mapFn func(size uintptr) (unsafe.Pointer, uintptr, error)
}

type region struct {
	base unsafe.Pointer
	size uintptr
}

// Make returns n zero values of T. T must hold no pointers (Make panics if
// it does): the garbage collector does not see into mapped memory. Slices
// and pointers into the result are valid until Free or FreeAll.
func Make[T any](o *Owner, n int) []T {
	if n == 0 {
		return nil
	}
	if n < 0 {
		panic("bigmem: negative length")
	}
	t := reflect.TypeFor[T]()
	if hasPointers(t) {
		panic(fmt.Sprintf("bigmem: %v holds pointers", t))
	}
	return makeIn[T](o, n, !heapOnly)
}

// makeIn is Make, with the choice of mapping made by the caller (tests
// map under the race detector too).
func makeIn[T any](o *Owner, n int, mapping bool) []T {
	elem := unsafe.Sizeof(*new(T))
	size := uintptr(n) * elem
	if !mapping || elem == 0 || size < HugePage || size/elem != uintptr(n) {
		return make([]T, n)
	}
	m := mapHuge
	if o.mapFn != nil {
		m = o.mapFn
	}
	p, rounded, err := m(size)
	if err != nil {
		// The kernel refused (vm.max_map_count, a strict overcommit
		// policy): the heap serves, correct but with small pages and
		// counted by the garbage collector.
		o.failed.Add(1)
		return make([]T, n)
	}
	o.regions = append(o.regions, region{p, rounded})
	o.mapped.Add(int64(rounded))
	return unsafe.Slice((*T)(p), n)
}

// Free returns the memory of s, which Make made through o, to the
// system. A slice from the heap is left to the garbage collector.
func Free[T any](o *Owner, s []T) {
	if len(s) == 0 {
		return
	}
	p := unsafe.Pointer(unsafe.SliceData(s))
	for i, r := range o.regions {
		if r.base == p {
			unmap(r)
			o.mapped.Add(-int64(r.size))
			o.regions = append(o.regions[:i], o.regions[i+1:]...)
			return
		}
	}
}

// FreeAll returns every mapping of o to the system. Nothing made through
// o may be used after it.
func (o *Owner) FreeAll() {
	for _, r := range o.regions {
		unmap(r)
	}
	o.regions = nil
	o.mapped.Store(0)
}

// Mapped is the address space held outside the heap, in bytes. Memory is
// committed as it is first written, a huge page at a time. It is safe to
// call from any goroutine.
func (o *Owner) Mapped() int { return int(o.mapped.Load()) }

// Resident is how much of the mapped address space is in memory, in
// bytes: what the arrays cost, as against Mapped.
func (o *Owner) Resident() (int, error) {
	n := 0
	for _, r := range o.regions {
		b, err := resident(r)
		if err != nil {
			return 0, err
		}
		n += b
	}
	return n, nil
}

// Failed counts the arrays that were to be mapped and came from the heap
// because the mapping failed. It is safe to call from any goroutine.
func (o *Owner) Failed() int { return int(o.failed.Load()) }

// hasPointers reports whether values of t hold pointers the garbage
// collector would have to see.
func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
		return false
	case reflect.Pointer, reflect.UnsafePointer, reflect.Map, reflect.Slice, reflect.String,
		reflect.Interface, reflect.Chan, reflect.Func:
		return true
	default:
		return false
	}
}
