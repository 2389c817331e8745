package proxy

import "testing"

// TestSamplerBound: at most per records a second are wanted, and the
// count starts again with the next second.
func TestSamplerBound(t *testing.T) {
	s := &sampler{per: 3}
	for second := range 2 {
		wanted := 0
		for range 10 {
			if s.Want() {
				wanted++
			}
		}
		if wanted != 3 {
			t.Errorf("second %d: %d of 10 wanted, want 3", second, wanted)
		}
		s.newSecond()
	}
}
