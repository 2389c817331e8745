package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDemoPlainOutput: with stdout not a terminal, `sluice demo` prints
// plain lines, the summary and the trace, and no terminal escapes.
func TestDemoPlainOutput(t *testing.T) {
	root := newRootCmd()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"demo", "--duration", "2s", "--mode", "proxy", "--rate", "50", "--ui-address", "127.0.0.1:0"})
	if err := root.Execute(); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	s := out.String()
	if !strings.HasPrefix(s, "web UI: http://127.0.0.1:") {
		t.Errorf("the first line is not the web UI's URL:\n%s", s)
	}
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
		"--duration": {"--duration", "-1s"},
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

// syncBuffer is a bytes.Buffer that the demo writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDemoUntilInterrupted: --duration 0 keeps the demo running, its web
// UI answering, until the context ends (Ctrl-C); then it stops in order
// and prints its summary.
func TestDemoUntilInterrupted(t *testing.T) {
	root := newRootCmd()
	var out, errOut syncBuffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"demo", "--duration", "0", "--rate", "50", "--ui-address", "127.0.0.1:0"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	// Wait for the URL, then for the UI to show flows: the demo is
	// running with no end of its own.
	deadline := time.Now().Add(2 * time.Minute)
	var url string
	for url == "" {
		if line, _, ok := strings.Cut(out.String(), "\n"); ok {
			url = strings.TrimPrefix(line, "web UI: ")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no URL printed:\n%s\n%s", out.String(), errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		resp, err := http.Get(url + "api/flows?limit=5")
		if err == nil {
			var page struct {
				Rows []json.RawMessage `json:"rows"`
			}
			err = json.NewDecoder(resp.Body).Decode(&page)
			resp.Body.Close()
			if err == nil && len(page.Rows) > 0 {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the demo stopped by itself: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the UI showed no flows: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%v\n%s", err, errOut.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the demo did not stop after its context ended")
	}
	if s := out.String(); !strings.Contains(s, "== sluice demo: summary ==") || !strings.Contains(s, "until Ctrl-C") {
		t.Errorf("output lacks the summary or the duration:\n%s", s)
	}
}
