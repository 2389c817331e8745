package ipfix

import (
	"encoding/binary"
	"strconv"
	"time"
)

// Wire constants of RFC 7011.
const (
	// Version is the IPFIX version number in the message header.
	Version       = 10
	headerLen     = 16
	setHeaderLen  = 4
	maxMessageLen = 0xFFFF
	// HeaderLen is the size of the message header.
	HeaderLen = headerLen
	// MaxMessageLen is the largest message the 16-bit length can describe.
	MaxMessageLen = maxMessageLen
)

// Header is the IPFIX message header.
type Header struct {
	Version uint16
	// Length is the total length of the message, header included.
	Length uint16
	// ExportTime is in seconds since the Unix epoch.
	ExportTime uint32
	// SequenceNumber counts the data records the exporter sent in this
	// observation domain before this message (modulo 2^32).
	SequenceNumber      uint32
	ObservationDomainID uint32
}

// Time is the export time as a time.Time.
func (h Header) Time() time.Time { return time.Unix(int64(h.ExportTime), 0).UTC() }

// ParseHeader reads a message header from the start of b and checks the
// version and that the length covers at least the header. It does not
// require b to hold the whole message: stream framers use it to learn how
// much to read.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < headerLen {
		return Header{}, malformed(0, 0, 0, "message header needs %d octets, have %d", headerLen, len(b))
	}
	h := Header{
		Version:             binary.BigEndian.Uint16(b),
		Length:              binary.BigEndian.Uint16(b[2:]),
		ExportTime:          binary.BigEndian.Uint32(b[4:]),
		SequenceNumber:      binary.BigEndian.Uint32(b[8:]),
		ObservationDomainID: binary.BigEndian.Uint32(b[12:]),
	}
	if h.Version != Version {
		return h, malformed(0, 0, 0, "version %d is not IPFIX (%d)", h.Version, Version)
	}
	if h.Length < headerLen {
		return h, malformed(2, 0, 0, "message length %d is shorter than the header", h.Length)
	}
	return h, nil
}

// Decoder walks the data records of one message at a time, applying the
// message's template sets to its Session as it meets them, in order (so a
// template and its data may share a message). Reuse one Decoder per
// session: in steady state it allocates nothing.
//
//	d := ipfix.NewDecoder(sess)
//	if err := d.Reset(msg, time.Now()); err != nil { ... }
//	for d.Next() {
//		rec := d.Record()
//		...
//	}
//	if err := d.Err(); err != nil { ... }
//
// Records are views into msg, valid until the next Reset; the caller must
// not modify msg meanwhile.
type Decoder struct {
	sess *Session
	now  time.Time
	msg  []byte
	hdr  Header
	// off is the offset of the next set header; setEnd the end of the
	// current data set (0 when none is open); recOff the next record.
	off, setEnd, recOff int
	setID               uint16
	tmpl                *Template
	rec                 Record
	spans               []span
	err                 error
}

// NewDecoder returns a decoder that keeps its templates in sess.
func NewDecoder(sess *Session) *Decoder { return &Decoder{sess: sess} }

// Session is the session the decoder updates.
func (d *Decoder) Session() *Session { return d.sess }

// Reset starts decoding msg, which must be exactly one message. now is
// used for template expiry.
func (d *Decoder) Reset(msg []byte, now time.Time) error {
	d.msg, d.now = msg, now
	d.off, d.setEnd, d.recOff, d.setID, d.tmpl, d.err = headerLen, 0, 0, 0, nil, nil
	h, err := ParseHeader(msg)
	d.hdr = h
	if err == nil && int(h.Length) != len(msg) {
		err = malformed(2, 0, 0, "message length field says %d octets, message has %d", h.Length, len(msg))
	}
	if err != nil {
		d.err = err
		d.off = len(msg)
		return err
	}
	d.sess.Stats.Messages++
	return nil
}

// Header is the header of the current message.
func (d *Decoder) Header() Header { return d.hdr }

// Err is the error that stopped Next, if any. Records returned before the
// error are valid; the rest of the message is not decoded.
func (d *Decoder) Err() error { return d.err }

// Record is the current record, valid until the next call to Next.
func (d *Decoder) Record() *Record { return &d.rec }

// Next advances to the next data record of the message, applying template
// sets on the way. It returns false at the end of the message or on error.
func (d *Decoder) Next() bool {
	for d.err == nil {
		if d.setEnd != 0 {
			if d.nextRecord() {
				return true
			}
			if d.err != nil {
				return false
			}
			d.off, d.setEnd = d.setEnd, 0
		}
		if d.off >= len(d.msg) {
			return false
		}
		d.err = d.nextSet()
	}
	return false
}

