package ipfix

import (
	"errors"
	"fmt"
	"io"
)

// MessageReader frames IPFIX messages out of a byte stream (a TCP or TLS
// connection, or a file of concatenated messages). It reads ahead into a
// buffer of several messages, so that a stream of small messages costs
// one read per bufferful rather than two per message, and returns each
// message as a slice of that buffer.
type MessageReader struct {
	r   io.Reader
	buf []byte
	// buf[start:end] is read but not returned yet.
	start, end int
	// Offset is the stream offset of the last message returned.
	Offset int64
	next   int64
}

// readAhead is how many octets a MessageReader asks its reader for at
// most: four messages of the largest size.
const readAhead = 4 * maxMessageLen

// NewMessageReader reads messages from r.
func NewMessageReader(r io.Reader) *MessageReader {
	return &MessageReader{r: r, buf: make([]byte, readAhead)}
}

// fill reads until at least n octets are buffered, or the reader fails.
func (m *MessageReader) fill(n int) error {
	if m.end-m.start >= n {
		return nil
	}
	if len(m.buf)-m.start < n {
		// Move what is left to the front; the message returned last is
		// no longer valid.
		m.end = copy(m.buf, m.buf[m.start:m.end])
		m.start = 0
	}
	for m.end-m.start < n {
		k, err := m.r.Read(m.buf[m.end:])
		m.end += k
		if m.end-m.start >= n {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Next returns the next whole message, valid until the following call. At
// the clean end of the stream it returns io.EOF; a stream that ends inside
// a message gives io.ErrUnexpectedEOF; a header that is not IPFIX gives a
// *DecodeError, after which the stream cannot be re-synchronised.
func (m *MessageReader) Next() ([]byte, error) {
	m.Offset = m.next
	if err := m.fill(headerLen); err != nil {
		if errors.Is(err, io.EOF) {
			if m.end == m.start {
				return nil, io.EOF
			}
			err = io.ErrUnexpectedEOF
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("ipfix: stream offset %d: message header truncated: %w", m.Offset, err)
		}
		return nil, err
	}
	h, err := ParseHeader(m.buf[m.start : m.start+headerLen])
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			de.Msg = fmt.Sprintf("stream offset %d: %s", m.Offset, de.Msg)
		}
		return nil, err
	}
	n := int(h.Length)
	if err := m.fill(n); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("ipfix: stream offset %d: message of %d octets truncated: %w", m.Offset, n, err)
	}
	msg := m.buf[m.start : m.start+n : m.start+n]
	m.start += n
	m.next += int64(n)
	return msg, nil
}
