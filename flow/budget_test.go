package flow_test

import (
	"testing"

	"sluice/flow"
)

// TestSampleBudget: at most per records a second are wanted, and the
// count starts again with the next second.
func TestSampleBudget(t *testing.T) {
	b := flow.NewSampleBudget(3)
	for second := range 2 {
		wanted := 0
		for range 10 {
			if b.Want() {
				wanted++
			}
		}
		if wanted != 3 {
			t.Errorf("second %d: %d of 10 wanted, want 3", second, wanted)
		}
		b.NewSecond()
	}
}
