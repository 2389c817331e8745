// Package testagg runs an aggregator in a test process.
package testagg

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"sluice/aggregator"
	"sluice/config"
	"sluice/internal/testkit"
)

// Aggregator is an aggregator running in the test process.
type Aggregator struct {
	*aggregator.Aggregator
	cancel context.CancelFunc
	done   chan error
	err    error
	logs   *testkit.LogBuffer
}

// Start parses yaml, runs the aggregator it describes on
// loopback and stops it when the test ends; its log is shown if the test
// failed. The gRPC collector, unless yaml places it, gets a free port, and
// generated certificates go to a temporary directory unless yaml names
// certificates; edit, when given, changes the configuration last.
func Start(tb testing.TB, yaml string, edit ...func(*config.Aggregator)) *Aggregator {
	tb.Helper()
	cfg, err := config.Parse([]byte(yaml), tb.Name()+".yaml")
	if err != nil {
		tb.Fatalf("configuration:\n%s\n%v", yaml, err)
	}
	if cfg.Sluice.GRPCAddress == config.Default().Sluice.GRPCAddress {
		cfg.Sluice.GRPCAddress = "127.0.0.1:0"
	}
	if cfg.Sluice.TLS.CertDir == "" && cfg.Sluice.TLS.CertFile == "" {
		cfg.Sluice.TLS.CertDir = tb.TempDir()
	}
	for _, e := range edit {
		e(cfg)
	}
	logs := &testkit.LogBuffer{}
	a, err := aggregator.New(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Aggregator{Aggregator: a, cancel: cancel, done: make(chan error, 1), logs: logs}
	go func() { r.done <- a.Run(ctx) }()
	tb.Cleanup(func() {
		if err := r.Stop(); err != nil {
			tb.Errorf("aggregator: %v", err)
		}
		if tb.Failed() {
			tb.Logf("aggregator log:\n%s", logs.String())
		}
	})
	return r
}

// Stop stops the aggregator (its ordered shutdown: sinks drain) and
// returns Run's error. Calling it again returns the same.
func (a *Aggregator) Stop() error {
	a.cancel()
	select {
	case err, ok := <-a.done:
		if ok {
			close(a.done)
			a.err = err
		}
		return a.err
	case <-time.After(aggregator.DrainTimeout + testkit.WaitTimeout):
		return errors.New("the aggregator's Run did not return after its context ended")
	}
}

// Logs is what the aggregator has logged so far.
func (a *Aggregator) Logs() string { return a.logs.String() }
