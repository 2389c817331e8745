package ipfix

import (
	"errors"
	"fmt"
	"io"
)

// MessageReader frames IPFIX messages out of a byte stream (a TCP or TLS
// connection, or a file of concatenated messages) into one reused buffer.
type MessageReader struct {
	r   io.Reader
	buf []byte
	// Offset is the stream offset of the last message returned.
	Offset int64
	next   int64
}

// NewMessageReader reads messages from r.
func NewMessageReader(r io.Reader) *MessageReader {
	return &MessageReader{r: r, buf: make([]byte, maxMessageLen)}
}

// Next returns the next whole message, valid until the following call. At
// the clean end of the stream it returns io.EOF; a stream that ends inside
// a message gives io.ErrUnexpectedEOF; a header that is not IPFIX gives a
// *DecodeError, after which the stream cannot be re-synchronised.
func (m *MessageReader) Next() ([]byte, error) {
	m.Offset = m.next
	if _, err := io.ReadFull(m.r, m.buf[:headerLen]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("ipfix: stream offset %d: message header truncated: %w", m.Offset, err)
		}
		return nil, err
	}
	h, err := ParseHeader(m.buf[:headerLen])
	if err != nil {
		var de *DecodeError
		if errors.As(err, &de) {
			de.Msg = fmt.Sprintf("stream offset %d: %s", m.Offset, de.Msg)
		}
		return nil, err
	}
	n := int(h.Length)
	if _, err := io.ReadFull(m.r, m.buf[headerLen:n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("ipfix: stream offset %d: message of %d octets truncated: %w", m.Offset, n, err)
	}
	m.next += int64(n)
	return m.buf[:n], nil
}
