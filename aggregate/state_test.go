package aggregate

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"sluice/flow"
	"sluice/internal/bigmem"
	"sluice/internal/testkit"
)

// The index against a map, with hashes drawn from a small range so that
// probe runs are long, wrap around, and removals shift them back.
func TestIndexAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var x index
	x.init(new(bigmem.Owner))
	want := map[uint32]uint32{} // slab index -> hash
	found := func(h, i uint32) bool {
		v := uint64(h)<<32 | uint64(i+1)
		for p := h & x.mask; x.slots[p] != 0; p = (p + 1) & x.mask {
			if x.slots[p] == v {
				return true
			}
		}
		return false
	}
	next := uint32(0)
	for step := range 100_000 {
		if len(want) > 1500 || len(want) > 0 && r.IntN(100) < 45 {
			for i, h := range want { // remove any one
				x.remove(h, i)
				delete(want, i)
				break
			}
		} else {
			// Hashes near the top of the range wrap around the table.
			h := uint32(r.IntN(64)) | uint32(r.IntN(2))<<31 | x.mask&^63
			x.insert(h, next)
			want[next] = h
			next++
		}
		if x.n != len(want) {
			t.Fatalf("step %d: n %d, want %d", step, x.n, len(want))
		}
		if step%997 == 0 {
			occupied := 0
			for _, v := range x.slots {
				if v != 0 {
					occupied++
				}
			}
			if occupied != len(want) {
				t.Fatalf("step %d: %d occupied slots, %d entries", step, occupied, len(want))
			}
			for i, h := range want {
				if !found(h, i) {
					t.Fatalf("step %d: entry %d (hash %#x) unreachable", step, i, h)
				}
			}
		}
	}
}

// Deadlines further out than the wheel has buckets wait for their round;
// ticks far apart visit every bucket once.
func TestWheelHorizonAndJumps(t *testing.T) {
	const active = 100_000 // seconds, more than the wheel's 65536 buckets
	s, k := testStore(Options{ActiveTimeout: active * time.Second, InactiveTimeout: 3 * active * time.Second})
	if n := len(s.wheel); n != 1<<16 {
		t.Fatalf("wheel of %d buckets", n)
	}
	rec := func(port uint16, end int) *flow.Flow {
		f := srcRec(0, end, counts{pkts: uint64(end)})
		f.FlowType = flow.FlowTypeIntraNode
		f.SourcePort = port
		return f
	}
	s.Add(at(1), rec(1, 1), k.emit)
	s.Tick(at(2), k.emit)
	one(t, k.take()) // first export; the next is due at 2+active
	s.Add(at(3), rec(1, 3), k.emit)
	last := 2
	for now := 2; now < 2+active; now += 997 {
		s.Tick(at(now), k.emit)
		none(t, k.take())
		last = now
	}
	// The ticks above passed the bucket of 2+active-65536 without
	// exporting; the first tick at or after the deadline does.
	s.Tick(at(last+997), k.emit)
	if f := one(t, k.take()); !f.EndTime.Equal(at(3)) {
		t.Errorf("end %v", f.EndTime)
	}

	// A jump far past everything: both timeouts due at once.
	s.Add(at(last+998), rec(2, last+998), k.emit)
	s.Tick(at(10*active), k.emit)
	if got := len(k.take()); got != 1 || s.Len() != 0 {
		t.Errorf("after a long pause: %d exported, %d flows left", got, s.Len())
	}
}

// Ticks more often than once a second, and a clock going backwards, do
// not export early or twice.
func TestTicksWithinASecond(t *testing.T) {
	s, k := testStore(Options{ActiveTimeout: 2 * time.Second})
	f := srcRec(0, 1, counts{pkts: 1})
	f.FlowType = flow.FlowTypeIntraNode
	now := at(1).Add(300 * time.Millisecond)
	s.Add(now, f, k.emit)
	s.Tick(at(1).Add(100*time.Millisecond), k.emit) // before the record
	none(t, k.take())
	s.Tick(now, k.emit)
	one(t, k.take())
	f = srcRec(0, 2, counts{pkts: 2})
	f.FlowType = flow.FlowTypeIntraNode
	s.Add(at(2), f, k.emit)
	for ms := 400; ms < 2300; ms += 100 { // next export at 3.3 s
		s.Tick(at(1).Add(time.Duration(ms)*time.Millisecond), k.emit)
		none(t, k.take())
	}
	s.Tick(at(1), k.emit) // backwards
	none(t, k.take())
	s.Tick(at(3).Add(300*time.Millisecond), k.emit)
	one(t, k.take())
}

