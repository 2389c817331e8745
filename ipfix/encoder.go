package ipfix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"
)

// EncoderOptions configures an Encoder.
type EncoderOptions struct {
	// MaxMessageSize bounds every message; zero means 65535. Messages
	// smaller than 512 octets are refused as a configuration error.
	MaxMessageSize int
	// Now stamps the export time of each message; nil means time.Now.
	Now func() time.Time
	// OneSetPerMessage starts a new message whenever the set changes
	// (template set, or a data set of another template). RFC 7011 allows
	// many sets per message, but go-ipfix's collector, and so Antrea's
	// Flow Aggregator, reads only the first set of each.
	OneSetPerMessage bool
}

// ErrTooLarge is returned when one record or template alone cannot fit in
// a message of the maximum size.
var ErrTooLarge = errors.New("ipfix: record does not fit in a message")

// Encoder builds IPFIX messages into a reused buffer and hands each
// finished message to an emit function. It keeps per-observation-domain
// sequence numbers. It is not safe for concurrent use.
//
// Data records are written field by field through a RecordWriter that
// follows the template's own field list (a plan computed once per
// template), so the values can never be written in another order or of
// another type than the template announces.
type Encoder struct {
	max    int
	now    func() time.Time
	oneSet bool
	emit   func(msg []byte) error

	buf     []byte
	domain  uint32
	open    bool // a message is being built
	records uint32
	// setStart is the offset of the open set's header, -1 if none;
	// setID its ID.
	setStart int
	setID    uint16
	seq      map[uint32]uint32
	w        RecordWriter
}

