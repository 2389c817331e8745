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
// Data records are written field by field through a RecordBuilder that
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

	// The record being built (see Begin): its template and plan, the
	// whole buffer it is written into, where it starts (-1 if none), why
	// it could not start, and the address of a failed Addr write.
	t     *Template
	ops   []fieldOp
	b     []byte
	start int
	werr  error
	fa    netip.Addr
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
	e.b = e.buf[:cap(e.buf)]
	e.start = -1
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

// Begin starts a data record of template t in domain and returns a
// builder for its values. t must come from NewTemplate, TemplateOf or a
// Session.
//
// A RecordBuilder is a value: each method returns the builder to use next,
// so use one chain, enc.Begin(d, t).Uint(1).String("a").End(), or
// reassign (b = b.Uint(1)). Keeping the state in the caller's registers
// rather than in memory is what makes a write a few instructions. A
// builder is valid until its End or the encoder's next Begin or Record.
func (e *Encoder) Begin(domain uint32, t *Template) RecordBuilder {
	// The common case, another record of the set being built, needs none
	// of beginSet's checks.
	if !e.open || e.domain != domain || e.setStart < 0 || e.setID != t.ID {
		if err := e.beginSet(domain, t.ID); err != nil {
			e.t, e.ops, e.werr, e.start = t, t.ops, err, -1
			return RecordBuilder{e: e, i: failBit | int(wNone)<<failShift}
		}
		e.openSet(t.ID)
	}
	if e.t != t {
		e.t, e.ops = t, t.ops
	}
	if e.werr != nil {
		e.werr = nil
	}
	n := len(e.buf)
	e.start = n
	room := recordSlack
	if len(t.ops) > 0 {
		room = int(t.ops[0].room)
	}
	// One check per record makes every fixed-length write safe: room is
	// the space the template's fixed-length fields need (see fieldOp).
	if n+room > len(e.b) || t.minLen > e.max-headerLen-setHeaderLen || len(t.ops) != len(t.Fields) {
		return RecordBuilder{e: e, i: failBit | int(wNone)<<failShift}
	}
	return RecordBuilder{e: e, n: n}
}

// RecordBuilder writes the values of one data record, in template order;
// see Encoder.Begin. Each method checks the next field's type against the
// template's plan (one compare) and stores the value past the end of the
// message being built; End commits the record. The first error sticks and
// is returned by End, which then discards the record.
type RecordBuilder struct {
	e *Encoder
	// i is the next field. The first failed write sets it to
	// field | failBit | method<<failShift: every later write then fails
	// at its first compare, and End knows which write failed.
	i int
	n int    // where the next value goes in e.b
	v uint64 // the value (or octet count) of the failed write, for End's error
}

const (
	// failBit marks a failed record in RecordBuilder.i; a template that can
	// be encoded has fewer fields than that (each takes at least an octet).
	failBit   = 1 << 16
	failShift = 20
	// recordSlack is the room past the last field that lets writers store
	// 8 or 16 octets whatever the field's length.
	recordSlack = 16
)

// fail records a failed write of method c, unless an earlier one failed.
func (a RecordBuilder) fail(c wclass, v uint64) RecordBuilder {
	if a.i < failBit {
		a.i, a.v = a.i|failBit|int(c)<<failShift, v
	}
	return a
}

// wclass is the RecordBuilder method that writes a field: every data type
// is written by exactly one. Variable- and fixed-length octets differ so
// that the common variable-length case is one compare.
type wclass uint8

const (
	wNone wclass = iota // no write: the record could not start
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

// fieldOp is how a RecordBuilder writes one template field.
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
	// room is recordSlack plus the length of this and every later
	// fixed-length field, capped. Begin checks that the buffer has room
	// for the first field; a fixed-length write keeps that true for the
	// next, and a variable-length one checks its own length plus room.
	room uint32
}

// planFields computes the plan of t's fields.
func planFields(fs []Field) []fieldOp {
	ops := make([]fieldOp, len(fs))
	room := recordSlack
	for i := len(fs) - 1; i >= 0; i-- {
		ops[i] = opFor(&fs[i])
		if !fs[i].Variable() {
			room = min(room+int(fs[i].Length), 4*maxMessageLen)
		}
		ops[i].room = uint32(room)
	}
	return ops
}

