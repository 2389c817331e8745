package aggregate

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"unsafe"

	"sluice/flow"
)

// strtab interns the values of a Store's entries: Pod, namespace, Node and
// policy names, UIDs and addresses repeat across many flows, so each entry
// holds 4-octet ids instead. Ids are reference-counted and reused once no
// entry holds them, so the table follows the live set (Pods come and go).
// Id 0 is the empty value.
//
// Three caches sit in front of the map, each mapping a value to the id it
// was last interned as:
//   - same, by the string's header (data pointer and length): a
//     collector's strings are shared per session, so the same header
//     arrives again and again, and a hit compares no octets;
//   - cache, by a cheap hash of the content, for strings that are equal
//     but not shared;
//   - addrs, by the address value, for addresses (no conversion to
//     octets).
//
// A freed id may be reused for another value, so same and addrs remember
// the generation of the id they hold and hit only while it is current
// (drop bumps it); cache entries are cleared by drop instead.
type strtab struct {
	ids  map[string]uint32
	strs []string
	refs []ref
	free []uint32

	same  [sameSize]sameCached
	cache [cacheSize]cached
	addrs [addrCacheSize]addrCached
}

// ref is an id's reference count and generation.
type ref struct {
	n, gen uint32
}

type cached struct {
	s  string
	id uint32
}

// sameCached holds the caller's string itself: while it is held its octets
// cannot be reused for another string, so an equal header means equal
// content.
type sameCached struct {
	s       string
	id, gen uint32
}

type addrCached struct {
	a       netip.Addr
	id, gen uint32
}

const (
	sameBits      = 12
	sameSize      = 1 << sameBits
	cacheSize     = 1 << 12
	addrCacheBits = 10
	addrCacheSize = 1 << addrCacheBits
)

func newStrtab() strtab {
	return strtab{ids: map[string]uint32{}, strs: []string{""}, refs: []ref{{}}}
}

// sameSlot is the identity cache's slot for a string header.
func sameSlot(s string) uint32 {
	h := (uint64(uintptr(unsafe.Pointer(unsafe.StringData(s)))) ^ uint64(len(s))<<48) * 0x9e3779b97f4a7c15
	return uint32(h >> (64 - sameBits))
}

// addrSlot is the address cache's slot for a.
// An IPv4 address is read as 4 octets: As16 copies its result in one
// 16-octet move from two 8-octet stores, which stalls store forwarding.
func addrSlot(a netip.Addr) uint32 {
	var h uint64
	if a.Is4() {
		b := a.As4()
		h = uint64(binary.NativeEndian.Uint32(b[:]))
	} else {
		b := a.As16()
		h = binary.NativeEndian.Uint64(b[:8])*0xc2b2ae3d27d4eb4f ^ binary.NativeEndian.Uint64(b[8:])
	}
	h *= 0x9e3779b97f4a7c15
	return uint32(h >> (64 - addrCacheBits))
}

// quick is a cheap hash of s for the cache: its length and its first and
// last 8 octets.
func quick(s string) uint32 {
	n := len(s)
	h := uint64(n) * 0x9e3779b97f4a7c15
	if n >= 8 {
		h ^= load64(s[:8]) * 0xc2b2ae3d27d4eb4f
		h ^= load64(s[n-8:]) * 0x165667b19e3779f9
	} else {
		for i := range n {
			h = (h ^ uint64(s[i])) * 0x100000001b3
		}
	}
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	return uint32(h>>32) & (cacheSize - 1)
}

func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// add returns a new reference to the id of s.
func (t *strtab) add(s string) uint32 {
	if s == "" {
		return 0
	}
	return t.addSlow(s)
}

func (t *strtab) addSlow(s string) uint32 {
	id := t.idOfSlow(s)
	t.refs[id].n++
	return id
}

// idOf is the id of s, taking no reference: a value not held yet is
// entered with none, and the caller must take one (or leave it to be
// taken) before anything can be released.
func (t *strtab) idOf(s string) uint32 {
	if s == "" {
		return 0
	}
	return t.idOfSlow(s)
}