// Interned values are shared and given back when no flow holds them.
func TestInternRefcount(t *testing.T) {
	var tab = newStrtab()
	a := tab.add("web-1")
	b := tab.add("web-1")
	c := tab.addBytes([]byte("0123456789abcdef"))
	if a != b || a == 0 || c == a || tab.live() != 2 {
		t.Fatalf("ids %d %d %d, %d live", a, b, c, tab.live())
	}
	tab.release(a)
	if tab.str(b) != "web-1" {
		t.Fatal("value freed while referenced")
	}
	tab.release(b)
	tab.release(c)
	if tab.live() != 0 {
		t.Fatalf("%d live after releasing all", tab.live())
	}
	// The cache must not hand out a freed or reused id.
	d := tab.add("other")
	e := tab.add("web-1")
	if tab.str(d) != "other" || tab.str(e) != "web-1" || d == e {
		t.Fatalf("reused ids: %d=%q %d=%q", d, tab.str(d), e, tab.str(e))
	}
	tab.release(d)
	tab.release(e)

	// The identity cache: the same string header freed, its id reused for
	// another value, then the header again.
	name := strings.Repeat("pod-", 3) // not a constant: its own octets
	x := tab.add(name)
	tab.release(x) // freed
	y := tab.add(strings.Repeat("svc-", 3))
	if y != x {
		t.Fatalf("id %d not reused (got %d): the test needs it", x, y)
	}
	if z := tab.add(name); z == y || tab.str(z) != name || tab.str(y) != "svc-svc-svc-" {
		t.Fatalf("identity cache handed out a reused id: %d=%q %d=%q", z, tab.str(z), y, tab.str(y))
	} else {
		tab.release(z)
	}
	tab.release(y)
	// Same data pointer, another length: another value, also when both
	// fall in the same slot.
	long := strings.Repeat("x", 1<<14) + "y"
	n := len(long) - 1
	for n > 0 && sameSlot(long[:n]) != sameSlot(long) {
		n--
	}
	if n == 0 {
		t.Fatal("no prefix in the same slot: the test needs one")
	}
	if p, q := tab.add(long), tab.add(long[:n]); p == q || tab.str(q) != long[:n] {
		t.Fatalf("whole and prefix of %d octets: ids %d and %d", n, p, q)
	} else {
		tab.release(p)
		tab.release(q)
	}

	// The address cache, likewise.
	a1, a2 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	x = tab.addAddr(a1)
	tab.release(x)
	y = tab.addAddr(a2)
	if y != x {
		t.Fatalf("id %d not reused (got %d): the test needs it", x, y)
	}
	if z := tab.addAddr(a1); z == y || tab.addr(z) != a1 || tab.addr(y) != a2 {
		t.Fatalf("address cache handed out a reused id: %d=%v %d=%v", z, tab.addr(z), y, tab.addr(y))
	} else {
		tab.release(z)
	}
	tab.release(y)
	// An IPv4 address and its IPv4-mapped IPv6 form are different values.
	m := netip.AddrFrom16(a1.As16())
	if p, q := tab.addAddr(a1), tab.addAddr(m); p == q || tab.addr(q) != m {
		t.Fatalf("%v and %v: ids %d and %d", a1, m, p, q)
	} else {
		tab.release(p)
		tab.release(q)
	}

	if tab.live() != 0 {
		t.Fatalf("%d live after releasing all", tab.live())
	}

	// A generation that wraps around must not make a cached id current
	// again (a new table: the id's generation starts at 0).
	tab = newStrtab()
	x = tab.add(name)
	tab.release(x)
	tab.refs[x].gen = math.MaxUint32 // as after 2^32-1 more reuses
	if y = tab.add("other"); y != x {
		t.Fatalf("id %d not reused (got %d): the test needs it", x, y)
	}
	tab.release(y) // generation back to the cached one's
	if y = tab.add("third"); y != x || tab.refs[x].gen != 0 {
		t.Fatalf("id %d, generation %d: the test needs %d and 0", y, tab.refs[y].gen, x)
	}
	if z := tab.add(name); tab.str(z) != name {
		t.Fatalf("after wrapping: %d=%q", z, tab.str(z))
	} else {
		tab.release(z)
	}
	tab.release(y)
	if tab.live() != 0 {
		t.Fatalf("%d live after releasing all", tab.live())
	}
}

