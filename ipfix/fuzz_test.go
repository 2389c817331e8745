package ipfix_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/ipfix"
	"sluice/ipfix/ipfixjson"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite the committed fuzz seed corpus in testdata/fuzz")

// touchRecord reads every field through every accessor that applies, and
// checks the invariants a consumer relies on.
func touchRecord(t *testing.T, msg []byte, r *ipfix.Record) {
	if r.NumFields() != len(r.Template.Fields) {
		t.Fatalf("record has %d fields, template %d", r.NumFields(), len(r.Template.Fields))
	}
	for i := 0; i < r.NumFields(); i++ {
		f := r.Field(i)
		b := r.Bytes(i)
		if f.Length != ipfix.VariableLength && len(b) != int(f.Length) {
			t.Fatalf("field %d: %d octets, template says %d", i, len(b), f.Length)
		}
		if len(b) > len(msg) {
			t.Fatalf("field %d longer than the message", i)
		}
		_, e1 := r.Uint(i)
		_, e2 := r.Int(i)
		_, e3 := r.Float(i)
		_, e4 := r.Bool(i)
		_, e5 := r.Addr(i)
		_, e6 := r.MAC(i)
		_, e7 := r.String(i)
		_, e8 := r.Time(i)
		for _, err := range []error{e1, e2, e3, e4, e5, e6, e7, e8} {
			if err != nil && !errors.Is(err, ipfix.ErrType) {
				t.Fatalf("field %d: accessor error %v is not ErrType", i, err)
			}
		}
	}
}

// decodeStream decodes data as a stream of messages in one session, as a
// TCP collector would, stopping at the first framing error.
func decodeStream(t *testing.T, data []byte, ttl time.Duration) {
	sess := ipfix.NewSession(ipfix.SessionOptions{TemplateTTL: ttl, MaxTemplates: 64})
	d := ipfix.NewDecoder(sess)
	mr := ipfix.NewMessageReader(bytes.NewReader(data))
	now := t0
	for {
		msg, err := mr.Next()
		if err != nil {
			if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ipfix.ErrMalformed) {
				t.Fatalf("framing error of unexpected kind: %v", err)
			}
			return
		}
		if err := d.Reset(msg, now); err != nil {
			if !errors.Is(err, ipfix.ErrMalformed) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			continue
		}
		for d.Next() {
			touchRecord(t, msg, d.Record())
			if line := ipfixjson.AppendRecord(nil, d.Header(), d.Record()); !json.Valid(line) {
				t.Fatalf("invalid JSON for a record: %s", line)
			}
		}
		if err := d.Err(); err != nil {
			var de *ipfix.DecodeError
			if !errors.As(err, &de) || de.Offset < 0 || de.Offset > len(msg) {
				t.Fatalf("error %v has no offset inside the message", err)
			}
		}
		if sess.NumTemplates() > 64 {
			t.Fatalf("session holds %d templates, limit 64", sess.NumTemplates())
		}
		now = now.Add(20 * time.Minute) // lets UDP templates expire mid-stream
	}
}

// FuzzDecodeMessage feeds one message at a time, with the length field
// forced to match, so the fuzzer explores sets and records rather than
// framing.
func FuzzDecodeMessage(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) >= 4 && len(data) <= ipfix.MaxMessageLen {
			data = bytes.Clone(data)
			data[2], data[3] = byte(len(data)>>8), byte(len(data))
		}
		decodeStream(t, data, 0)
	})
}

// FuzzDecodeStream feeds a stream of messages into one session, so that
// template reuse, replacement, withdrawal and expiry interact.
func FuzzDecodeStream(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, udp bool) {
		ttl := time.Duration(0)
		if udp {
			ttl = ipfix.DefaultUDPTemplateTTL
		}
		decodeStream(t, data, ttl)
	})
}

// seeds are the hand-made inputs of the committed corpus: the defects the
// decoder must reject cleanly and the shapes it must accept.
func seeds(t testing.TB) map[string][]byte {
	str := spec{101, 0xffff, ipfix.EnterpriseAntrea}
	good := set(2, tmplRec(256, spec{4, 1, 0}, str))
	antrea := encodeAntrea(t, 3, 1400)
	return map[string][]byte{
		"antrea-v2.7":             bytes.Join(antrea, nil),
		"template-and-data":       message(1, good, set(256, []byte{6, 3}, []byte("abc"), []byte{17, 0})),
		"truncated-set":           message(1, good, set(256, []byte{6, 3}, []byte("abc")))[:30],
		"zero-length-field":       message(1, set(2, tmplRec(256, spec{4, 0, 0}))),
		"length-65535-fixed":      message(1, set(2, tmplRec(256, spec{1000, 0xfffe, 0}))),
		"var-length-255-prefix":   message(1, good, set(256, []byte{6, 255, 0, 5}, []byte("hello"))),
		"3-byte-length-overruns":  message(1, good, set(256, []byte{6, 255, 0xff, 0xff}, []byte("abc"))),
		"3-byte-length-truncated": message(1, good, set(256, []byte{6, 255, 1})),
		"template-id-reuse": cat(message(1, good, set(256, []byte{6, 1, 'a'})),
			message(1, set(2, tmplRec(256, spec{8, 4, 0}, spec{12, 4, 0})), set(256, u32(1), u32(2)))),
		"set-shorter-than-header": message(1, cat(u16(256), u16(2))),
		"zero-field-template":     message(1, set(2, u16(256), u16(0)), set(256, []byte{1})),
		"withdraw-all":            cat(message(1, good), message(1, set(2, u16(2), u16(0))), message(1, set(256, []byte{6, 0}))),
		"options-template":        message(1, set(3, optTmplRec(300, 1, spec{149, 4, 0}, spec{41, 8, 0})), set(300, u32(1), u32(0), u32(5))),
		"options-scope-zero":      message(1, set(3, optTmplRec(300, 0, spec{149, 4, 0}))),
		"enterprise-truncated":    message(1, set(2, u16(256), u16(1), u16(0x8001), u16(4), u16(0))),
		"unknown-template-data":   message(1, set(999, []byte{1, 2, 3, 4}), good),
		"padding":                 message(1, set(2, tmplRec(256, spec{8, 4, 0}), []byte{0, 0}), set(256, u32(1), []byte{0, 0, 0})),
		"reserved-set-id":         message(1, set(5, []byte{1, 2, 3, 4}), good),
		"wrong-version":           cat(u16(9), u16(20), make([]byte, 16)),
		"header-only":             message(1),
	}
}

// TestSeedCorpus keeps the committed corpus in step with seeds(), and runs
// every seed through both targets' code paths.
func TestSeedCorpus(t *testing.T) {
	for _, target := range []string{"FuzzDecodeMessage", "FuzzDecodeStream"} {
		dir := filepath.Join("testdata", "fuzz", target)
		for name, data := range seeds(t) {
			var content string
			if target == "FuzzDecodeStream" {
				content = fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nbool(%v)\n", data, strings.HasPrefix(name, "t"))
			} else {
				content = fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
			}
			path := filepath.Join(dir, name)
			if *updateCorpus {
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != content {
				t.Errorf("%s is missing or stale (%v); run go test ./ipfix -run TestSeedCorpus -update-corpus", path, err)
			}
			decodeStream(t, data, 0)
		}
	}
}