func (t *strtab) idOfSlow(s string) uint32 {
	c := &t.same[sameSlot(s)]
	if unsafe.StringData(c.s) == unsafe.StringData(s) && len(c.s) == len(s) {
		if t.refs[c.id].gen == c.gen {
			return c.id
		}
	}
	id := t.idOfContent(s)
	*c = sameCached{s, id, t.refs[id].gen}
	return id
}

// idOfContent is idOf past the identity cache.
func (t *strtab) idOfContent(s string) uint32 {
	c := &t.cache[quick(s)]
	if c.s == s {
		return c.id
	}
	id, ok := t.ids[s]
	if !ok {
		id = t.newID(strings.Clone(s))
		t.ids[t.strs[id]] = id
	}
	*c = cached{s, id}
	return id
}

// idOfBytes is idOf for a value held as octets (never empty).
func (t *strtab) idOfBytes(b []byte) uint32 {
	c := &t.cache[quick(string(b))]
	if c.s == string(b) {
		return c.id
	}
	id, ok := t.ids[string(b)]
	if !ok {
		id = t.newID(string(b))
		t.ids[t.strs[id]] = id
	}
	*c = cached{t.strs[id], id}
	return id
}

// addBytes is add for a value held as octets (never empty).
func (t *strtab) addBytes(b []byte) uint32 {
	id := t.idOfBytes(b)
	t.refs[id].n++
	return id
}

func (t *strtab) newID(s string) uint32 {
	if n := len(t.free); n > 0 {
		id := t.free[n-1]
		t.free = t.free[:n-1]
		t.strs[id] = s
		return id
	}
	t.strs = append(t.strs, s)
	t.refs = append(t.refs, ref{})
	return uint32(len(t.strs) - 1)
}

// idOfUID is idOf for a UID.
func (t *strtab) idOfUID(u *flow.UID) uint32 {
	if *u == (flow.UID{}) {
		return 0
	}
	return t.idOfBytes(u[:])
}

func (t *strtab) addAddr(a netip.Addr) uint32 {
	if !a.IsValid() {
		return 0
	}
	id := t.idOfAddrSlow(a)
	t.refs[id].n++
	return id
}

// idOfAddr is idOf for an address.
func (t *strtab) idOfAddr(a netip.Addr) uint32 {
	if !a.IsValid() {
		return 0
	}
	return t.idOfAddrSlow(a)
}

func (t *strtab) idOfAddrSlow(a netip.Addr) uint32 {
	c := &t.addrs[addrSlot(a)]
	if c.a == a && t.refs[c.id].gen == c.gen {
		return c.id
	}
	var id uint32
	if a.Is4() {
		b := a.As4()
		id = t.idOfBytes(b[:])
	} else {
		b := a.As16()
		id = t.idOfBytes(b[:])
	}
	*c = addrCached{a, id, t.refs[id].gen}
	return id
}

// release drops a reference to id.
func (t *strtab) release(id uint32) {
	if id != 0 {
		t.unref(id)
	}
}

// unref is release of a non-zero id; kept out of line so that release,
// mostly of id 0, inlines.
//
//go:noinline
func (t *strtab) unref(id uint32) {
	r := &t.refs[id]
	r.n--
	if r.n == 0 {
		t.drop(id)
	}
}

func (t *strtab) drop(id uint32) {
	s := t.strs[id]
	if c := &t.cache[quick(s)]; c.id == id {
		*c = cached{}
	}
	// Entries of same and addrs naming id are stale from now on. Should
	// the generation wrap around, entries from the previous round could
	// look current again: clear them all.
	t.refs[id].gen++
	if t.refs[id].gen == 0 {
		t.same = [sameSize]sameCached{}
		t.addrs = [addrCacheSize]addrCached{}
	}
	delete(t.ids, s)
	t.strs[id] = ""
	t.free = append(t.free, id)
}

func (t *strtab) str(id uint32) string { return t.strs[id] }

func (t *strtab) uid(id uint32) flow.UID {
	var u flow.UID
	copy(u[:], t.strs[id])
	return u
}

func (t *strtab) addr(id uint32) netip.Addr {
	s := t.strs[id]
	switch len(s) {
	case 4:
		return netip.AddrFrom4([4]byte([]byte(s)))
	case 16:
		return netip.AddrFrom16([16]byte([]byte(s)))
	}
	return netip.Addr{}
}

