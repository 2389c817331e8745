// Package ui is Sluice's web UI: a read-only HTTP server of the pages
// built from ui/web (embedded from ui/dist, so that `go build` needs no
// Node) and of the JSON and Server-Sent Events API they read.
//
// It reads only what the aggregator already has. Flows come from a tap on
// the pipeline's broadcast buffer, read as an observer (ring.Observer),
// which the pipeline never waits for: when the tap falls behind, it loses
// records and counts them, the pipeline goes on. The tap keeps a bounded
// history of recent records and the map's edges (bounded too); each page
// reads the history at its own position, and is sent at most
// MaxPerSecond records a second, a sample when more come in, with how
// many were left out, so the page can say that it samples. Health is read
// off the metrics registry; Traceflow goes through traceflow/modelrun and
// traceflow/render, as `sluice traceflow` does, so the page shows exactly
// what the command prints.
package ui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
	"sluice/ring"
	"sluice/traceflow/cluster"
	"sluice/traceflow/modelrun"
)

// Defaults of Options.
const (
	DefaultHistory      = 8192
	DefaultMaxEdges     = 5000
	DefaultMaxStreams   = 16
	DefaultMaxPerSecond = 1000
	// DefaultBacklog is how many recent records a page gets when it
	// opens its stream.
	DefaultBacklog = 1000
)

// Options configures a Server.
type Options struct {
	// Buffer is the pipeline's broadcast buffer (required).
	Buffer *ring.Buffer[*flow.Flow]
	// Gatherer is the metrics the Health page reads; nil shows none.
	Gatherer prometheus.Gatherer
	// Registerer takes the UI's own series; nil registers them nowhere.
	Registerer prometheus.Registerer
	// Mode is the aggregator's mode, and Sinks the sinks it runs (by
	// configuration key), for the Health page.
	Mode  string
	Sinks []string
	// Notice is shown on every page (why flows cannot be seen, say).
	Notice string
	// Cluster reads the cluster's objects for the Traceflow page; nil
	// turns the page's traces off. Settings are the agents' settings the
	// model needs.
	Cluster  func(context.Context) ([]cluster.Object, error)
	Settings modelrun.Settings
	// PodWorkload names Pods' workloads from the cluster's metadata (their
	// controllers), for the rows and the map's grouping; nil, or a Pod it
	// does not know, and the workload is guessed from the Pod's labels
	// and name.
	PodWorkload PodWorkload
	// Render renders a record with every field for the Flows page's
	// details (the flow-record API's JSON); nil uses the record's Go
	// fields.
	Render func(*flow.Flow) ([]byte, error)
	// History is how many recent records the UI keeps; MaxEdges bounds
	// the map; MaxStreams the open event streams; MaxPerSecond the
	// records one stream is sent a second.
	History, MaxEdges, MaxStreams, MaxPerSecond int
	// Address is the address the UI listens on, as configured
	// (sluice.ui.address): besides loopback names and addresses, requests
	// may name its host in their Host header. AllowedHosts are further
	// names (any port) or host:port pairs requests may name
	// (sluice.ui.allowedHosts; an ingress's name, say). Requests for any
	// other host are refused, which keeps DNS-rebinding pages out.
	Address      string
	AllowedHosts []string
	Log          *slog.Logger
}

// Server serves the UI.
type Server struct {
	o       Options
	m       *Metrics
	hist    *history
	edges   *edges
	mux     *http.ServeMux
	handler http.Handler
	health  *sampler
	streams chan struct{}
	traces  chan struct{}
	tapLost atomic.Uint64
	// renderMu serialises Render (renderers are not safe for concurrent
	// use).
	renderMu sync.Mutex
}

// New checks o and builds the server.
func New(o Options) (*Server, error) {
	if o.Buffer == nil {
		return nil, errors.New("ui: Options.Buffer is required")
	}
	if o.History <= 0 {
		o.History = DefaultHistory
	}
	if o.MaxEdges <= 0 {
		o.MaxEdges = DefaultMaxEdges
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxPerSecond <= 0 {
		o.MaxPerSecond = DefaultMaxPerSecond
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Settings.TrafficMode == "" {
		o.Settings = modelrun.DefaultSettings()
	}
	if _, err := o.Settings.Config(0); err != nil {
		return nil, fmt.Errorf("ui: %w", err)
	}
	m := NewMetrics(o.Registerer)
	s := &Server{o: o, m: m, hist: newHistory(o.History), edges: newEdges(o.MaxEdges, m.Dropped.WithLabelValues(ReasonEdgeEvicted)),
		streams: make(chan struct{}, o.MaxStreams), traces: make(chan struct{}, 2)}
	s.health = newSampler(o.Gatherer)
	s.routes()
	return s, nil
}

// Metrics are the server's series.
func (s *Server) Metrics() *Metrics { return s.m }

// Handler is the UI's HTTP handler: the pages and the API, behind the
// Host and cross-origin checks (guard.go).
func (s *Server) Handler() http.Handler { return s.handler }

// Run reads the pipeline's buffer (until it closes and is drained, or ctx
// ends) and samples the metrics every second (until ctx ends).
func (s *Server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.tap(ctx) })
	wg.Go(func() { s.health.run(ctx, time.Second) })
	wg.Wait()
}

// Serve serves the UI on ln until ctx ends; open event streams end then.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("ui: %w", err)
	}
	return nil
}

