package bigmem

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

type rec struct {
	a, b uint64
	c    [3]uint32
}

func TestSmallArraysStayOnTheHeap(t *testing.T) {
	var o Owner
	s := Make[rec](&o, 100)
	if len(s) != 100 || o.Mapped() != 0 {
		t.Fatalf("len %d, mapped %d", len(s), o.Mapped())
	}
	Free(&o, s) // not mapped: nothing to do
	if Make[rec](&o, 0) != nil {
		t.Fatal("Make of 0 values is not nil")
	}
}

func TestMappedArray(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("maps only on Linux")
	}
	var o Owner
	const n = 200_000 // 5.6 MB: three huge pages
	s := makeIn[rec](&o, n, true)
	if len(s) != n {
		t.Fatalf("len %d", len(s))
	}
	want := (uintptr(n)*unsafe.Sizeof(rec{}) + HugePage - 1) &^ (HugePage - 1)
	if o.Mapped() != int(want) || o.Failed() != 0 {
		t.Fatalf("mapped %d bytes (failed %d), want %d", o.Mapped(), o.Failed(), want)
	}
	if p := uintptr(unsafe.Pointer(&s[0])); p%HugePage != 0 {
		t.Fatalf("array at %#x, not on a huge-page boundary", p)
	}
	for i := range s {
		if s[i] != (rec{}) {
			t.Fatalf("value %d not zero", i)
		}
		s[i].a, s[i].c[2] = uint64(i), uint32(i)
	}
	for i := range s {
		if s[i].a != uint64(i) || s[i].c[2] != uint32(i) {
			t.Fatalf("value %d reads back %+v", i, s[i])
		}
	}
	if r, err := o.Resident(); err != nil || r < n*int(unsafe.Sizeof(rec{})) || r > int(want) {
		t.Fatalf("resident %d bytes (%v) after writing all %d", r, err, n*int(unsafe.Sizeof(rec{})))
	}
	u := makeIn[uint64](&o, 1<<20, true)
	if r, err := o.Resident(); err != nil || r > int(want)+HugePage {
		t.Fatalf("resident %d bytes (%v) with a second array unwritten", r, err)
	}
	if o.Mapped() != int(want)+8<<20 {
		t.Fatalf("two arrays: %d bytes mapped", o.Mapped())
	}
	Free(&o, s)
	if o.Mapped() != 8<<20 || len(o.regions) != 1 {
		t.Fatalf("after Free: %d bytes in %d regions", o.Mapped(), len(o.regions))
	}
	u[len(u)-1] = 1 // the other array is still there
	o.FreeAll()
	if o.Mapped() != 0 || len(o.regions) != 0 {
		t.Fatalf("after FreeAll: %d bytes in %d regions", o.Mapped(), len(o.regions))
	}
}

// The advice works: written memory is backed by huge pages where the
// kernel offers them on request.
func TestMappedArrayGetsHugePages(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || !(strings.Contains(string(mode), "[madvise]") || strings.Contains(string(mode), "[always]")) {
		t.Skipf("transparent huge pages are not offered on request here (%q, %v)", strings.TrimSpace(string(mode)), err)
	}
	var o Owner
	defer o.FreeAll()
	s := makeIn[byte](&o, 8<<20, true)
	for i := 0; i < len(s); i += 4096 {
		s[i] = 1
	}
	if r, err := o.Resident(); err != nil || r != 8<<20 {
		t.Fatalf("resident %d bytes (%v), want %d", r, err, 8<<20)
	}
	kb, err := anonHugeKB(uintptr(unsafe.Pointer(&s[0])))
	if err != nil {
		t.Fatal(err)
	}
	if kb == 0 {
		t.Fatalf("8 MiB written, none of it in huge pages")
	}
	t.Logf("%d KiB of 8192 in huge pages", kb)
}

// anonHugeKB is the AnonHugePages of the mapping that starts at addr, from
// /proc/self/smaps.
func anonHugeKB(addr uintptr) (int, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if lo, _, ok := strings.Cut(strings.Fields(line)[0], "-"); ok && !strings.HasSuffix(line, ":") && strings.Contains(line, "-") {
			if v, err := strconv.ParseUint(lo, 16, 64); err == nil {
				in = uintptr(v) == addr
				continue
			}
		}
		if in && strings.HasPrefix(line, "AnonHugePages:") {
			return strconv.Atoi(strings.Fields(line)[1])
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no mapping at %#x in /proc/self/smaps", addr)
}

func TestPointersRejected(t *testing.T) {
	for name, mk := range map[string]func(){
		"pointer": func() { Make[*int](&Owner{}, 1) },
		"string": func() {
			Make[struct {
				a int
				s string
			}](&Owner{}, 1)
		},
		"slice": func() { Make[[2][]byte](&Owner{}, 1) },
		"map":   func() { Make[map[int]int](&Owner{}, 1) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Make did not panic", name)
				}
			}()
			mk()
		}()
	}
	Make[struct {
		a [4]uint64
		b [0]*int
	}](&Owner{}, 1) // an empty array of pointers holds none
}

// TestMappingRefused: when the kernel refuses a mapping, the array comes
// from the heap, usable, and is counted as Failed (which the aggregator
// reports as a metric), not as Mapped.
func TestMappingRefused(t *testing.T) {
	o := Owner{mapFn: func(uintptr) (unsafe.Pointer, uintptr, error) { return nil, 0, errors.New("refused") }}
	s := makeIn[uint64](&o, 1<<20, true)
	if len(s) != 1<<20 || o.Failed() != 1 || o.Mapped() != 0 || len(o.regions) != 0 {
		t.Fatalf("len %d, failed %d, mapped %d in %d regions; want 1<<20, 1, 0, 0", len(s), o.Failed(), o.Mapped(), len(o.regions))
	}
	s[len(s)-1] = 7
	Free(&o, s) // from the heap: nothing to unmap
	if s := makeIn[uint64](&o, 1<<10, true); len(s) != 1<<10 || o.Failed() != 1 {
		t.Fatalf("a small array counted as a failed mapping: failed %d", o.Failed())
	}
}