// opFor returns the plan of field f. Templates guarantee that integer
// fields are 1 to 8 octets and other fixed types have their own size.
func opFor(f *Field) fieldOp {
	op := fieldOp{typ: f.Type, length: f.Length}
	variable := f.Variable()
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

// Uint writes an unsigned integer at the field's (possibly reduced) size.
func (a RecordBuilder) Uint(v uint64) RecordBuilder {
	e := a.e
	if a.i < len(e.ops) {
		op := &e.ops[a.i]
		if op.cls == wUint && v<<op.shift>>op.shift == v {
			// All 8 octets are stored (room allows it); those past the
			// field are overwritten by the next value or cut off by End.
			binary.BigEndian.PutUint64(e.b[a.n:], v<<op.shift)
			a.i++
			a.n += int(op.length)
			return a
		}
	}
	// a.fail, spelled out to stay within the inlining budget.
	if a.i < failBit {
		a.i, a.v = a.i|failBit|int(wUint)<<failShift, v
	}
	return a
}

// Int writes a signed integer at the field's (possibly reduced) size.
func (a RecordBuilder) Int(v int64) RecordBuilder {
	e := a.e
	if a.i < len(e.ops) {
		op := &e.ops[a.i]
		if op.cls == wInt && v<<op.shift>>op.shift == v {
			binary.BigEndian.PutUint64(e.b[a.n:], uint64(v)<<op.shift)
			a.i++
			a.n += int(op.length)
			return a
		}
	}
	// a.fail, spelled out to stay within the inlining budget.
	if a.i < failBit {
		a.i, a.v = a.i|failBit|int(wInt)<<failShift, uint64(v)
	}
	return a
}

// Float writes a float32 or float64 field.
func (a RecordBuilder) Float(v float64) RecordBuilder {
	e := a.e
	if a.i < len(e.ops) && e.ops[a.i].cls == wFloat {
		if e.ops[a.i].length == 4 {
			binary.BigEndian.PutUint32(e.b[a.n:], math.Float32bits(float32(v)))
			a.n += 4
		} else {
			binary.BigEndian.PutUint64(e.b[a.n:], math.Float64bits(v))
			a.n += 8
		}
		a.i++
		return a
	}
	return a.fail(wFloat, 0)
}

// Bool writes a boolean field.
func (a RecordBuilder) Bool(v bool) RecordBuilder {
	e := a.e
	if a.i < len(e.ops) && e.ops[a.i].cls == wBool {
		c := byte(2)
		if v {
			c = 1
		}
		e.b[a.n] = c
		a.i++
		a.n++
		return a
	}
	return a.fail(wBool, 0)
}

// Addr writes an address field. The zero Addr writes an all-zero address
// of the field's family (how unset addresses travel in fixed-size fields).
func (a RecordBuilder) Addr(addr netip.Addr) RecordBuilder {
	e := a.e
	if a.i < len(e.ops) && e.ops[a.i].cls == wAddr {
		op := &e.ops[a.i]
		// IPv4 first, as one 4-octet store: most addresses are.
		if addr.Is4() && op.typ == IPv4Address {
			binary.BigEndian.PutUint32(e.b[a.n:], uint32FromAddr4(addr))
			a.i++
			a.n += 4
			return a
		}
		switch {
		case op.typ == IPv6Address && addr.Is6():
			b := addr.As16()
			copy(e.b[a.n:], b[:])
		case !addr.IsValid():
			clear(e.b[a.n : a.n+int(op.length)])
		default:
			e.fa = addr
			return a.fail(wAddr, 0)
		}
		a.i++
		a.n += int(op.length)
		return a
	}
	return a.fail(wAddr, 0)
}

// MAC writes a macAddress field.
func (a RecordBuilder) MAC(m [6]byte) RecordBuilder {
	e := a.e
	if a.i < len(e.ops) && e.ops[a.i].cls == wMAC {
		copy(e.b[a.n:], m[:])
		a.i++
		a.n += 6
		return a
	}
	return a.fail(wMAC, 0)
}

// Time writes any dateTime field.
func (a RecordBuilder) Time(t time.Time) RecordBuilder {
	e := a.e
	if a.i < len(e.ops) && e.ops[a.i].cls == wTime {
		b := e.b[a.n:]
		switch typ := e.ops[a.i].typ; typ {
		case DateTimeSeconds:
			binary.BigEndian.PutUint32(b, uint32(t.Unix()))
			a.n += 4
		case DateTimeMilliseconds:
			binary.BigEndian.PutUint64(b, uint64(t.UnixMilli()))
			a.n += 8
		default:
			frac := (uint64(t.Nanosecond()) << 32) / 1e9
			if typ == DateTimeMicroseconds {
				frac &^= 0x7ff
			}
			binary.BigEndian.PutUint64(b, uint64(uint32(t.Unix()+ntpEpochOffset))<<32|frac)
			a.n += 8
		}
		a.i++
		return a
	}
	return a.fail(wTime, 0)
}

// Fixed returns the octets of the next n fields, all of fixed length, for
// the caller to write their values into (in the template's order,
// lengths and types, big-endian: nothing is checked but the lengths), and
// the builder past them. For writers that know a template's layout and
// write a run of fixed-length fields at once. If the fields are not all
// of fixed length, or there are fewer than n, the write fails and the
// returned slice is empty.
func (a RecordBuilder) Fixed(n int) ([]byte, RecordBuilder) {
	e := a.e
	if a.i+n > len(e.ops) || n < 0 {
		return nil, a.fail(wOctetsFixed, 0)
	}
	l := 0
	for _, op := range e.ops[a.i : a.i+n] {
		if op.length == VariableLength {
			return nil, a.fail(wOctetsFixed, 0)
		}
		l += int(op.length)
	}
	// Begin's room check, kept true by every write, covers the
	// fixed-length fields that follow.
	p := e.b[a.n : a.n+l : a.n+l]
	a.i += n
	a.n += l
	return p, a
}

// Encoded writes the next n fields from their octets as encoded for the
// same fields elsewhere (by EncodeRecord, with a template of just those
// fields): for writers that cache the encoding of a run of values that
// repeat. Only the room is checked; the caller vouches for the octets.
func (a RecordBuilder) Encoded(n int, octets []byte) RecordBuilder {
	e := a.e
	if n <= 0 || a.i+n > len(e.ops) || len(octets) > maxMessageLen {
		return a.fail(wOctets, uint64(len(octets)))
	}
	room := recordSlack
	if a.i+n < len(e.ops) {
		room = int(e.ops[a.i+n].room)
	}
	if a.n+len(octets)+room > len(e.b) {
		return a.fail(wOctets, uint64(len(octets)))
	}
	copy(e.b[a.n:], octets)
	a.i += n
	a.n += len(octets)
	return a
}

// Reserve returns the octets of the next n fields, octets long, for the
// caller to write their values into as RFC 7011 §7 encodes them (fixed
// lengths big-endian, a length prefix before each variable-length value),
// and the builder past them: for writers that know a template's layout
// and write a stretch of a record at once, variable-length fields
// included. Only the room is checked; the caller vouches for the octets.
// If there is no room for them (or there are fewer than n fields, or the
// builder failed before), Reserve returns no octets and the builder
// unchanged, so that the caller can write the fields one by one and get
// the error that write gives.
func (a RecordBuilder) Reserve(n, octets int) ([]byte, RecordBuilder) {
	e := a.e
	if n < 0 || a.i+n > len(e.ops) || octets < 0 || octets > maxMessageLen {
		return nil, a
	}
	room := recordSlack
	if a.i+n < len(e.ops) {
		room = int(e.ops[a.i+n].room)
	}
	if a.n+octets+room > len(e.b) {
		return nil, a
	}
	p := e.b[a.n : a.n+octets : a.n+octets]
	a.i += n
	a.n += octets
	return p, a
}

// String writes a string field; see Bytes for the length rules.
func (a RecordBuilder) String(s string) RecordBuilder {
	e := a.e
	// The common case: a short value in a variable-length field.
	if a.i < len(e.ops) && len(s) < 255 {
		op := &e.ops[a.i]
		if op.cls == wString && a.n+1+len(s)+int(op.room) <= len(e.b) {
			e.b[a.n] = byte(len(s))
			// Empty strings are common (no peer Pod, no policy, no
			// Egress) and need no call to memmove.
			if len(s) != 0 {
				copy(e.b[a.n+1:], s)
			}
			a.i++
			a.n += 1 + len(s)
			return a
		}
	}
	return writeOctets(a, s, wString)
}

// Bytes writes an octetArray field (or any field whose type the encoder
// treats as raw octets). A fixed-length field must get exactly its length;
// a variable-length one takes a length prefix (RFC 7011 §7).
func (a RecordBuilder) Bytes(b []byte) RecordBuilder {
	return writeOctets(a, b, wOctets)
}

// writeOctets writes v with method c (wString or wOctets) in all cases.
func writeOctets[T ~string | ~[]byte](a RecordBuilder, v T, c wclass) RecordBuilder {
	e, n, l := a.e, a.n, len(v)
	if a.i >= len(e.ops) {
		return a.fail(c, uint64(l))
	}
	op := &e.ops[a.i]
	switch {
	case op.cls == c+1 && l == int(op.length): // wStringFixed, wOctetsFixed: room covers it
	case op.cls != c || l > maxMessageLen:
		return a.fail(c, uint64(l))
	case l < 255 && n+1+l+int(op.room) <= len(e.b):
		e.b[n] = byte(l)
		n++
	case n+3+l+int(op.room) <= len(e.b):
		e.b[n], e.b[n+1], e.b[n+2] = 255, byte(l>>8), byte(l)
		n += 3
	default:
		return a.fail(c, uint64(l))
	}
	copy(e.b[n:], v)
	a.i++
	a.n = n + l
	return a
}

// End finishes the record. If it made the message larger than the maximum
// size, the message is sent without it and the record starts the next one.
// On error nothing of the record is kept.
func (a RecordBuilder) End() error {
	e := a.e
	if a.i != len(e.ops) || e.start < 0 {
		return e.abort(a)
	}
	start := e.start
	e.start = -1
	if a.n <= e.max {
		e.buf = e.buf[:a.n]
		e.records++
		return nil
	}
	return e.spill(start, a.n)
}

// abort discards a record that cannot be ended and says why.
func (e *Encoder) abort(a RecordBuilder) error {
	if e.werr != nil {
		return e.werr
	}
	if e.start < 0 {
		return errors.New("ipfix: record ended twice")
	}
	err := e.failure(a)
	e.dropEmptySet(e.start)
	e.start = -1
	return err
}

// spill moves a record that made the message too large into the next one.
func (e *Encoder) spill(start, end int) error {
	t, rec := e.t, end-start
	e.dropEmptySet(start)
	if headerLen+setHeaderLen+rec > e.max {
		return fmt.Errorf("data record of template %d (%d octets): %w", t.ID, rec, ErrTooLarge)
	}
	domain := e.domain
	if err := e.Flush(); err != nil {
		return err
	}
	if err := e.begin(domain); err != nil {
		return err
	}
	e.openSet(t.ID)
	// The record still lies past the (new) message's end; the header and
	// set header just written end before it starts, and copy handles any
	// overlap.
	k := len(e.buf)
	e.buf = e.buf[:k+rec]
	copy(e.buf[k:], e.b[start:end])
	e.records++
	return nil
}

// failure builds the error of a record that End refuses, from the first
// failed write.
func (e *Encoder) failure(a RecordBuilder) error {
	t, ops := e.t, e.ops
	if a.i < failBit { // ended early
		f := &t.Fields[a.i]
		return &FieldError{Index: a.i, Name: f.Name(), Type: f.Type, Msg: "not written"}
	}
	i, c := a.i&(failBit-1), wclass(a.i>>failShift)
	switch {
	case len(ops) != len(t.Fields):
		return fmt.Errorf("ipfix: template %d was not built by NewTemplate or a Session", t.ID)
	case c == wNone:
		return fmt.Errorf("data record of template %d (at least %d octets): %w", t.ID, max(t.minLen, int(ops[0].room)-recordSlack), ErrTooLarge)
	case i >= len(ops):
		return &FieldError{Index: i, Name: "?", Msg: fmt.Sprintf("template %d has only %d fields", t.ID, len(ops))}
	}
	f, op := &t.Fields[i], ops[i]
	fail := func(msg string) error { return &FieldError{Index: i, Name: f.Name(), Type: f.Type, Msg: msg} }
	want := classTypes[c]
	if !want.has(f.Type) {
		return fail("cannot write " + want.String())
	}
	s := op.shift & 63
	switch c {
	case wUint:
		if a.v<<s>>s != a.v {
			return fail(fmt.Sprintf("value %d does not fit in %d octets", a.v, f.Length))
		}
	case wInt:
		if v := int64(a.v); v<<s>>s != v {
			return fail(fmt.Sprintf("value %d does not fit in %d octets", v, f.Length))
		}
	case wAddr:
		if e.fa.IsValid() {
			return fail("address " + e.fa.String() + " is of the other family")
		}
	case wString, wOctets:
		switch l := a.v; {
		case f.Length != VariableLength && l != uint64(f.Length):
			return fail(fmt.Sprintf("value of %d octets for a field of %d", l, f.Length))
		case l > maxMessageLen:
			return fail(fmt.Sprintf("value of %d octets is longer than any message", l))
		}
	}
	// The value was right for its field: it is the record that outgrew
	// the buffer, which holds more than any message.
	return fmt.Errorf("data record of template %d (over %d octets): %w", t.ID, e.max-headerLen-setHeaderLen, ErrTooLarge)
}

// dropEmptySet removes the open set's header if the record that was to
// start at recStart was its first: an empty set must not be sent.
func (e *Encoder) dropEmptySet(recStart int) {
	if e.setStart >= 0 && e.setStart == recStart-setHeaderLen {
		e.buf = e.buf[:e.setStart]
		e.setStart = -1
	}
}

// AppendVariable appends v as the value of a variable-length field, with
// its length prefix (RFC 7011 §7), as RecordBuilder writes it: for
// writers that build records, or stretches of them, in their own buffers.
func AppendVariable[S ~string | ~[]byte](b []byte, v S) []byte {
	if len(v) < 255 {
		b = append(b, byte(len(v)))
	} else {
		b = append(b, 255, byte(len(v)>>8), byte(len(v)))
	}
	return append(b, v...)
}

// uint32FromAddr4 is the IPv4 address a as a big-endian number.
func uint32FromAddr4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// AddEncoded adds a record that is already encoded for t (see
// EncodeRecord) to the message being built for domain, as End would:
// in a data set of t, moved to the next message if it makes this one too
// large. Its length is checked against t's smallest record, not its
// values: the caller vouches for them.
func (e *Encoder) AddEncoded(domain uint32, t *Template, data []byte) error {
	if len(data) < t.minLen {
		return fmt.Errorf("ipfix: an encoded record of %d octets is shorter than template %d allows (%d)", len(data), t.ID, t.minLen)
	}
	if headerLen+setHeaderLen+len(data) > e.max {
		return fmt.Errorf("data record of template %d (%d octets): %w", t.ID, len(data), ErrTooLarge)
	}
	a := e.Begin(domain, t)
	if a.i >= failBit {
		return a.End()
	}
	// The buffer holds twice a message (see NewEncoder), so a record that
	// fits in a message always fits behind the one being built.
	copy(e.b[a.n:], data)
	a.n += len(data)
	a.i = len(e.ops)
	return a.End()
}

// EncodeRecord builds one data record of t outside any message and
// returns its octets, for a caller that forwards EncodedRecords: write
// must write every field and End the builder. The returned slice is valid
// until the encoder's next use; the encoder's message state is left
// empty. Use an Encoder that does nothing else.
func (e *Encoder) EncodeRecord(t *Template, write func(RecordBuilder) error) ([]byte, error) {
	e.Discard()
	if err := write(e.Begin(0, t)); err != nil {
		e.Discard()
		return nil, err
	}
	if e.setStart < 0 || e.records != 1 {
		e.Discard()
		return nil, errors.New("ipfix: EncodeRecord: write did not end exactly one record")
	}
	rec := e.buf[e.setStart+setHeaderLen:]
	e.Discard()
	return rec, nil
}