// URL is the address a person opens for a listener's address.
func URL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr + "/"
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

func (s *Server) routes() {
	mux := http.NewServeMux()
	static, err := fs.Sub(bundle, "dist")
	if err != nil {
		panic(err) // the embedded tree always has dist
	}
	files := http.FileServerFS(static)
	mux.Handle("GET /", headers(files))
	mux.HandleFunc("GET /api/info", s.info)
	mux.HandleFunc("GET /api/flows", s.flows)
	mux.HandleFunc("GET /api/flows/stream", s.stream)
	mux.HandleFunc("GET /api/flows/{seq}", s.flowDetail)
	mux.HandleFunc("GET /api/map", s.graph)
	mux.HandleFunc("GET /api/health", s.healthz)
	mux.HandleFunc("GET /api/traceflow/endpoints", s.traceEndpoints)
	mux.HandleFunc("POST /api/traceflow", s.traceflow)
	mux.HandleFunc("GET /api/policy/namespaces", s.policyNamespaces)
	mux.HandleFunc("POST /api/policy/recommend", s.policyRecommend)
	mux.HandleFunc("POST /api/policy/verify", s.policyVerify)
	s.mux = mux
	s.handler = s.guard(mux)
}

// headers adds the pages' security headers: nothing is loaded from
// anywhere but the UI itself.
func headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; object-src 'none'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		h.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// Info is what every page shows in its header.
type Info struct {
	Mode   string `json:"mode"`
	Notice string `json:"notice,omitempty"`
	// Traceflow says whether the Traceflow page can trace.
	Traceflow    bool `json:"traceflow"`
	MaxPerSecond int  `json:"maxPerSecond"`
}

func (s *Server) info(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, Info{Mode: s.o.Mode, Notice: s.o.Notice, Traceflow: s.o.Cluster != nil, MaxPerSecond: s.o.MaxPerSecond})
}

// FlowsPage is GET /api/flows: the newest records.
type FlowsPage struct {
	Rows []Row  `json:"rows"`
	Seq  uint64 `json:"seq"`
}

func (s *Server) flows(w http.ResponseWriter, r *http.Request) {
	n := DefaultBacklog
	if v := r.URL.Query().Get("limit"); v != "" {
		l, err := strconv.Atoi(v)
		if err != nil || l <= 0 {
			writeError(w, http.StatusBadRequest, "limit: want a positive number")
			return
		}
		n = min(l, s.o.History)
	}
	rows, seq := s.hist.last(n)
	if rows == nil {
		rows = []Row{}
	}
	writeJSON(w, http.StatusOK, FlowsPage{Rows: rows, Seq: seq})
}

func (s *Server) flowDetail(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, "not a record number")
		return
	}
	f, ok := s.hist.record(seq)
	if !ok {
		writeError(w, http.StatusNotFound, "the record is no longer held (the UI keeps the newest "+strconv.Itoa(s.o.History)+")")
		return
	}
	var b []byte
	if s.o.Render != nil {
		s.renderMu.Lock()
		b, err = s.o.Render(f)
		s.renderMu.Unlock()
	} else {
		b, err = json.Marshal(f)
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

func (s *Server) graph(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.edges.graph(time.Now()))
}

// Event is one message of the flow stream.
type Event struct {
	Rows []Row `json:"rows"`
	// Lost counts records that went past before the stream read them
	// (client-behind), Skipped those the sample left out, since the
	// previous event; TapLost the records the tap itself missed so far.
	Lost    uint64 `json:"lost"`
	Skipped uint64 `json:"skipped"`
	TapLost uint64 `json:"tapLost"`
	Seq     uint64 `json:"seq"`
}

// streamTick is how often a stream sends what came in.
const streamTick = 250 * time.Millisecond

// stream is GET /api/flows/stream: Server-Sent Events, one "flows" event
// per tick with the records since the last (a sample when there are more
// than MaxPerSecond a second), starting with the newest backlog.
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		writeError(w, http.StatusServiceUnavailable, strconv.Itoa(s.o.MaxStreams)+" streams are open already")
		return
	}
	s.m.Streams.Inc()
	defer s.m.Streams.Dec()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	perTick := max(1, s.o.MaxPerSecond*int(streamTick/time.Millisecond)/1000)
	backlog, pos := s.hist.last(DefaultBacklog)
	ctx := r.Context()
	send := func(ev Event) bool {
		if ev.Rows == nil {
			ev.Rows = []Row{}
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return false
		}
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(w, "event: flows\ndata: %s\n\n", b); err != nil {
			return false
		}
		if err := rc.Flush(); err != nil {
			return false
		}
		s.m.Sent.Add(float64(len(ev.Rows)))
		return true
	}
	if !send(Event{Rows: backlog, Seq: pos, TapLost: s.tapLost.Load()}) {
		return
	}
	t := time.NewTicker(streamTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rows, lost, skipped, next := s.hist.since(pos, perTick)
		if lost > 0 {
			s.m.Dropped.WithLabelValues(ReasonClientBehind).Add(float64(lost))
		}
		if skipped > 0 {
			s.m.Dropped.WithLabelValues(ReasonSampled).Add(float64(skipped))
		}
		pos = next
		if !send(Event{Rows: rows, Lost: lost, Skipped: skipped, TapLost: s.tapLost.Load(), Seq: pos}) {
			return
		}
	}
}
