package proxy

import "testing"

// TestSamplerBound: at most per records a second are wanted, and the
// count starts again the next second.
func TestSamplerBound(t *testing.T) {
	sec := int64(1_000_000)
	s := &sampler{per: 3, now: func() int64 { return sec }}
	wanted := 0
	for range 10 {
		if s.Want() {
			wanted++
		}
	}
	if wanted != 3 {
		t.Errorf("%d of 10 wanted within a second, want 3", wanted)
	}
	sec++
	wanted = 0
	for range 10 {
		if s.Want() {
			wanted++
		}
	}
	if wanted != 3 {
		t.Errorf("%d of 10 wanted in the next second, want 3", wanted)
	}
}
