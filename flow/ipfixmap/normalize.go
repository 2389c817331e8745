package ipfixmap

import (
	"sluice/flow"
	"sluice/ipfix"
)

// Skew says how a record's element set differs from what the aggregator
// knows: elements it does not know (a newer exporter; kept in
// flow.Unknown) and elements of the newest Antrea agent's set the record
// lacks (an older exporter; left unset).
type Skew struct {
	Unknown int
	Missing int
}

// Normalizer converts IPFIX data records into flow records. It caches one
// conversion plan per template, so the per-record work is a walk over the
// template's fields. One Normalizer per collector session; not safe for
// concurrent use.
type Normalizer struct {
	table    *Table
	expected [2]map[ipfix.ElementKey]bool // by family: 4, 6
	plans    map[*ipfix.Template]*plan
	// last and lastPlan skip the map for runs of records of one template,
	// the common case (Normalize and Skew run per record).
	last     *ipfix.Template
	lastPlan *plan
	intern   *Interner
}

type op struct {
	idx int
	el  *Element
}

type plan struct {
	ops     []op
	unknown []int // template indexes of elements no field maps
	skew    Skew
}

// maxPlans bounds the plan cache; templates replaced over a long session
// leave stale plans behind, and the cache is simply cleared when full.
const maxPlans = 1024

// NewNormalizer returns a normalizer over table.
func NewNormalizer(table *Table) *Normalizer {
	n := &Normalizer{table: table, plans: map[*ipfix.Template]*plan{}, intern: NewInterner(4096)}
	for i, family := range []int{4, 6} {
		n.expected[i] = map[ipfix.ElementKey]bool{}
		names, _ := AgentElements(NewestAgent, family)
		for _, name := range names {
			if ie, ok := table.reg.ByName(name); ok {
				n.expected[i][ipfix.ElementKey{EnterpriseID: ie.EnterpriseID, ID: ie.ID}] = true
			}
		}
	}
	return n
}

func (n *Normalizer) plan(t *ipfix.Template) *plan {
	if t == n.last {
		return n.lastPlan
	}
	if p, ok := n.plans[t]; ok {
		n.last, n.lastPlan = t, p
		return p
	}
	if len(n.plans) >= maxPlans {
		clear(n.plans)
	}
	p := &plan{}
	family, antrea := 4, false
	seen := map[ipfix.ElementKey]bool{}
	for i := range t.Fields {
		f := &t.Fields[i]
		k := f.Key()
		seen[k] = true
		if k.EnterpriseID == ipfix.EnterpriseAntrea {
			antrea = true
		}
		el, ok := n.table.Lookup(k)
		switch {
		case ok && el.get == nil:
			// Known, export-only: nothing to map.
		case ok && f.IE != nil && f.Type == el.IE.Type:
			p.ops = append(p.ops, op{i, el})
			if el.Family == 6 && el.Field == flow.SourceIP {
				family = 6
			}
		default:
			// Unknown to us, or sent with a length its type cannot
			// have: carried along raw.
			p.unknown = append(p.unknown, i)
		}
	}
	p.skew.Unknown = len(p.unknown)
	// Only records that look like an Antrea agent's are measured against
	// the agent's element set; softflowd's would all be "missing" most.
	if antrea {
		fi := 0
		if family == 6 {
			fi = 1
		}
		for k := range n.expected[fi] {
			if !seen[k] {
				p.skew.Missing++
			}
		}
	}
	n.plans[t] = p
	n.last, n.lastPlan = t, p
	return p
}

// Skew is the skew of records of template t, as Normalize reports it, for
// records that are forwarded without being normalized.
func (n *Normalizer) Skew(t *ipfix.Template) Skew { return n.plan(t).skew }

// Normalize fills f from r, setting presence for every field the record
// carries, and returns the record's skew. f must be zero or reset; its
// Origin is left to the caller.
func (n *Normalizer) Normalize(r *ipfix.Record, f *flow.Flow) Skew {
	p := n.plan(r.Template)
	for _, o := range p.ops {
		if o.el.get(r, o.idx, f, n.intern) {
			f.Present.Set(o.el.Field)
		}
	}
	if len(p.unknown) > 0 {
		size := 0
		for _, i := range p.unknown {
			size += r.Len(i)
		}
		buf := make([]byte, 0, size)
		f.Unknown = make([]flow.Element, len(p.unknown))
		for j, i := range p.unknown {
			fs := r.Field(i)
			start := len(buf)
			buf = append(buf, r.Bytes(i)...)
			f.Unknown[j] = flow.Element{EnterpriseID: fs.EnterpriseID, ID: fs.ID, Length: fs.Length, Value: buf[start:len(buf):len(buf)]}
		}
	}
	return p.skew
}