// NewEncoder returns an encoder that passes each finished message to emit.
// The slice passed to emit is reused afterwards: emit must copy it or be
// done with it when it returns.
func NewEncoder(opts EncoderOptions, emit func(msg []byte) error) (*Encoder, error) {
	if opts.MaxMessageSize == 0 {
		opts.MaxMessageSize = maxMessageLen
	}
	if opts.MaxMessageSize < 512 || opts.MaxMessageSize > maxMessageLen {
		return nil, fmt.Errorf("ipfix: maximum message size %d is outside 512..%d", opts.MaxMessageSize, maxMessageLen)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	e := &Encoder{max: opts.MaxMessageSize, now: opts.Now, emit: emit, seq: map[uint32]uint32{}, setStart: -1, oneSet: opts.OneSetPerMessage}
	// Records are written past the message's end before End decides
	// where they go, so the buffer holds a full message, a set header and
	// the largest record (plus the slack of the writers' 8- and 16-octet
	// stores): it never grows, and a record that overruns it cannot fit in
	// any message.
	e.buf = make([]byte, 0, 2*opts.MaxMessageSize+64)
	e.w.e = e
	return e, nil
}

// Discard drops the message being built, for an exporting process that
// lost its connection: what was encoded for the old connection may depend
// on templates the new one has not seen. It returns how many data records
// were dropped.
func (e *Encoder) Discard() int {
	n := int(e.records)
	e.open, e.records, e.setStart = false, 0, -1
	e.buf = e.buf[:0]
	return n
}

// PendingRecords is the number of data records in the message being
// built; an emit function that fails can use it to count what it lost.
func (e *Encoder) PendingRecords() int { return int(e.records) }

// SequenceNumber is the number of data records sent so far in domain.
func (e *Encoder) SequenceNumber(domain uint32) uint32 { return e.seq[domain] }

// begin makes sure a message for domain is open.
func (e *Encoder) begin(domain uint32) error {
	if e.open && e.domain != domain {
		if err := e.Flush(); err != nil {
			return err
		}
	}
	if !e.open {
		e.buf = append(e.buf[:0], make([]byte, headerLen)...)
		e.domain, e.open, e.records, e.setStart = domain, true, 0, -1
	}
	return nil
}

// beginSet makes sure a message for domain is open and, with
// OneSetPerMessage, that it holds no set other than one with the given ID.
func (e *Encoder) beginSet(domain uint32, id uint16) error {
	if e.oneSet && e.open && e.domain == domain && len(e.buf) > headerLen && (e.setStart < 0 || e.setID != id) {
		if err := e.Flush(); err != nil {
			return err
		}
	}
	return e.begin(domain)
}

// openSet makes sure a set with the given ID is the last one of the
// message, closing any other.
func (e *Encoder) openSet(id uint16) {
	if e.setStart >= 0 && e.setID == id {
		return
	}
	e.closeSet()
	e.setStart, e.setID = len(e.buf), id
	e.buf = append(e.buf, byte(id>>8), byte(id), 0, 0)
}

func (e *Encoder) closeSet() {
	if e.setStart < 0 {
		return
	}
	binary.BigEndian.PutUint16(e.buf[e.setStart+2:], uint16(len(e.buf)-e.setStart))
	e.setStart = -1
}

// Flush sends the message being built, if it holds anything.
func (e *Encoder) Flush() error {
	if !e.open {
		return nil
	}
	e.closeSet()
	e.open = false
	if len(e.buf) == headerLen {
		return nil
	}
	b := e.buf
	binary.BigEndian.PutUint16(b[0:], Version)
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	binary.BigEndian.PutUint32(b[4:], uint32(e.now().Unix()))
	binary.BigEndian.PutUint32(b[8:], e.seq[e.domain])
	binary.BigEndian.PutUint32(b[12:], e.domain)
	// A full slice expression, so that an emit that appends cannot
	// overwrite a record waiting past the message's end (see spill).
	if err := e.emit(b[:len(b):len(b)]); err != nil {
		return err
	}
	// Only records that left count towards the next sequence number.
	e.seq[e.domain] += e.records
	e.records = 0
	return nil
}

// AddTemplate writes t's template record into the current message of
// domain (starting one if needed).
func (e *Encoder) AddTemplate(domain uint32, t *Template) error {
	setID := TemplateSetID
	if t.IsOptions() {
		setID = OptionsTemplateSetID
	}
	need := t.wireLen()
	if headerLen+setHeaderLen+need > e.max {
		return fmt.Errorf("template %d (%d octets): %w", t.ID, need, ErrTooLarge)
	}
	if err := e.beginSet(domain, setID); err != nil {
		return err
	}
	extra := need
	if e.setStart < 0 || e.setID != setID {
		extra += setHeaderLen
	}
	if len(e.buf)+extra > e.max {
		if err := e.Flush(); err != nil {
			return err
		}
		if err := e.begin(domain); err != nil {
			return err
		}
	}
	e.openSet(setID)
	e.buf = append(e.buf, byte(t.ID>>8), byte(t.ID), byte(len(t.Fields)>>8), byte(len(t.Fields)))
	if t.IsOptions() {
		e.buf = append(e.buf, byte(t.ScopeFieldCount>>8), byte(t.ScopeFieldCount))
	}
	e.buf = t.appendFieldSpecs(e.buf)
	return nil
}

// WithdrawTemplate writes a withdrawal of template id (RFC 7011 §8.1).
// Only meaningful on reliable transports.
func (e *Encoder) WithdrawTemplate(domain uint32, id uint16, options bool) error {
	setID := TemplateSetID
	if options {
		setID = OptionsTemplateSetID
	}
	if err := e.beginSet(domain, setID); err != nil {
		return err
	}
	if len(e.buf)+setHeaderLen+4 > e.max {
		if err := e.Flush(); err != nil {
			return err
		}
		if err := e.begin(domain); err != nil {
			return err
		}
	}
	e.openSet(setID)
	e.buf = append(e.buf, byte(id>>8), byte(id), 0, 0)
	return nil
}

// Record starts a data record of template t in domain and returns the
// writer for its values, which stays valid until End. t must come from
// NewTemplate, TemplateOf or a Session.
func (e *Encoder) Record(domain uint32, t *Template) *RecordWriter {
	w := &e.w
	w.t, w.ops = t, t.ops
	// The common case, another record of the set being built, needs none
	// of beginSet's checks.
	if !e.open || e.domain != domain || e.setStart < 0 || e.setID != t.ID {
		if err := e.beginSet(domain, t.ID); err != nil {
			w.err, w.i = err, len(t.ops)+1
			return w
		}
		e.openSet(t.ID)
	}
	w.b = e.buf[:cap(e.buf)]
	w.i, w.n, w.start, w.err = 0, len(e.buf), len(e.buf), nil
	if len(t.ops) != len(t.Fields) {
		w.err, w.i = fmt.Errorf("ipfix: template %d was not built by NewTemplate or a Session", t.ID), len(t.ops)+1
	}
	return w
}

// RecordWriter writes the values of one data record, in template order.
// Each method checks the next field's type against the template's plan
// (one compare) and stores the value at the end of the record, in the
// encoder's buffer beyond the message's length; End commits it. The first
// error sticks and is returned by End, which then discards the record.
type RecordWriter struct {
	e   *Encoder
	t   *Template
	ops []fieldOp
	// b is the encoder's whole buffer. It is larger than any message plus
	// any record, so a write that does not fit means the record can never
	// fit in a message (see NewEncoder).
	b []byte
	// i is the next field; i > len(ops) once a write has failed, so that
	// every later write fails at its first compare.
	i     int
	n     int // where the next value goes in b
	start int // where the record starts in b
	err   error
	// The first failed write: field, method and value (or length), from
	// which End builds the error off the hot path.
	fi int
	fc wclass
	fv uint64
	fa netip.Addr
}

// wclass is the RecordWriter method that writes a field: every data type
// is written by exactly one. Variable- and fixed-length octets differ so
// that the common variable-length case is one compare.
type wclass uint8

const (
	wNone wclass = iota
	wUint
	wInt
	wFloat
	wBool
	wAddr
	wMAC
	wTime
	wString // variable length
	wStringFixed
	wOctets // variable length
	wOctetsFixed
)

// classTypes is the set of data types each method writes, for errors.
var classTypes = [...]typeSet{
	wUint: unsignedTypes, wInt: signedTypes, wFloat: floatTypes, wBool: boolTypes, wAddr: addrTypes,
	wMAC: macTypes, wTime: timeTypes, wString: stringTypes, wStringFixed: stringTypes,
	wOctets: octetTypes, wOctetsFixed: octetTypes,
}

// fieldOp is how a RecordWriter writes one template field.
type fieldOp struct {
	cls wclass
	typ DataType
	// shift is 64 - 8*length for integers: a value shifted left by it
	// and back is unchanged exactly when it fits in the field, and
	// shifted left it is the field's octets at the top of a big-endian
	// uint64.
	shift  uint8
	_      uint8
	length uint16
	_      uint16
}

// opFor returns the plan of field f. Templates guarantee that integer
// fields are 1 to 8 octets and other fixed types have their own size.
func opFor(f *Field) fieldOp {
	op := fieldOp{typ: f.Type, length: f.Length}
	variable := f.Length == VariableLength
	switch t := f.Type; {
	case unsignedTypes.has(t):
		op.cls = wUint
	case signedTypes.has(t):
		op.cls = wInt
	case floatTypes.has(t):
		op.cls = wFloat
	case boolTypes.has(t):
		op.cls = wBool
	case addrTypes.has(t):
		op.cls = wAddr
	case macTypes.has(t):
		op.cls = wMAC
	case timeTypes.has(t):
		op.cls = wTime
	case stringTypes.has(t) && variable:
		op.cls = wString
	case stringTypes.has(t):
		op.cls = wStringFixed
	case variable:
		op.cls = wOctets
	default:
		op.cls = wOctetsFixed
	}
	if (op.cls == wUint || op.cls == wInt) && f.Length >= 1 && f.Length <= 8 {
		op.shift = uint8(64 - 8*f.Length)
	}
	return op
}

// stop records a failed write of method c for field i, unless an earlier
// one failed already, and makes every later write fail.
func (w *RecordWriter) stop(i int, c wclass, v uint64) {
	if i <= len(w.ops) {
		w.fi, w.fc, w.fv, w.i = i, c, v, len(w.ops)+1
	}
}

// Uint writes an unsigned integer at the field's (possibly reduced) size.
func (w *RecordWriter) Uint(v uint64) *RecordWriter {
	i, n := w.i, w.n
	if i < len(w.ops) && n+8 <= len(w.b) {
		op := w.ops[i]
		s := op.shift & 63
		if op.cls == wUint && v<<s>>s == v {
			// All 8 octets are stored; those past the field's length
			// are overwritten by the next value or cut off by End.
			binary.BigEndian.PutUint64(w.b[n:], v<<s)
			w.i, w.n = i+1, n+int(op.length)
			return w
		}
	}
	w.stop(i, wUint, v)
	return w
}

// Int writes a signed integer at the field's (possibly reduced) size.
func (w *RecordWriter) Int(v int64) *RecordWriter {
	i, n := w.i, w.n
	if i < len(w.ops) && n+8 <= len(w.b) {
		op := w.ops[i]
		s := op.shift & 63
		if op.cls == wInt && v<<s>>s == v {
			binary.BigEndian.PutUint64(w.b[n:], uint64(v)<<s)
			w.i, w.n = i+1, n+int(op.length)
			return w
		}
	}
	w.stop(i, wInt, uint64(v))
	return w
}

// Float writes a float32 or float64 field.
func (w *RecordWriter) Float(v float64) *RecordWriter {
	i, n := w.i, w.n
	if i < len(w.ops) && n+8 <= len(w.b) && w.ops[i].cls == wFloat {
		if w.ops[i].length == 4 {
			binary.BigEndian.PutUint32(w.b[n:], math.Float32bits(float32(v)))
			w.n = n + 4
		} else {
			binary.BigEndian.PutUint64(w.b[n:], math.Float64bits(v))
			w.n = n + 8
		}
		w.i = i + 1
		return w
	}
	w.stop(i, wFloat, 0)
	return w
}

// Bool writes a boolean field.
func (w *RecordWriter) Bool(v bool) *RecordWriter {
	i, n := w.i, w.n
	if i < len(w.ops) && n < len(w.b) && w.ops[i].cls == wBool {
		c := byte(2)
		if v {
			c = 1
		}
		w.b[n] = c
		w.i, w.n = i+1, n+1
		return w
	}
	w.stop(i, wBool, 0)
	return w
}

// Addr writes an address field. The zero Addr writes an all-zero address
// of the field's family (how unset addresses travel in fixed-size fields).
func (w *RecordWriter) Addr(a netip.Addr) *RecordWriter {
	i, n := w.i, w.n
	if i < len(w.ops) && n+16 <= len(w.b) && w.ops[i].cls == wAddr {
		op := w.ops[i]
		ok := true
		switch {
		case op.typ == IPv4Address && a.Is4():
			b := a.As4()
			copy(w.b[n:], b[:])
		case op.typ == IPv6Address && a.Is6():
			b := a.As16()
			copy(w.b[n:], b[:])
		case !a.IsValid():
			clear(w.b[n : n+int(op.length)])
		default:
			ok = false
		}
		if ok {
			w.i, w.n = i+1, n+int(op.length)
			return w
		}
	}
	if i <= len(w.ops) {
		w.fa = a
	}
	w.stop(i, wAddr, 0)
	return w
}

// MAC writes a macAddress field.
func (w *RecordWriter) MAC(m [6]byte) *RecordWriter {
	i, n := w.i, w.n
	if i < len(w.ops) && n+6 <= len(w.b) && w.ops[i].cls == wMAC {
		copy(w.b[n:], m[:])
		w.i, w.n = i+1, n+6
		return w
	}
	w.stop(i, wMAC, 0)
	return w
}

// Time writes any dateTime field.
func (w *RecordWriter) Time(t time.Time) *RecordWriter {
	i, n := w.i, w.n
	if i < len(w.ops) && n+8 <= len(w.b) && w.ops[i].cls == wTime {
		switch w.ops[i].typ {
		case DateTimeSeconds:
			binary.BigEndian.PutUint32(w.b[n:], uint32(t.Unix()))
			n += 4
		case DateTimeMilliseconds:
			binary.BigEndian.PutUint64(w.b[n:], uint64(t.UnixMilli()))
			n += 8
		default:
			sec := uint32(t.Unix() + ntpEpochOffset)
			frac := (uint64(t.Nanosecond()) << 32) / 1e9
			if w.ops[i].typ == DateTimeMicroseconds {
				frac &^= 0x7ff
			}
			binary.BigEndian.PutUint32(w.b[n:], sec)
			binary.BigEndian.PutUint32(w.b[n+4:], uint32(frac))
			n += 8
		}
		w.i, w.n = i+1, n
		return w
	}
	w.stop(i, wTime, 0)
	return w
}

// String writes a string field; see Bytes for the length rules.
func (w *RecordWriter) String(s string) *RecordWriter {
	i, n := w.i, w.n
	// The common case: a short value in a variable-length field.
	if i < len(w.ops) && len(s) < 255 && n+1+len(s) <= len(w.b) && w.ops[i].cls == wString {
		w.b[n] = byte(len(s))
		copy(w.b[n+1:], s)
		w.i, w.n = i+1, n+1+len(s)
		return w
	}
	writeOctets(w, s, wString)
	return w
}

// Bytes writes an octetArray field (or any field whose type the encoder
// treats as raw octets). A fixed-length field must get exactly its length;
// a variable-length one takes a length prefix (RFC 7011 §7).
func (w *RecordWriter) Bytes(b []byte) *RecordWriter {
	writeOctets(w, b, wOctets)
	return w
}

// writeOctets writes v with method c (wString or wOctets) in all cases.
func writeOctets[T ~string | ~[]byte](w *RecordWriter, v T, c wclass) {
	i, n, l := w.i, w.n, len(v)
	if i >= len(w.ops) {
		w.stop(i, c, uint64(l))
		return
	}
	op := w.ops[i]
	switch {
	case op.cls == c+1 && l == int(op.length): // fixed length (wStringFixed, wOctetsFixed)
	case op.cls != c:
		w.stop(i, c, uint64(l))
		return
	case l < 255:
		if n+1+l > len(w.b) {
			w.stop(i, c, uint64(l))
			return
		}
		w.b[n] = byte(l)
		n++
	case l <= maxMessageLen && n+3+l <= len(w.b):
		w.b[n], w.b[n+1], w.b[n+2] = 255, byte(l>>8), byte(l)
		n += 3
	default:
		w.stop(i, c, uint64(l))
		return
	}
	if n+l > len(w.b) {
		w.stop(i, c, uint64(l))
		return
	}
	copy(w.b[n:], v)
	w.i, w.n = i+1, n+l
}

// End finishes the record. If it made the message larger than the maximum
// size, the message is sent without it and the record starts the next one.
// On error nothing of the record is kept.
func (w *RecordWriter) End() error {
	e := w.e
	if w.i != len(w.ops) {
		if w.err != nil {
			return w.err
		}
		e.dropEmptySet(w.start)
		return w.failure()
	}
	if w.n <= e.max {
		e.buf = e.buf[:w.n]
		e.records++
		return nil
	}
	return w.spill()
}

// spill moves a record that made the message too large into the next one.
func (w *RecordWriter) spill() error {
	e := w.e
	rec := w.n - w.start
	e.dropEmptySet(w.start)
	if headerLen+setHeaderLen+rec > e.max {
		return fmt.Errorf("data record of template %d (%d octets): %w", w.t.ID, rec, ErrTooLarge)
	}
	domain := e.domain
	if err := e.Flush(); err != nil {
		return err
	}
	if err := e.begin(domain); err != nil {
		return err
	}
	e.openSet(w.t.ID)
	// The record still lies past the (new) message's end; the header and
	// set header just written end before it starts, and copy handles any
	// overlap.
	k := len(e.buf)
	e.buf = e.buf[:k+rec]
	copy(e.buf[k:], w.b[w.start:w.n])
	e.records++
	return nil
}

// failure builds the error of a record that End refuses, from the first
// failed write.
func (w *RecordWriter) failure() error {
	fs, ops := w.t.Fields, w.ops
	if w.i < len(ops) {
		f := &fs[w.i]
		return &FieldError{Index: w.i, Name: f.Name(), Type: f.Type, Msg: "not written"}
	}
	i := w.fi
	if i >= len(ops) {
		return &FieldError{Index: i, Name: "?", Msg: fmt.Sprintf("template %d has only %d fields", w.t.ID, len(fs))}
	}
	f, op := &fs[i], ops[i]
	fail := func(msg string) error { return &FieldError{Index: i, Name: f.Name(), Type: f.Type, Msg: msg} }
	want := classTypes[w.fc]
	if !want.has(f.Type) {
		return fail("cannot write " + want.String())
	}
	s := op.shift & 63
	switch w.fc {
	case wUint:
		if w.fv<<s>>s != w.fv {
			return fail(fmt.Sprintf("value %d does not fit in %d octets", w.fv, f.Length))
		}
	case wInt:
		if v := int64(w.fv); v<<s>>s != v {
			return fail(fmt.Sprintf("value %d does not fit in %d octets", v, f.Length))
		}
	case wAddr:
		if w.fa.IsValid() {
			return fail("address " + w.fa.String() + " is of the other family")
		}
	case wString, wOctets:
		switch l := w.fv; {
		case f.Length != VariableLength && l != uint64(f.Length):
			return fail(fmt.Sprintf("value of %d octets for a field of %d", l, f.Length))
		case l > maxMessageLen:
			return fail(fmt.Sprintf("value of %d octets is longer than any message", l))
		}
	}
	// The value was right for its field: it is the record that outgrew
	// the buffer, which holds more than any message.
	return fmt.Errorf("data record of template %d (over %d octets): %w", w.t.ID, w.e.max-headerLen-setHeaderLen, ErrTooLarge)
}

// dropEmptySet removes the open set's header if the record that was to
// start at recStart was its first: an empty set must not be sent.
func (e *Encoder) dropEmptySet(recStart int) {
	if e.setStart >= 0 && e.setStart == recStart-setHeaderLen {
		e.buf = e.buf[:e.setStart]
		e.setStart = -1
	}
}
