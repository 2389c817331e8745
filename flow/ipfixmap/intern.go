package ipfixmap

// Interner returns one shared string for each distinct byte sequence it
// sees, so that the Pod, namespace and node names that repeat in every
// record cost no allocation after their first sighting. It forgets
// everything when full, which bounds its memory. Not safe for concurrent
// use: one per collector session.
type Interner struct {
	m   map[string]string
	max int
}

// NewInterner returns an interner holding at most max strings.
func NewInterner(max int) *Interner {
	return &Interner{m: make(map[string]string), max: max}
}

// Bytes returns b as a string, shared with earlier calls for equal b.
func (in *Interner) Bytes(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := in.m[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if len(in.m) >= in.max || len(b) > 256 {
		if len(b) > 256 {
			return string(b) // long values (labels JSON) rarely repeat exactly
		}
		clear(in.m)
	}
	s := string(b)
	in.m[s] = s
	return s
}
