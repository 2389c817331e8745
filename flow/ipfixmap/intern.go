package ipfixmap

// Interner returns one shared string for each distinct byte sequence it
// sees, so that the Pod, namespace and node names that repeat in every
// record cost no allocation after their first sighting. It forgets
// everything when full, which bounds its memory. Not safe for concurrent
// use: one per collector session.
type Interner struct {
	m   map[string]string
	max int
	// last is the string each template field index had the last time
	// (see Field): a value that repeats from record to record is found
	// without hashing it.
	last [maxLastFields]string
}

// maxLastFields bounds Interner.last: field indexes beyond it go to the
// map only. At most maxLastFields strings of up to maxInternLen octets.
const (
	maxLastFields = 128
	maxInternLen  = 256
)

// NewInterner returns an interner holding at most max strings.
func NewInterner(max int) *Interner {
	return &Interner{m: make(map[string]string), max: max}
}

// Field is Bytes for the value of template field i. A value equal to the
// previous one of the same index is returned after one compare; any
// other goes through Bytes.
func (in *Interner) Field(i int, b []byte) string {
	if uint(i) >= maxLastFields {
		return in.Bytes(b)
	}
	if s := in.last[i]; s == string(b) { // no allocation for the compare
		return s
	}
	s := in.Bytes(b)
	if len(s) <= maxInternLen {
		in.last[i] = s
	}
	return s
}

// Bytes returns b as a string, shared with earlier calls for equal b.
func (in *Interner) Bytes(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := in.m[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if len(in.m) >= in.max || len(b) > maxInternLen {
		if len(b) > maxInternLen {
			return string(b) // long values (labels JSON) rarely repeat exactly
		}
		clear(in.m)
	}
	s := string(b)
	in.m[s] = s
	return s
}
