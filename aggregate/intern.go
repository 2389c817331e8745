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
	c := &t.same[sameSlot(s)]
	if unsafe.StringData(c.s) == unsafe.StringData(s) && len(c.s) == len(s) {
		if r := &t.refs[c.id]; r.gen == c.gen {
			r.n++
			return c.id
		}
	}
	id := t.addContent(s)
	*c = sameCached{s, id, t.refs[id].gen}
	return id
}

// addContent is add past the identity cache.
func (t *strtab) addContent(s string) uint32 {
	c := &t.cache[quick(s)]
	if c.s == s {
		t.refs[c.id].n++
		return c.id
	}
	id, ok := t.ids[s]
	if !ok {
		id = t.newID(strings.Clone(s))
		t.ids[t.strs[id]] = id
	}
	t.refs[id].n++
	*c = cached{s, id}
	return id
}

// addBytes is add for a value held as octets (never empty).
func (t *strtab) addBytes(b []byte) uint32 {
	c := &t.cache[quick(string(b))]
	if c.s == string(b) {
		t.refs[c.id].n++
		return c.id
	}
	id, ok := t.ids[string(b)]
	if !ok {
		id = t.newID(string(b))
		t.ids[t.strs[id]] = id
	}
	t.refs[id].n++
	*c = cached{t.strs[id], id}
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

func (t *strtab) addUID(u flow.UID) uint32 {
	if u == (flow.UID{}) {
		return 0
	}
	return t.addBytes(u[:])
}

func (t *strtab) addAddr(a netip.Addr) uint32 {
	if !a.IsValid() {
		return 0
	}
	return t.addAddrSlow(a)
}

func (t *strtab) addAddrSlow(a netip.Addr) uint32 {
	c := &t.addrs[addrSlot(a)]
	if c.a == a {
		if r := &t.refs[c.id]; r.gen == c.gen {
			r.n++
			return c.id
		}
	}
	var id uint32
	if a.Is4() {
		b := a.As4()
		id = t.addBytes(b[:])
	} else {
		b := a.As16()
		id = t.addBytes(b[:])
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

// set replaces the id at *p with one for s (s non-empty).
func (t *strtab) set(p *uint32, s string) {
	old := *p
	if old == 0 {
		*p = t.addSlow(s)
		return
	}
	if t.strs[old] == s {
		return
	}
	*p = t.addSlow(s)
	t.unref(old)
}

func (t *strtab) setUID(p *uint32, u flow.UID) {
	if t.strs[*p] == string(u[:]) {
		return
	}
	id := t.addUID(u)
	t.release(*p)
	*p = id
}

// setAddr replaces the id at *p with one for a.
func (t *strtab) setAddr(p *uint32, a netip.Addr) {
	old := *p
	if old != 0 && a.IsValid() {
		// Most often the same address again (both Nodes report the
		// Service): no reference to take and give back.
		if c := &t.addrs[addrSlot(a)]; c.id == old && c.a == a && t.refs[old].gen == c.gen {
			return
		}
	}
	*p = t.addAddr(a)
	t.release(old)
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
