package ipfix

import (
	"errors"
	"fmt"
	"strconv"
)

// Set IDs with a fixed meaning (RFC 7011 §3.3.2).
const (
	TemplateSetID        uint16 = 2
	OptionsTemplateSetID uint16 = 3
	// MinDataSetID is the lowest Set ID (and template ID) of a data set.
	MinDataSetID uint16 = 256
)

// Field is one field specifier of a template: which element, how long, and
// the type its values are read as.
type Field struct {
	EnterpriseID uint32
	ID           uint16
	// Length is the encoded length of the value, or VariableLength.
	Length uint16
	// IE is the registry's description, nil for an element the registry
	// does not know. Unknown elements are not errors: their values are
	// kept as raw octets.
	IE *InfoElement
	// Type is the type values are read as: the element's type, or
	// OctetArray for an unknown element or a length its type cannot have.
	Type DataType
}

// Key returns the field's wire identity.
func (f *Field) Key() ElementKey { return ElementKey{f.EnterpriseID, f.ID} }

// Name is the element's registered name, or "<enterprise>:<id>" when the
// registry does not know it.
func (f *Field) Name() string {
	if f.IE != nil {
		return f.IE.Name
	}
	return fmt.Sprintf("%d:%d", f.EnterpriseID, f.ID)
}

// Variable reports whether the field has a variable length.
func (f *Field) Variable() bool { return f.Length == VariableLength }

// Template is a decoded or constructed (options) template. It is immutable
// once built: a re-announced template replaces the pointer, never the
// contents, so a reader holding a *Template can cache per-template plans.
type Template struct {
	ID uint16
	// ScopeFieldCount is non-zero for options templates: the first
	// ScopeFieldCount fields are scope fields.
	ScopeFieldCount uint16
	Fields          []Field

	// fixed spans of each field when no field is variable (fixedLen >= 0).
	fixed    []span
	fixedLen int
	// For a template with variable-length fields, proto describes each
	// field for the decoder: a fixed-length field's span relative to the
	// end of the variable-length field before it (or the record's start);
	// a variable-length field (typ has varFlag) the offset of its length
	// octet in the same way as off, and the length of the fixed fields
	// after it as end. head is the length of the fixed fields before the
	// first variable one. So the decoder checks bounds once per variable
	// field and places a fixed field with two adds.
	proto []span
	head  int
	// ops is how an Encoder writes each field, so that a value costs one
	// compare against the template instead of a walk of Fields.
	ops []fieldOp
	// names are the fields' names and absent the message for a negative
	// field index, so that Record's inlined accessors build their errors
	// without a call.
	names  []string
	absent string
	// minLen is the smallest possible record: variable fields count one
	// octet (their length prefix). Always >= 1 for a valid template.
	minLen int
	// wire is the template record as received, less its header, used to
	// recognise an unchanged re-announcement without allocating.
	wire []byte
}

// varFlag marks a variable-length field in Template.proto. Accessors
// mask types with 31, so it never reaches a type test.
const varFlag DataType = 0x80

// spanType is the type a span carries: a type no accessor reads (31)
// for a number outside the registry's types, so that typeSet tests can
// mask the shift.
func spanType(t DataType) DataType {
	if t >= numDataTypes {
		return 31
	}
	return t
}

// span locates a field's value inside a record, data[off:end], and carries
// the field's type, so that a typed accessor checks index, type and bounds
// from one 6-octet load and stays small enough for Go to inline.
type span struct {
	off, end uint16
	typ      DataType
}

// IsOptions reports whether t is an options template.
func (t *Template) IsOptions() bool { return t.ScopeFieldCount > 0 }

// FixedLength is the length of every record of t, or -1 if t has variable
// length fields.
func (t *Template) FixedLength() int { return t.fixedLen }

// Index returns the position of the first field with the given identity,
// or -1.
func (t *Template) Index(enterprise uint32, id uint16) int {
	for i := range t.Fields {
		if t.Fields[i].ID == id && t.Fields[i].EnterpriseID == enterprise {
			return i
		}
	}
	return -1
}

// IndexOf returns the position of the first field carrying ie, or -1.
func (t *Template) IndexOf(ie *InfoElement) int { return t.Index(ie.EnterpriseID, ie.ID) }