// nextSet reads the set header at d.off and either applies a template set,
// skips a set, or opens a data set for nextRecord.
func (d *Decoder) nextSet() error {
	rest := len(d.msg) - d.off
	if rest < setHeaderLen {
		return malformed(d.off, 0, 0, "%d octets after the last set are too few for a set header", rest)
	}
	id := binary.BigEndian.Uint16(d.msg[d.off:])
	n := int(binary.BigEndian.Uint16(d.msg[d.off+2:]))
	if n < setHeaderLen {
		return malformed(d.off+2, id, 0, "set length %d is shorter than a set header", n)
	}
	if n > rest {
		return malformed(d.off+2, id, 0, "set length %d overruns the message (%d octets left)", n, rest)
	}
	body, bodyOff := d.msg[d.off+setHeaderLen:d.off+n], d.off+setHeaderLen
	d.setID = id
	switch {
	case id == TemplateSetID || id == OptionsTemplateSetID:
		d.off += n
		return d.sess.applyTemplateSet(d.hdr.ObservationDomainID, id, body, bodyOff, d.now)
	case id < MinDataSetID:
		d.sess.Stats.ReservedSets++
		d.off += n
		return nil
	}
	t := d.sess.Template(d.hdr.ObservationDomainID, id, d.now)
	if t == nil {
		d.sess.Stats.UnknownTemplateSets++
		d.sess.Stats.UnknownTemplateBytes += uint64(len(body))
		d.off += n
		return nil
	}
	d.tmpl = t
	d.recOff = bodyOff
	d.setEnd = d.off + n
	d.rec.Template = t
	return nil
}

// nextRecord decodes the record at d.recOff in the open data set.
func (d *Decoder) nextRecord() bool {
	t := d.tmpl
	rest := d.setEnd - d.recOff
	// What cannot hold even the smallest record is padding.
	if rest < t.minLen {
		return false
	}
	d.rec.longPrefix = false
	if t.fixedLen >= 0 {
		d.rec.data = d.msg[d.recOff : d.recOff+t.fixedLen]
		d.rec.spans = t.fixed
		d.recOff += t.fixedLen
		d.sess.Stats.DataRecords++
		return true
	}
	if cap(d.spans) < len(t.Fields) {
		d.spans = make([]span, len(t.Fields))
	}
	spans := d.spans[:len(t.Fields)]
	b := d.msg[d.recOff:d.setEnd]
	p, ok := t.place(b, spans)
	if !ok {
		// Malformed or a long length prefix: the field-by-field walk
		// finds which and says where.
		if p, ok = d.walk(t, b, spans); !ok {
			return false
		}
	}
	d.rec.data = b[:p]
	d.rec.spans = spans
	d.recOff += p
	d.sess.Stats.DataRecords++
	return true
}

// place fills spans for a record of t, which has variable-length fields,
// at the start of b, and returns the record's length. ok is false when
// the record is malformed or a variable-length field has a three-octet
// length prefix; walk handles those.
func (t *Template) place(b []byte, spans []span) (p int, ok bool) {
	if len(b) < t.head {
		return 0, false
	}
	proto := t.proto
	spans = spans[:len(proto)]
	base := 0 // where the fixed fields after the last variable one start
	for i, s := range proto {
		if s.typ&varFlag == 0 {
			spans[i] = span{uint16(base) + s.off, uint16(base) + s.end, s.typ}
			continue
		}
		// s.off locates the length octet; s.end is what must follow the
		// value: the fixed fields up to the next variable one.
		p = base + int(s.off)
		if p >= len(b) {
			return 0, false
		}
		l := int(b[p])
		p++
		if l == 255 || len(b)-p-int(s.end) < l {
			return 0, false
		}
		spans[i] = span{uint16(p), uint16(p + l), s.typ &^ varFlag}
		base = p + l
	}
	// The record ends with the last field's span, fixed or variable.
	return int(spans[len(spans)-1].end), true
}

// walk fills spans field by field, for what place does not cover, and
// sets d.err when the record is malformed.
func (d *Decoder) walk(t *Template, b []byte, spans []span) (int, bool) {
	p := 0
	for i := range t.Fields {
		l := int(t.Fields[i].Length)
		if l == VariableLength {
			if p >= len(b) {
				d.err = d.recordError(p, i, "variable-length field needs a length octet")
				return 0, false
			}
			l = int(b[p])
			p++
			if l == 255 {
				if len(b)-p < 2 {
					d.err = d.recordError(p, i, "3-octet length of variable-length field truncated")
					return 0, false
				}
				l = int(binary.BigEndian.Uint16(b[p:]))
				p += 2
				if l < 255 {
					d.rec.longPrefix = true
				}
			}
		}
		if len(b)-p < l {
			d.err = d.recordError(p, i, "value of %d octets overruns the set (%d left)", l, len(b)-p)
			return 0, false
		}
		spans[i] = span{uint16(p), uint16(p + l), t.proto[i].typ &^ varFlag}
		p += l
	}
	return p, true
}

func (d *Decoder) recordError(p, field int, format string, args ...any) error {
	e := malformed(d.recOff+p, d.setID, d.tmpl.ID, format, args...)
	e.Msg = "field " + strconv.Itoa(field) + " (" + d.tmpl.Fields[field].Name() + "): " + e.Msg
	return e
}
