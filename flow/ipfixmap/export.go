package ipfixmap

import (
	"encoding/binary"
	"fmt"

	"sluice/flow"
	"sluice/ipfix"
)

// MaxPassThroughTemplates bounds the templates an Exporter makes for
// distinct sets of passed-through elements.
const MaxPassThroughTemplates = 256

// Exporter turns flow records into IPFIX records of the aggregator's own
// templates: one per IP family, plus, when unknown elements are passed
// through, one per distinct set of them. Not safe for concurrent use.
type Exporter struct {
	base        [2][]*Element // by family index: 4 → 0, 6 → 1
	baseKeys    map[ipfix.ElementKey]bool
	passThrough bool
	// legacy are known elements the export template no longer has (the
	// L7 elements of agents v1.15 to v2.5); with pass-through they are
	// appended when a record carries them, so older agents' values are
	// not lost either.
	legacy    []*Element
	templates map[string]*ipfix.Template
	order     []*ipfix.Template
	// family is the family index of each template of order, whose IDs
	// run from firstID; plans writes the base template of each family.
	family []uint8
	plans  [2]*writePlan
	// baseT are the base templates by family index, set once: what
	// BaseTemplate hands out without touching templates.
	baseT   [2]*ipfix.Template
	planned uint64 // records whose base fields the plans wrote
	firstID uint16
	nextID  uint16
	sig     []byte
	scratch []*Element
	// Dropped counts unknown elements left out: already in the base
	// template, or beyond MaxPassThroughTemplates.
	Dropped uint64
}

// NewExporter prepares the templates for opts. With passThrough, elements
// a record carries that the aggregator does not know are appended to its
// template, so they reach the collector.
func NewExporter(table *Table, opts ExportOptions, passThrough bool, firstTemplateID uint16) (*Exporter, error) {
	if firstTemplateID < ipfix.MinDataSetID {
		firstTemplateID = ipfix.MinDataSetID
	}
	e := &Exporter{baseKeys: map[ipfix.ElementKey]bool{}, passThrough: passThrough,
		templates: map[string]*ipfix.Template{}, firstID: firstTemplateID, nextID: firstTemplateID}
	for fi, family := range []int{4, 6} {
		els, err := table.Elements(ExportElements(family, opts))
		if err != nil {
			return nil, err
		}
		e.base[fi] = els
		for _, el := range els {
			e.baseKeys[ipfix.ElementKey{EnterpriseID: el.IE.EnterpriseID, ID: el.IE.ID}] = true
		}
		if fi == 0 && passThrough {
			if e.legacy, err = table.Elements([]string{"appProtocolName", "httpVals"}); err != nil {
				return nil, err
			}
		}
		t, err := e.template(fi, nil, nil)
		if err != nil {
			return nil, err
		}
		e.plans[fi] = newWritePlan(els, t)
		e.baseT[fi] = t
	}
	return e, nil
}

// Templates returns every template made so far, in creation order; a
// (re)connected exporting process announces them all.
func (e *Exporter) Templates() []*ipfix.Template { return e.order }

// Elements lists the base template's elements for an IP family.
func (e *Exporter) Elements(family int) []*Element {
	if family == 6 {
		return e.base[1]
	}
	return e.base[0]
}

// Template returns the template for f, and whether it is new (it must be
// announced before records of it are sent).
func (e *Exporter) Template(f *flow.Flow) (t *ipfix.Template, isNew bool, err error) {
	fi := 0
	if f.IsIPv6() {
		fi = 1
	}
	var extra []flow.Element
	var legacy []*Element
	if e.passThrough {
		extra = f.Unknown
		legacy = e.carried(f)
	}
	n := len(e.order)
	t, err = e.template(fi, legacy, extra)
	return t, len(e.order) > n, err
}

// BaseTemplate returns the template Template gives f when that is its
// family's base template (nothing of f is passed through), and false
// otherwise. Unlike Template, it is safe for concurrent use with every
// other method: it reads only what NewExporter set.
func (e *Exporter) BaseTemplate(f *flow.Flow) (*ipfix.Template, bool) {
	if e.passThrough {
		if len(f.Unknown) > 0 {
			return nil, false
		}
		for _, el := range e.legacy {
			if f.Present.Has(el.Field) {
				return nil, false
			}
		}
	}
	if f.IsIPv6() {
		return e.baseT[1], true
	}
	return e.baseT[0], true
}

// WriteBase is Write for a template from BaseTemplate(f), safe for
// concurrent use like BaseTemplate: it neither counts nor uses scratch
// space.
func (e *Exporter) WriteBase(b ipfix.RecordBuilder, t *ipfix.Template, f *flow.Flow) error {
	fi := 0
	if f.IsIPv6() {
		fi = 1
	}
	if t != e.baseT[fi] {
		return fmt.Errorf("ipfixmap: template %d is not the IPv%d base template", t.ID, 4+2*fi)
	}
	ok := false
	if p := e.plans[fi]; p != nil {
		b, ok = p.write(b, f)
	}
	if !ok {
		b = PutValues(b, e.base[fi], f)
	}
	return b.End()
}

// carried returns the legacy elements f carries, in a scratch slice.
func (e *Exporter) carried(f *flow.Flow) []*Element {
	out := e.scratch[:0]
	for _, el := range e.legacy {
		if f.Present.Has(el.Field) {
			out = append(out, el)
		}
	}
	e.scratch = out
	return out
}

