package ipfix_test

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
	"time"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// TestMessageReaderFraming: whatever sizes the reader hands out (whole
// stream, one octet, half messages, data with the final EOF), the messages
// come out whole and in order, a truncated stream is ErrUnexpectedEOF and
// a clean end io.EOF. Large and small messages mix, so the read-ahead
// buffer both fills up and moves its remainder to the front.
func TestMessageReaderFraming(t *testing.T) {
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 300, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	for _, size := range []int{65535, 600, 65535, 512, 20000, 65535, 65535, 65535, 700} {
		enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: size, Now: func() time.Time { return time.Unix(1, 0) }},
			func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
		enc.AddTemplate(1, tmpl)
		for i := range 400 {
			if err := ipfixtest.WriteAntreaV27(enc, 1, tmpl, ipfixtest.SampleFlow(i)); err != nil {
				t.Fatal(err)
			}
		}
		enc.Flush()
	}
	stream := bytes.Join(msgs, nil)
	readers := map[string]func(io.Reader) io.Reader{
		"whole":    func(r io.Reader) io.Reader { return r },
		"one byte": iotest.OneByteReader,
		"halves":   iotest.HalfReader,
		"data+EOF": iotest.DataErrReader,
	}
	for name, wrap := range readers {
		mr := ipfix.NewMessageReader(wrap(bytes.NewReader(stream)))
		off := int64(0)
		for i, want := range msgs {
			got, err := mr.Next()
			if err != nil {
				t.Fatalf("%s: message %d: %v", name, i, err)
			}
			if !bytes.Equal(got, want) || mr.Offset != off {
				t.Fatalf("%s: message %d differs (offset %d, want %d)", name, i, mr.Offset, off)
			}
			off += int64(len(want))
		}
		if _, err := mr.Next(); err != io.EOF {
			t.Errorf("%s: after the last message: %v, want io.EOF", name, err)
		}
		for _, cut := range []int{5, 16 + 3, len(msgs[0]) + 100} {
			mr := ipfix.NewMessageReader(wrap(bytes.NewReader(stream[:cut])))
			var err error
			for err == nil {
				_, err = mr.Next()
			}
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("%s: stream cut at %d: %v, want ErrUnexpectedEOF", name, cut, err)
			}
		}
	}
}
