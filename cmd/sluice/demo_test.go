package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestDemoPlainOutput: with stdout not a terminal, `sluice demo` prints
// plain lines, the summary and the trace, and no terminal escapes.
func TestDemoPlainOutput(t *testing.T) {
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"demo", "--duration", "2s", "--mode", "proxy", "--rate", "50"})
	if err := root.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	s := out.String()
	for _, want := range []string{"sluice demo: Proxy mode, 3 Nodes, 20 Pods", "== sluice demo: summary ==", "lost 0",
		"$ sluice traceflow -S batch/crawler-0", "phase: Succeeded"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "\x1b[") {
		t.Error("plain output holds terminal escapes")
	}
}

func TestDemoFlagErrors(t *testing.T) {
	for want, args := range map[string][]string{
		"--mode":     {"--mode", "bridge"},
		"--duration": {"--duration", "0s"},
		"--rate":     {"--rate", "-1"},
		"no such":    {"--cluster", "/nonexistent/cluster", "--duration", "1s"},
	} {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"demo"}, args...))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: error %v, want one mentioning %q", args, err, want)
		}
	}
}