// template finds or makes the template of family index fi extended with
// the legacy elements, then the pass-through elements of extra.
func (e *Exporter) template(fi int, legacy []*Element, extra []flow.Element) (*ipfix.Template, error) {
	e.sig = append(e.sig[:0], byte(fi), byte(len(legacy)))
	for _, el := range legacy {
		e.sig = binary.BigEndian.AppendUint16(e.sig, el.IE.ID)
	}
	for _, x := range extra {
		if e.baseKeys[ipfix.ElementKey{EnterpriseID: x.EnterpriseID, ID: x.ID}] {
			e.Dropped++ // our own export already has this element
			continue
		}
		e.sig = binary.BigEndian.AppendUint32(e.sig, x.EnterpriseID)
		e.sig = binary.BigEndian.AppendUint16(e.sig, x.ID)
		e.sig = binary.BigEndian.AppendUint16(e.sig, x.Length)
	}
	if t, ok := e.templates[string(e.sig)]; ok {
		return t, nil
	}
	if len(e.templates) >= MaxPassThroughTemplates+2 {
		// Out of room for another combination: fall back to the base.
		e.Dropped += uint64(len(extra))
		return e.templates[string([]byte{byte(fi), 0})], nil
	}
	fields := make([]ipfix.Field, 0, len(e.base[fi])+len(legacy)+len(extra))
	for _, el := range e.base[fi] {
		fields = append(fields, ipfix.Field{IE: el.IE})
	}
	for _, el := range legacy {
		fields = append(fields, ipfix.Field{IE: el.IE})
	}
	for _, x := range extra {
		if e.baseKeys[ipfix.ElementKey{EnterpriseID: x.EnterpriseID, ID: x.ID}] {
			continue
		}
		ie := &ipfix.InfoElement{Name: fmt.Sprintf("%d:%d", x.EnterpriseID, x.ID), EnterpriseID: x.EnterpriseID,
			ID: x.ID, Type: ipfix.OctetArray, Length: x.Length}
		fields = append(fields, ipfix.Field{IE: ie, Length: x.Length})
	}
	t, err := ipfix.NewTemplate(e.nextID, fields)
	if err != nil {
		return nil, fmt.Errorf("ipfixmap: export template: %w", err)
	}
	e.nextID++
	e.templates[string(e.sig)] = t
	e.order = append(e.order, t)
	e.family = append(e.family, uint8(fi))
	return t, nil
}

// Write writes f's values as a record of t, which must come from
// Template(f), and ends it.
func (e *Exporter) Write(b ipfix.RecordBuilder, t *ipfix.Template, f *flow.Flow) error {
	fi := 0
	if f.IsIPv6() {
		fi = 1
	}
	ok := false
	if p := e.plan(t, fi); p != nil {
		if b, ok = p.write(b, f); ok {
			e.planned++
		}
	}
	if !ok {
		b = PutValues(b, e.base[fi], f)
	}
	if len(t.Fields) > len(e.base[fi]) {
		b = PutValues(b, e.carried(f), f)
		for _, x := range f.Unknown {
			if !e.baseKeys[ipfix.ElementKey{EnterpriseID: x.EnterpriseID, ID: x.ID}] {
				b = b.Bytes(x.Value)
			}
		}
	}
	return b.End()
}

// plan returns the write plan for the base fields of t, a template of
// family index fi, or nil if t is not one of e's templates of that family
// (then the elements' put writes them, and the builder reports any
// mismatch as it always did).
func (e *Exporter) plan(t *ipfix.Template, fi int) *writePlan {
	k := int(t.ID) - int(e.firstID)
	if k < 0 || k >= len(e.order) || e.order[k] != t || int(e.family[k]) != fi {
		return nil
	}
	return e.plans[fi]
}

// Elements resolves element names to mapped elements, in order.
func (t *Table) Elements(names []string) ([]*Element, error) {
	out := make([]*Element, len(names))
	for i, name := range names {
		el, ok := t.byName[name]
		if !ok || el.put == nil {
			return nil, fmt.Errorf("ipfixmap: no export mapping for element %s", name)
		}
		out[i] = el
	}
	return out, nil
}

// TemplateOf builds the template of an ordered element list.
func TemplateOf(id uint16, els []*Element) (*ipfix.Template, error) {
	ies := make([]*ipfix.InfoElement, len(els))
	for i, el := range els {
		ies[i] = el.IE
	}
	return ipfix.TemplateOf(id, ies...)
}

// WriteRecord writes f's values for els, in order, as one record of a
// template built from the same list by TemplateOf.
func WriteRecord(b ipfix.RecordBuilder, els []*Element, f *flow.Flow) error {
	return PutValues(b, els, f).End()
}

// PutValues writes f's values for els without ending the record, for a
// template that continues with other fields, and returns the builder to
// continue with.
func PutValues(b ipfix.RecordBuilder, els []*Element, f *flow.Flow) ipfix.RecordBuilder {
	for _, el := range els {
		b = el.put(b, f)
	}
	return b
}

// Base is the export template of an IP family (4 or 6) without
// passed-through elements: what a record with nothing to pass through is
// written as.
func (e *Exporter) Base(family int) *ipfix.Template {
	fi := byte(0)
	if family == 6 {
		fi = 1
	}
	return e.templates[string([]byte{fi, 0})]
}

// PassThrough reports whether the exporter passes unknown elements
// through.
func (e *Exporter) PassThrough() bool { return e.passThrough }
