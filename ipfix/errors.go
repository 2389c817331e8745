package ipfix

import (
	"errors"
	"fmt"
)

// Error kinds, for errors.Is. Every decoding error is a *DecodeError that
// wraps one of these.
var (
	// ErrMalformed: the bytes do not follow RFC 7011 (lengths, IDs, version).
	ErrMalformed = errors.New("malformed IPFIX")
	// ErrTemplateLimit: a session announced more templates than allowed.
	ErrTemplateLimit = errors.New("template limit reached")
	// ErrType: a typed accessor was used on a field of another type, or a
	// value could not be represented at the field's length.
	ErrType = errors.New("type mismatch")
)

// DecodeError says what was wrong with a message and where.
type DecodeError struct {
	// Offset is the byte offset in the message where the problem lies.
	Offset int
	// SetID is the Set being read, or 0 before the first set.
	SetID uint16
	// TemplateID is the (options) template being read or applied, or 0.
	TemplateID uint16
	Kind       error
	Msg        string
}

func (e *DecodeError) Error() string {
	s := fmt.Sprintf("ipfix: offset %d", e.Offset)
	if e.SetID != 0 {
		s += fmt.Sprintf(", set %d", e.SetID)
	}
	if e.TemplateID != 0 {
		s += fmt.Sprintf(", template %d", e.TemplateID)
	}
	return s + ": " + e.Msg
}

func (e *DecodeError) Unwrap() error { return e.Kind }

func malformed(off int, set, tmpl uint16, format string, args ...any) *DecodeError {
	return &DecodeError{Offset: off, SetID: set, TemplateID: tmpl, Kind: ErrMalformed, Msg: fmt.Sprintf(format, args...)}
}

// FieldError is returned by typed accessors and record writers.
type FieldError struct {
	Index int
	Name  string
	Type  DataType
	Msg   string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("ipfix: field %d (%s, %s): %s", e.Index, e.Name, e.Type, e.Msg)
}

func (e *FieldError) Unwrap() error { return ErrType }
