//go:build !race

package flow_test

const raceOn = false
