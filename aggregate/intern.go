package aggregate

import (
	"net/netip"
	"strings"

	"sluice/flow"
)

// strtab interns the values of a Store's entries: Pod, namespace, Node and
// policy names, UIDs and addresses repeat across many flows, so each entry
// holds 4-octet ids instead. Ids are reference-counted and reused once no
// entry holds them, so the table follows the live set (Pods come and go).
// Id 0 is the empty value.
type strtab struct {
	ids  map[string]uint32
	strs []string
	refs []uint32
	free []uint32
	// cache maps a cheap hash of a value to the value last interned with
	// that hash, as the caller gave it (a collector's strings are shared
	// per session, so a hit often compares equal pointers), and its id: a
	// hit skips the map. Freed ids are removed from it.
	cache [cacheSize]cached
}

type cached struct {
	s  string
	id uint32
}

const cacheSize = 1 << 12

func newStrtab() strtab {
	return strtab{ids: map[string]uint32{}, strs: []string{""}, refs: []uint32{0}}
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
	c := &t.cache[quick(s)]
	if c.s == s {
		t.refs[c.id]++
		return c.id
	}
	id, ok := t.ids[s]
	if !ok {
		id = t.newID(strings.Clone(s))
		t.ids[t.strs[id]] = id
	}
	t.refs[id]++
	*c = cached{s, id}
	return id
}

// addBytes is add for a value held as octets (never empty).
func (t *strtab) addBytes(b []byte) uint32 {
	c := &t.cache[quick(string(b))]
	if c.s == string(b) {
		t.refs[c.id]++
		return c.id
	}
	id, ok := t.ids[string(b)]
	if !ok {
		id = t.newID(string(b))
		t.ids[t.strs[id]] = id
	}
	t.refs[id]++
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
	t.refs = append(t.refs, 0)
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
	if a.Is4() {
		b := a.As4()
		return t.addBytes(b[:])
	}
	b := a.As16()
	return t.addBytes(b[:])
}

// release drops a reference to id.
func (t *strtab) release(id uint32) {
	if id == 0 {
		return
	}
	t.refs[id]--
	if t.refs[id] == 0 {
		t.drop(id)
	}
}

func (t *strtab) drop(id uint32) {
	s := t.strs[id]
	if c := &t.cache[quick(s)]; c.id == id {
		*c = cached{}
	}
	delete(t.ids, s)
	t.strs[id] = ""
	t.free = append(t.free, id)
}

// set replaces the id at *p with one for s (s non-empty).
func (t *strtab) set(p *uint32, s string) {
	if t.strs[*p] == s {
		return
	}
	id := t.add(s)
	t.release(*p)
	*p = id
}

func (t *strtab) setUID(p *uint32, u flow.UID) {
	if t.strs[*p] == string(u[:]) {
		return
	}
	id := t.addUID(u)
	t.release(*p)
	*p = id
}

func (t *strtab) setAddr(p *uint32, a netip.Addr) {
	id := t.addAddr(a)
	t.release(*p)
	*p = id
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
