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
// walks the template's own field list, so the values can never be written
// in another order than the template announces.
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
	scratch  []byte
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
	e.buf = make([]byte, 0, opts.MaxMessageSize)
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
	if err := e.emit(b); err != nil {
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
// writer for its values, which stays valid until End.
func (e *Encoder) Record(domain uint32, t *Template) *RecordWriter {
	w := &e.w
	w.t, w.i, w.err = t, 0, nil
	if err := e.beginSet(domain, t.ID); err != nil {
		w.err = err
		return w
	}
	e.openSet(t.ID)
	w.start = len(e.buf)
	return w
}

// RecordWriter appends the values of one data record, in template order.
// Each method checks the next field's type; the first error sticks and is
// returned by End, which then discards the record.
type RecordWriter struct {
	e     *Encoder
	t     *Template
	i     int
	start int
	err   error
}

// next returns the next field if its type is in want, else records an
// error. The fast path is small enough to inline into every writer method.
func (w *RecordWriter) next(want typeSet) *Field {
	i, fs := w.i, w.t.Fields
	if w.err == nil && uint(i) < uint(len(fs)) && want&(1<<fs[i].Type) != 0 {
		w.i = i + 1
		return &fs[i]
	}
	return w.mismatch(want)
}

// mismatch records why next refused.
func (w *RecordWriter) mismatch(want typeSet) *Field {
	switch {
	case w.err != nil:
	case w.i >= len(w.t.Fields):
		w.err = &FieldError{Index: w.i, Name: "?", Msg: fmt.Sprintf("template %d has only %d fields", w.t.ID, len(w.t.Fields))}
	default:
		f := &w.t.Fields[w.i]
		w.err = &FieldError{Index: w.i, Name: f.Name(), Type: f.Type, Msg: "cannot write " + want.String()}
	}
	return nil
}

// overflow records a value too large for its field.
func (w *RecordWriter) overflow(f *Field, v any) {
	w.fail(f, fmt.Sprintf("value %v does not fit in %d octets", v, f.Length))
}

func (w *RecordWriter) fail(f *Field, msg string) {
	w.err = &FieldError{Index: w.i - 1, Name: f.Name(), Type: f.Type, Msg: msg}
}

// Uint writes an unsigned integer at the field's (possibly reduced) size.
func (w *RecordWriter) Uint(v uint64) *RecordWriter {
	if f := w.next(unsignedTypes); f != nil {
		if f.Length < 8 && v>>(8*f.Length) != 0 {
			w.overflow(f, v)
			return w
		}
		w.e.buf = appendBE(w.e.buf, v, int(f.Length))
	}
	return w
}

// Int writes a signed integer at the field's (possibly reduced) size.
func (w *RecordWriter) Int(v int64) *RecordWriter {
	if f := w.next(signedTypes); f != nil {
		bits := 8 * uint(f.Length)
		if bits < 64 && (v < -(1<<(bits-1)) || v >= 1<<(bits-1)) {
			w.overflow(f, v)
			return w
		}
		w.e.buf = appendBE(w.e.buf, uint64(v), int(f.Length))
	}
	return w
}

// Float writes a float32 or float64 field.
func (w *RecordWriter) Float(v float64) *RecordWriter {
	if f := w.next(floatTypes); f != nil {
		if f.Length == 4 {
			w.e.buf = binary.BigEndian.AppendUint32(w.e.buf, math.Float32bits(float32(v)))
		} else {
			w.e.buf = binary.BigEndian.AppendUint64(w.e.buf, math.Float64bits(v))
		}
	}
	return w
}

// Bool writes a boolean field.
func (w *RecordWriter) Bool(v bool) *RecordWriter {
	if f := w.next(boolTypes); f != nil {
		c := byte(2)
		if v {
			c = 1
		}
		w.e.buf = append(w.e.buf, c)
	}
	return w
}

// Addr writes an address field. The zero Addr writes an all-zero address
// of the field's family (how unset addresses travel in fixed-size fields).
func (w *RecordWriter) Addr(a netip.Addr) *RecordWriter {
	if f := w.next(addrTypes); f != nil {
		switch {
		case !a.IsValid():
			w.e.buf = append(w.e.buf, make([]byte, f.Length)...)
		case f.Type == IPv4Address && a.Is4():
			b := a.As4()
			w.e.buf = append(w.e.buf, b[:]...)
		case f.Type == IPv6Address && a.Is6():
			b := a.As16()
			w.e.buf = append(w.e.buf, b[:]...)
		default:
			w.fail(f, "address "+a.String()+" is of the other family")
		}
	}
	return w
}

// MAC writes a macAddress field.
func (w *RecordWriter) MAC(m [6]byte) *RecordWriter {
	if f := w.next(macTypes); f != nil {
		w.e.buf = append(w.e.buf, m[:]...)
	}
	return w
}

// Time writes any dateTime field.
func (w *RecordWriter) Time(t time.Time) *RecordWriter {
	if f := w.next(timeTypes); f != nil {
		switch f.Type {
		case DateTimeSeconds:
			w.e.buf = binary.BigEndian.AppendUint32(w.e.buf, uint32(t.Unix()))
		case DateTimeMilliseconds:
			w.e.buf = binary.BigEndian.AppendUint64(w.e.buf, uint64(t.UnixMilli()))
		default:
			sec := uint32(t.Unix() + ntpEpochOffset)
			frac := (uint64(t.Nanosecond()) << 32) / 1e9
			if f.Type == DateTimeMicroseconds {
				frac &^= 0x7ff
			}
			w.e.buf = binary.BigEndian.AppendUint32(w.e.buf, sec)
			w.e.buf = binary.BigEndian.AppendUint32(w.e.buf, uint32(frac))
		}
	}
	return w
}

// String writes a string field; see Bytes for the length rules.
func (w *RecordWriter) String(s string) *RecordWriter {
	if f := w.next(stringTypes); f != nil {
		appendOctets(w, f, s)
	}
	return w
}

// Bytes writes an octetArray field (or any field whose type the encoder
// treats as raw octets). A fixed-length field must get exactly its length;
// a variable-length one takes a length prefix (RFC 7011 §7).
func (w *RecordWriter) Bytes(b []byte) *RecordWriter {
	if f := w.next(octetTypes); f != nil {
		appendOctets(w, f, b)
	}
	return w
}

func appendOctets[T ~string | ~[]byte](w *RecordWriter, f *Field, v T) {
	n := len(v)
	switch {
	case f.Length != VariableLength:
		if n != int(f.Length) {
			w.fail(f, fmt.Sprintf("value of %d octets for a field of %d", n, f.Length))
			return
		}
	case n < 255:
		w.e.buf = append(w.e.buf, byte(n))
	case n <= maxMessageLen:
		w.e.buf = append(w.e.buf, 255, byte(n>>8), byte(n))
	default:
		w.fail(f, fmt.Sprintf("value of %d octets is longer than any message", n))
		return
	}
	w.e.buf = append(w.e.buf, v...)
}

// End finishes the record. If it made the message larger than the maximum
// size, the message is sent without it and the record starts the next one.
// On error nothing of the record is kept.
func (w *RecordWriter) End() error {
	e := w.e
	if w.err == nil && w.i != len(w.t.Fields) {
		w.err = &FieldError{Index: w.i, Name: w.t.Fields[w.i].Name(), Type: w.t.Fields[w.i].Type, Msg: "not written"}
	}
	if w.err != nil {
		if e.open && w.start > 0 && len(e.buf) >= w.start {
			e.buf = e.buf[:w.start]
			e.dropEmptySet(w.start)
		}
		return w.err
	}
	if len(e.buf) <= e.max {
		e.records++
		return nil
	}
	rec := len(e.buf) - w.start
	if headerLen+setHeaderLen+rec > e.max {
		e.buf = e.buf[:w.start]
		e.dropEmptySet(w.start)
		return fmt.Errorf("data record of template %d (%d octets): %w", w.t.ID, rec, ErrTooLarge)
	}
	e.scratch = append(e.scratch[:0], e.buf[w.start:]...)
	e.buf = e.buf[:w.start]
	e.dropEmptySet(w.start)
	domain := e.domain
	if err := e.Flush(); err != nil {
		return err
	}
	if err := e.begin(domain); err != nil {
		return err
	}
	e.openSet(w.t.ID)
	e.buf = append(e.buf, e.scratch...)
	e.records++
	return nil
}

// dropEmptySet removes the open set's header if the record that was to
// start at recStart was its first: an empty set must not be sent.
func (e *Encoder) dropEmptySet(recStart int) {
	if e.setStart >= 0 && e.setStart == recStart-setHeaderLen {
		e.buf = e.buf[:e.setStart]
		e.setStart = -1
	}
}

func appendBE(b []byte, v uint64, n int) []byte {
	switch n {
	case 1:
		return append(b, byte(v))
	case 2:
		return binary.BigEndian.AppendUint16(b, uint16(v))
	case 4:
		return binary.BigEndian.AppendUint32(b, uint32(v))
	case 8:
		return binary.BigEndian.AppendUint64(b, v)
	}
	for i := n - 1; i >= 0; i-- {
		b = append(b, byte(v>>(8*uint(i))))
	}
	return b
}
