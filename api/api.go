// Package api is Sluice's HTTP API, served by the aggregator and the
// exporter: Prometheus metrics, health and readiness; and, for the
// aggregator, the flow records a FlowSource answers for and the record
// metrics. Its client is what `sluice get` uses.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server serves the API.
type Server struct {
	Mux   *http.ServeMux
	ready atomic.Bool
	// reason says what a server that is not ready waits for; /readyz
	// shows it so that a probe's failure explains itself.
	reason atomic.Pointer[string]
	log    *slog.Logger
}

// New returns a server whose /metrics exposes gatherer.
func New(gatherer prometheus.Gatherer, log *slog.Logger) *Server {
	s := &Server{Mux: http.NewServeMux(), log: log}
	s.Mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	s.Mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	s.Mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	s.Mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			msg := "not ready"
			if r := s.reason.Load(); r != nil && *r != "" {
				msg += ": " + *r
			}
			http.Error(w, msg, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return s
}

// SetReady flips /readyz.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// SetNotReady makes /readyz answer 503 with reason, what the process waits
// for.
func (s *Server) SetNotReady(reason string) {
	s.reason.Store(&reason)
	s.ready.Store(false)
}

// Serve serves on ln until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.Mux, ReadHeaderTimeout: 10 * time.Second}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("api: %w", err)
	}
	return nil
}