// Adding records allocates nothing per record in steady state (the
// per-flow state lives in slab pages).
func TestAddAllocations(t *testing.T) {
	s, k := testStore(Options{})
	src, dst := srcRec(0, 10, counts{pkts: 1}), dstRec(0, 10, counts{pkts: 1})
	for i := range 2 * pageSize { // warm up pages, index and interned values
		src.SourcePort, dst.SourcePort = uint16(i), uint16(i)
		s.Add(at(10), src, k.emit)
		s.Add(at(10), dst, k.emit)
	}
	s.Flush(k.emit)
	k.take()
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		src.SourcePort, dst.SourcePort = uint16(i), uint16(i)
		i++
		s.Add(at(10), src, k.emit)
		s.Add(at(10), dst, k.emit)
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per pair of records", allocs)
	}
}

var entrySize = unsafe.Sizeof(entry{})

// A new flow past MaxFlows evicts another first, and the eviction shifts
// index slots back: the slot the look-up found for the new flow may be
// taken or moved by then. With the index about 70% full, probe runs are
// long and shared, so a stale slot would leave flows unreachable or
// overwrite another's.
func TestEvictionKeepsIndexConsistent(t *testing.T) {
	const limit = 700 // of 1024 slots; the index grows past 768
	s, k := testStore(Options{MaxFlows: limit})
	f := srcRec(0, 1, counts{pkts: 1})
	f.FlowType = flow.FlowTypeIntraNode
	keyOf := func(n int) key {
		var kk key
		benchConn(f, n)
		kk.set(f.SourceIP, f.DestinationIP, f.SourcePort, f.DestinationPort, f.Protocol)
		return kk
	}
	for n := range 5000 {
		benchConn(f, n)
		s.Add(at(1), f, k.emit)
		if n%37 != 0 && n != 4999 {
			continue
		}
		if s.idx.n != s.Len() || s.Len() != min(n+1, limit) {
			t.Fatalf("after %d flows: index %d, store %d", n+1, s.idx.n, s.Len())
		}
		occupied := 0
		for _, v := range s.idx.slots {
			if v != 0 {
				occupied++
			}
		}
		if occupied != s.idx.n {
			t.Fatalf("after %d flows: %d slots occupied, %d flows", n+1, occupied, s.idx.n)
		}
		for m := max(0, n+1-limit); m <= n; m++ {
			kk := keyOf(m)
			if _, _, ok := s.lookup(s.seed.hash(&kk), &kk); !ok {
				t.Fatalf("after %d flows: flow %d unreachable", n+1, m)
			}
		}
	}
	if len(s.idx.slots) != minIndexSlots {
		t.Errorf("index grew to %d slots", len(s.idx.slots))
	}
}

