package ipfixmap_test

import (
	"testing"
	"unsafe"

	"sluice/flow/ipfixmap"
)

// TestInternerField: Field returns Bytes's string for every index, the
// same shared string for a repeated value, and a new value when the
// field's value changes.
func TestInternerField(t *testing.T) {
	in := ipfixmap.NewInterner(16)
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	a := in.Field(3, []byte("team-a"))
	if a != "team-a" || !same(a, in.Field(3, []byte("team-a"))) || !same(a, in.Bytes([]byte("team-a"))) {
		t.Fatalf("repeated value not shared: %q", a)
	}
	if b := in.Field(3, []byte("team-b")); b != "team-b" {
		t.Fatalf("changed value: %q", b)
	}
	if a2 := in.Field(3, []byte("team-a")); a2 != "team-a" || !same(a, a2) {
		t.Fatalf("value back: %q", a2)
	}
	for _, i := range []int{-1, 127, 128, 1 << 20} {
		if s := in.Field(i, []byte("x")); s != "x" {
			t.Fatalf("index %d: %q", i, s)
		}
	}
	if s := in.Field(5, nil); s != "" {
		t.Fatalf("empty: %q", s)
	}
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'l'
	}
	if s := in.Field(6, long); s != string(long) {
		t.Fatal("long value changed")
	}
	if s := in.Field(6, []byte("short")); s != "short" {
		t.Fatalf("after a long value: %q", s)
	}
}
