// Package observed folds flow records into distinct connections: the
// fields a policy verdict depends on (source and destination address after
// DNAT, protocol, destination port), with how many records were seen,
// allowed and denied, and when. A million records of a few hundred
// connections become a few hundred entries, which is what makes
// recommending and verifying policies over long windows cheap.
package observed

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	"sluice/policy/flowsrc"
)

// DefaultMaxConns bounds the distinct connections a Set holds by default.
const DefaultMaxConns = 1_000_000

// Key is what a verdict depends on, as the exporter's verdict cache keys
// it: no modelled policy matches a source port.
type Key struct {
	Src, Dst netip.Addr
	Proto    uint8
	DstPort  uint16
}

// Conn is one distinct connection and the records that showed it.
type Conn struct {
	Key
	// SrcPort is one source port seen, to build the replayed packet.
	SrcPort uint16
	// Names as the records gave them (empty for a non-Pod end).
	SrcNamespace, SrcPod, DstNamespace, DstPod string
	// ClusterIP and ServicePortName: the Service dialled, if any.
	ClusterIP       netip.Addr
	ServicePortName string
	// Allowed and Denied count the records whose policy rules let the
	// connection through, or dropped or rejected it.
	Allowed, Denied uint64
	First, Last     time.Time
	// DeniedBy names the rule of a denied record, "ns/name rule" or "name rule".
	DeniedBy string
}

// Records is the number of records of the connection.
func (c *Conn) Records() uint64 { return c.Allowed + c.Denied }

// Set is a bounded set of distinct connections.
type Set struct {
	max   int
	conns map[Key]*Conn
	// Records counts every record added; Dropped those of new
	// connections refused because the set was full.
	Records, Dropped uint64
}

// NewSet returns a set of at most max connections (DefaultMaxConns if 0).
func NewSet(max int) *Set {
	if max <= 0 {
		max = DefaultMaxConns
	}
	return &Set{max: max, conns: map[Key]*Conn{}}
}

// KeyOf is r's key; ICMP has no port.
func KeyOf(r *flowsrc.Record) Key {
	k := Key{Src: r.Src.Unmap(), Dst: r.Dst.Unmap(), Proto: r.Proto, DstPort: r.DstPort}
	if r.Proto == 1 || r.Proto == 58 {
		k.DstPort = 0
	}
	return k
}

// Add folds one record in. It reports false when the record's connection
// is new and the set is full (the record is counted in Dropped).
func (s *Set) Add(r *flowsrc.Record) bool {
	s.Records++
	k := KeyOf(r)
	c := s.conns[k]
	if c == nil {
		if len(s.conns) >= s.max {
			s.Dropped++
			return false
		}
		c = &Conn{Key: k, SrcPort: r.SrcPort, SrcNamespace: r.SrcNamespace, SrcPod: r.SrcPod,
			DstNamespace: r.DstNamespace, DstPod: r.DstPod, ClusterIP: r.ClusterIP,
			ServicePortName: r.ServicePortName, First: r.Start, Last: r.End}
		s.conns[k] = c
	}
	if r.Denied() {
		c.Denied++
		if c.DeniedBy == "" {
			p := &r.Ingress
			if p.RuleAction != 2 && p.RuleAction != 3 {
				p = &r.Egress
			}
			c.DeniedBy = p.Name + " " + p.RuleName
			if p.Namespace != "" {
				c.DeniedBy = p.Namespace + "/" + c.DeniedBy
			}
		}
	} else {
		c.Allowed++
	}
	if !r.Start.IsZero() && (c.First.IsZero() || r.Start.Before(c.First)) {
		c.First = r.Start
	}
	if r.End.After(c.Last) {
		c.Last = r.End
	}
	if !c.ClusterIP.IsValid() && r.ClusterIP.IsValid() {
		c.ClusterIP, c.ServicePortName = r.ClusterIP, r.ServicePortName
	}
	return true
}

// Len is the number of distinct connections.
func (s *Set) Len() int { return len(s.conns) }

// Conns returns the connections in a stable order (source, destination,
// protocol, port).
func (s *Set) Conns() []*Conn {
	out := make([]*Conn, 0, len(s.conns))
	for _, c := range s.conns {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *Conn) int { return Compare(a.Key, b.Key) })
	return out
}

// Compare orders keys.
func Compare(a, b Key) int {
	if c := a.Src.Compare(b.Src); c != 0 {
		return c
	}
	if c := a.Dst.Compare(b.Dst); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Proto, b.Proto); c != 0 {
		return c
	}
	return cmp.Compare(a.DstPort, b.DstPort)
}