// The key's words are those of an address's 16-octet form whatever path
// addrWords takes, and give the address back.
func TestKeyAddrWords(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "255.255.255.255", "0.0.0.0", "::ffff:10.1.2.3", "2001:db8::1", "::"} {
		a := netip.MustParseAddr(s)
		b := a.As16()
		hi, lo := addrWords(a)
		if hi != binary.BigEndian.Uint64(b[:8]) || lo != binary.BigEndian.Uint64(b[8:]) {
			t.Errorf("%v: words %#x %#x", a, hi, lo)
		}
		var k key
		k.set(a, a, 1, 2, 6)
		if k.srcAddr() != a || k.dstAddr() != a || k.sport() != 1 || k.dport() != 2 || k.proto() != 6 {
			t.Errorf("%v: key gives back %v %v", a, k.srcAddr(), k.dstAddr())
		}
	}
	var k key
	k.set(netip.Addr{}, netip.Addr{}, 0, 0, 0)
	if k.srcAddr().IsValid() || k.dstAddr().IsValid() || k != (key{}) {
		t.Errorf("no addresses: %+v", k)
	}
}

// A tuple holds one reference to each of its values: replacing it by one
// sharing values keeps those held (the new tuple is taken before the old
// is released), and releasing the last reference frees them all.
func TestTupleReplace(t *testing.T) {
	strs, tups := newStrtab(), newTuptab()
	a1, a2 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("2001:db8::10")
	v := tuple{s: [5]uint32{strs.idOfAddr(a1), strs.idOf("team-00"), strs.idOf("web")}, w: 80}
	p := tups.add(&v, &strs)
	if q := tups.add(&v, &strs); q != p || tups.refs[p] != 2 {
		t.Fatalf("same tuple again: id %d (was %d), %d references", q, p, tups.refs[p])
	}
	tups.release(p, &strs)
	w := v
	w.s[0] = strs.idOfAddr(a2)
	tups.replace(&p, &w, &strs)
	if got := tups.vals[p]; got != w || strs.addr(got.s[0]) != a2 || strs.str(got.s[1]) != "team-00" {
		t.Fatalf("replaced: %+v", got)
	}
	if tups.live() != 1 || strs.live() != 3 || strs.refs[w.s[1]].n != 1 {
		t.Fatalf("after replace: %d tuples, %d values live, team-00 held %d times", tups.live(), strs.live(), strs.refs[w.s[1]].n)
	}
	tups.replace(&p, &w, &strs) // unchanged: nothing taken or given back
	if tups.refs[p] != 1 {
		t.Fatalf("unchanged replace: %d references", tups.refs[p])
	}
	tups.release(p, &strs)
	if tups.live() != 0 || strs.live() != 0 {
		t.Fatalf("released: %d tuples, %d values live", tups.live(), strs.live())
	}
	if z := (tuple{}); tups.add(&z, &strs) != 0 {
		t.Fatal("the empty tuple is not id 0")
	}
}

// Where the slab's pages are mapped, a page is a whole number of huge
// pages: a page's last huge page, partly used, would be committed whole.
func TestSlabPageIsWholeHugePages(t *testing.T) {
	if pageShift == 9 {
		t.Skip("pages on the heap (race detector)")
	}
	if b := entrySize << pageShift; b%bigmem.HugePage != 0 {
		t.Errorf("a page of %d entries of %d bytes is %d bytes, %.2f huge pages", pageSize, entrySize, b, float64(b)/bigmem.HugePage)
	}
}

// A Store's mapped table goes back to the system once the Store is
// collected.
func TestTableUnmappedWhenCollected(t *testing.T) {
	if pageShift == 9 {
		t.Skip("pages on the heap (race detector)")
	}
	mapped := func(addr uintptr) bool {
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(maps), fmt.Sprintf("\n%x-", addr)) || strings.HasPrefix(string(maps), fmt.Sprintf("%x-", addr))
	}
	addr := func() uintptr {
		s, k := testStore(Options{})
		s.Add(at(10), srcRec(0, 10, counts{pkts: 1}), k.emit)
		return uintptr(unsafe.Pointer(&s.slab.pages[0][0]))
	}()
	if !mapped(addr) {
		t.Fatalf("the slab page at %#x is not in /proc/self/maps", addr)
	}
	testkit.WaitFor(t, "the collected Store's slab page unmapped", func() bool {
		runtime.GC()
		return !mapped(addr)
	})
}