// live is the number of distinct values held.
func (t *strtab) live() int { return len(t.ids) }

// tuple is a group of values that travel together for one endpoint, so
// that an entry holds one id for all of them: a Pod (namespace, name, UID,
// Node, Node UID), a Service (cluster IP, Service IP, port name, UID and
// the port), a policy (namespace, name, UID, rule, type and action), an
// Egress (name, IP, Node, Node UID, UID), and the rarely set rest. s holds
// strtab ids, each with one reference while the tuple is interned; w holds
// small values (ports, types, actions).
type tuple struct {
	s [5]uint32
	w uint32
}

// tuptab interns tuples as strtab does values: reference-counted ids,
// reused once free; id 0 is the empty tuple. A cache keyed by the tuple's
// content sits in front of the map (cleared by drop, like strtab.cache).
type tuptab struct {
	ids   map[tuple]uint32
	vals  []tuple
	refs  []uint32
	free  []uint32
	cache [tupCacheSize]tupCached
}

type tupCached struct {
	t  tuple
	id uint32
}

const (
	tupCacheBits = 12
	tupCacheSize = 1 << tupCacheBits
)

func newTuptab() tuptab {
	return tuptab{ids: map[tuple]uint32{}, vals: []tuple{{}}, refs: []uint32{0}}
}

// eq reports whether t and o are equal, word by word (== on the struct
// calls the runtime's memequal).
func (t *tuple) eq(o *tuple) bool {
	return t.s[0] == o.s[0] && t.s[1] == o.s[1] && t.s[2] == o.s[2] && t.s[3] == o.s[3] &&
		t.s[4] == o.s[4] && t.w == o.w
}

func (t *tuple) zero() bool {
	return t.s[0]|t.s[1]|t.s[2]|t.s[3]|t.s[4]|t.w == 0
}

func (t *tuple) slot() uint32 {
	h := (uint64(t.s[0])<<32 | uint64(t.s[1])) * 0x9e3779b97f4a7c15
	h ^= (uint64(t.s[2])<<32 | uint64(t.s[3])) * 0xc2b2ae3d27d4eb4f
	h ^= (uint64(t.s[4])<<32 | uint64(t.w)) * 0x165667b19e3779f9
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	return uint32(h >> (64 - tupCacheBits))
}

// add returns a new reference to the id of v, whose values' ids come from
// strs.idOf (no references taken): a new tuple takes one on each.
func (t *tuptab) add(v *tuple, strs *strtab) uint32 {
	if v.zero() {
		return 0
	}
	c := &t.cache[v.slot()]
	if c.t.eq(v) && c.id != 0 {
		t.refs[c.id]++
		return c.id
	}
	id, ok := t.ids[*v]
	if !ok {
		for _, x := range v.s {
			if x != 0 {
				strs.refs[x].n++
			}
		}
		if n := len(t.free); n > 0 {
			id = t.free[n-1]
			t.free = t.free[:n-1]
			t.vals[id] = *v
		} else {
			t.vals = append(t.vals, *v)
			t.refs = append(t.refs, 0)
			id = uint32(len(t.vals) - 1)
		}
		t.ids[*v] = id
	}
	t.refs[id]++
	*c = tupCached{*v, id}
	return id
}

// release drops a reference to id; the last one releases its values.
func (t *tuptab) release(id uint32, strs *strtab) {
	if id == 0 {
		return
	}
	t.refs[id]--
	if t.refs[id] != 0 {
		return
	}
	v := t.vals[id]
	if c := &t.cache[v.slot()]; c.id == id {
		*c = tupCached{}
	}
	delete(t.ids, v)
	t.vals[id] = tuple{}
	t.free = append(t.free, id)
	for _, x := range v.s {
		strs.release(x)
	}
}

// replace makes *p the id of v, releasing the tuple it named (v's values
// from strs.idOf, as for add). The new reference is taken first, so that
// values the two share stay held.
func (t *tuptab) replace(p *uint32, v *tuple, strs *strtab) {
	old := *p
	if t.vals[old].eq(v) {
		return
	}
	*p = t.add(v, strs)
	t.release(old, strs)
}

// live is the number of distinct tuples held.
func (t *tuptab) live() int { return len(t.ids) }
