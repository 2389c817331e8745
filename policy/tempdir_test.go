package policy_test

import (
	"os"
	"testing"
)

// tempDir is a directory for the shared demo run, removed when the test
// binary ends (TestMain).
func tempDir() (string, error) {
	d, err := os.MkdirTemp("", "sluice-policy-")
	if err == nil {
		tempDirs = append(tempDirs, d)
	}
	return d, err
}

var tempDirs []string

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range tempDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}
