package ipfixjson

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestAppendStringIsMarshal: AppendString writes what encoding/json
// writes, for text with every kind of byte (controls, quotes, HTML
// characters, invalid UTF-8, U+2028/2029), as strings and as bytes.
func TestAppendStringIsMarshal(t *testing.T) {
	cases := []string{"", "plain", `q"uote\back`, "<a href='x'>&amp;</a>", "\b\f\n\r\t\x00\x01\x1f\x7f",
		"caf\xc3\xa9", "bad\xff\xfeutf8", "\xe2\x80\xa8line\xe2\x80\xa9para", "trunc\xe2\x80", "日本語", "\xf0\x9f\x98\x80"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, r.IntN(24))
		for i := range b {
			b[i] = byte(r.IntN(256))
			if r.IntN(3) == 0 {
				b[i] = "\"\\<>&\n\xe2\x80\xa8\xc3"[r.IntN(10)]
			}
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		want, _ := json.Marshal(s)
		if got := AppendString(nil, s); string(got) != string(want) {
			t.Fatalf("%q: got %s, want %s", s, got, want)
		}
		if got := AppendString([]byte("x"), []byte(s)); string(got) != "x"+string(want) {
			t.Fatalf("%q as bytes: got %s, want x%s", s, got, want)
		}
	}
	if a := testing.AllocsPerRun(100, func() { _ = AppendString(make([]byte, 0, 64)[:0], "caf\xc3\xa9 <x>") }); a > 1 {
		t.Fatalf("%v allocations", a)
	}
}
