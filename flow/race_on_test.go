//go:build race

package flow_test

// raceOn: sync.Pool drops a share of what it is given at random under the
// race detector.
const raceOn = true