// NewTemplate builds a template for encoding from an ordered field list. A
// field whose Length is zero takes its element's default length. Every
// field must name a registered element, so that values can be type-checked
// as they are written.
func NewTemplate(id uint16, fields []Field) (*Template, error) {
	if id < MinDataSetID {
		return nil, fmt.Errorf("ipfix: template ID %d is below %d", id, MinDataSetID)
	}
	if len(fields) == 0 {
		return nil, errors.New("ipfix: a template needs at least one field")
	}
	fs := make([]Field, len(fields))
	for i, f := range fields {
		if f.IE == nil {
			return nil, fmt.Errorf("ipfix: template %d field %d (%d:%d) has no element description", id, i, f.EnterpriseID, f.ID)
		}
		f.EnterpriseID, f.ID = f.IE.EnterpriseID, f.IE.ID
		if f.Length == 0 {
			f.Length = f.IE.DefaultLength()
		}
		if !f.IE.Type.ValidLength(f.Length) {
			return nil, fmt.Errorf("ipfix: template %d field %d (%s): length %d is not valid for %s", id, i, f.IE.Name, f.Length, f.IE.Type)
		}
		f.Type = f.IE.Type
		fs[i] = f
	}
	t := &Template{ID: id, Fields: fs}
	t.layout()
	t.wire = t.appendFieldSpecs(nil)
	return t, nil
}

// TemplateOf is NewTemplate for a list of elements at their default lengths.
func TemplateOf(id uint16, elems ...*InfoElement) (*Template, error) {
	fs := make([]Field, len(elems))
	for i, ie := range elems {
		fs[i] = Field{IE: ie}
	}
	return NewTemplate(id, fs)
}

// layout computes the encoder's plan, minLen and, for all-fixed templates,
// the field spans.
func (t *Template) layout() {
	t.ops = planFields(t.Fields)
	t.names = make([]string, len(t.Fields))
	for i := range t.Fields {
		t.names[i] = t.Fields[i].Name()
	}
	t.absent = "the element is not in template " + strconv.Itoa(int(t.ID))
	t.minLen, t.fixedLen = 0, 0
	for i := range t.Fields {
		if t.Fields[i].Variable() {
			t.minLen++
			t.fixedLen = -1
		} else {
			t.minLen += int(t.Fields[i].Length)
		}
	}
	t.fixed, t.proto, t.head = nil, nil, 0
	if t.fixedLen < 0 || t.minLen > maxMessageLen {
		if t.fixedLen >= 0 {
			t.fixedLen = -1
		}
		t.layoutProto()
		return
	}
	t.fixedLen = t.minLen
	t.fixed = make([]span, len(t.Fields))
	off := 0
	for i := range t.Fields {
		t.fixed[i] = span{uint16(off), uint16(off) + t.Fields[i].Length, spanType(t.Fields[i].Type)}
		off += int(t.Fields[i].Length)
	}
}

// layoutProto computes proto and head. Relative offsets wrap when the
// fixed fields between two variable ones exceed 65535 octets; the
// decoder never uses them then, as no set is that long.
func (t *Template) layoutProto() {
	t.proto = make([]span, len(t.Fields))
	v := -1 // the last variable field
	size := 0
	for i := range t.Fields {
		f := &t.Fields[i]
		t.proto[i].typ = spanType(f.Type)
		if !f.Variable() {
			t.proto[i].off = uint16(size)
			t.proto[i].end = uint16(size + int(f.Length))
			size += int(f.Length)
			continue
		}
		t.setRun(v, size)
		t.proto[i].typ |= varFlag
		t.proto[i].off = uint16(size)
		v, size = i, 0
	}
	t.setRun(v, size)
}

// setRun records size, the length of the fixed fields after variable
// field v (or before the first, v < 0). Sizes beyond 65535 become 65535:
// no record that long fits in a message.
func (t *Template) setRun(v, size int) {
	if v < 0 {
		t.head = size
		return
	}
	t.proto[v].end = uint16(min(size, maxMessageLen))
}

// wireLen is the size of the template record t encodes to.
func (t *Template) wireLen() int {
	n := 4
	if t.IsOptions() {
		n += 2
	}
	return n + len(t.wire)
}

// appendFieldSpecs appends the field specifiers of t in wire form.
func (t *Template) appendFieldSpecs(b []byte) []byte {
	for i := range t.Fields {
		f := &t.Fields[i]
		if f.EnterpriseID != 0 {
			b = append(b, byte(f.ID>>8)|0x80, byte(f.ID), byte(f.Length>>8), byte(f.Length))
			b = append(b, byte(f.EnterpriseID>>24), byte(f.EnterpriseID>>16), byte(f.EnterpriseID>>8), byte(f.EnterpriseID))
		} else {
			b = append(b, byte(f.ID>>8), byte(f.ID), byte(f.Length>>8), byte(f.Length))
		}
	}
	return b
}

// resolve sets a decoded field's element description and read type.
func (f *Field) resolve(reg *Registry) {
	f.Type = OctetArray
	f.IE = nil
	if ie, ok := reg.Lookup(f.EnterpriseID, f.ID); ok {
		f.IE = ie
		// Integers wider than their registered size still read as
		// integers: older registries typed some elements wider (e.g.
		// forwardingStatus was unsigned32) and exporters still send them.
		wideInt := (ie.Type.IsUnsigned() || ie.Type.IsSigned()) && f.Length >= 1 && f.Length <= 8
		if wideInt || ie.Type.ValidLength(f.Length) {
			f.Type = ie.Type
		}
	}
}
