// Package flowlog is the flowLogger sink: one comma-separated line per
// exported record (Antrea's 30-field layout) in a local file, rotated by
// size with a number of backups, optionally gzipped. Lines are buffered
// and flushed at least every FlushInterval and when the sink stops.
package flowlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/natefinch/lumberjack.v2"

	"sluice/flow"
	"sluice/ring"
	"sluice/sink"
)

// DefaultFlushInterval bounds how long a line waits in memory.
const DefaultFlushInterval = 5 * time.Second

// flushSize is how many octets of lines are gathered before a write.
const flushSize = 64 << 10

// Options configures a Sink.
type Options struct {
	// Path is the log file; its directory is created if missing.
	Path string
	// MaxSizeMB is the size in megabytes at which the file is rotated
	// (default 100).
	MaxSizeMB int
	// MaxBackups is how many rotated files to keep; 0 keeps all.
	MaxBackups int
	// MaxAgeDays removes rotated files older than this; 0 keeps them.
	MaxAgeDays int
	// Compress gzips rotated files.
	Compress bool
	// PrettyPrint writes protocol names, actions and policy types as words.
	PrettyPrint bool
	// Filters select the records written: a record is written when any
	// filter matches it, or always when there are none.
	Filters []Filter
	// FlushInterval defaults to DefaultFlushInterval.
	FlushInterval time.Duration
	Log           *slog.Logger
	Metrics       *sink.Metrics
	// Name labels the metrics; default "flowLogger".
	Name string
}

// Filter matches a record when each of its non-empty lists holds the
// record's rule action for that direction.
type Filter struct {
	IngressActions []uint8
	EgressActions  []uint8
}

// Matches reports whether f passes the filter.
func (x Filter) Matches(f *flow.Flow) bool {
	if len(x.IngressActions) > 0 && !slices.Contains(x.IngressActions, f.Ingress.RuleAction) {
		return false
	}
	if len(x.EgressActions) > 0 && !slices.Contains(x.EgressActions, f.Egress.RuleAction) {
		return false
	}
	return true
}

// ParseAction reads a filter's action name: None, Allow, Drop or Reject.
func ParseAction(s string) (uint8, error) {
	switch strings.ToLower(s) {
	case "none":
		return flow.ActionNone, nil
	case "allow":
		return flow.ActionAllow, nil
	case "drop":
		return flow.ActionDrop, nil
	case "reject":
		return flow.ActionReject, nil
	}
	return 0, fmt.Errorf("%q is not a rule action (None, Allow, Drop or Reject)", s)
}

// Sink writes the flow log.
type Sink struct {
	o  Options
	lj *lumberjack.Logger
	// pend holds the lines not yet written to the file, pendN of them.
	pend  []byte
	pendN int

	written, filtered, lost, writeErrs prometheus.Counter
	open                               prometheus.Gauge
	lastFlush                          time.Time
	failing                            bool
}

// New checks that the log file can be opened for appending (so a bad path
// fails at start-up) and returns the sink; Run starts it.
func New(o Options) (*Sink, error) {
	if o.Path == "" {
		return nil, errors.New("flowlog: no path")
	}
	if o.MaxSizeMB <= 0 {
		o.MaxSizeMB = 100
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = sink.NewMetrics(nil)
	}
	if o.Name == "" {
		o.Name = "flowLogger"
	}
	if err := os.MkdirAll(filepath.Dir(o.Path), 0o755); err != nil {
		return nil, fmt.Errorf("flowlog: %w", err)
	}
	fh, err := os.OpenFile(o.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("flowlog: %w", err)
	}
	fh.Close()
	s := &Sink{o: o, lj: &lumberjack.Logger{Filename: o.Path, MaxSize: o.MaxSizeMB,
		MaxBackups: o.MaxBackups, MaxAge: o.MaxAgeDays, Compress: o.Compress}}
	s.pend = make([]byte, 0, flushSize+1024)
	m := o.Metrics
	s.written = m.Exported.WithLabelValues(o.Name)
	s.filtered = m.Filtered.WithLabelValues(o.Name)
	s.lost = m.Dropped.WithLabelValues(o.Name, sink.ReasonBufferFull)
	s.writeErrs = m.Dropped.WithLabelValues(o.Name, sink.ReasonSendError)
	s.open = m.Connected.WithLabelValues(o.Name)
	return s, nil
}

// Run writes the records c yields until the buffer is closed and drained
// or ctx ends; either way what is buffered is flushed and the file
// closed.
func (s *Sink) Run(ctx context.Context, c *ring.Consumer[*flow.Flow]) error {
	s.open.Set(1)
	s.lastFlush = time.Now()
	defer func() {
		s.flush()
		if err := s.lj.Close(); err != nil {
			s.o.Log.Warn("closing the flow log", "sink", s.o.Name, "path", s.o.Path, "err", err)
		}
		s.open.Set(0)
	}()
	var batch []*flow.Flow
	var lost uint64
	for {
		wctx, cancel := context.WithTimeout(ctx, s.o.FlushInterval)
		var ok bool
		batch, ok = c.Next(wctx, batch[:0], 512)
		idle := wctx.Err() != nil
		cancel()
		if c.Lost > lost {
			s.lost.Add(float64(c.Lost - lost))
			lost = c.Lost
		}
		for _, f := range batch {
			s.write(f)
		}
		clear(batch)
		// The lines are text now: the records can be reused.
		c.Release(0)
		if !ok && (ctx.Err() != nil || !idle) {
			return nil
		}
		if idle || time.Since(s.lastFlush) >= s.o.FlushInterval {
			s.flush()
		}
	}
}

func (s *Sink) write(f *flow.Flow) {
	if !s.selected(f) {
		s.filtered.Inc()
		return
	}
	s.pend = AppendLine(s.pend, f, s.o.PrettyPrint)
	s.pend = append(s.pend, '\n')
	s.pendN++
	if len(s.pend) >= flushSize {
		s.flush()
	}
}

func (s *Sink) selected(f *flow.Flow) bool {
	if len(s.o.Filters) == 0 {
		return true
	}
	for _, x := range s.o.Filters {
		if x.Matches(f) {
			return true
		}
	}
	return false
}

// flush writes the pending lines in one write (lumberjack rotates
// between writes, so a line never straddles two files).
func (s *Sink) flush() {
	s.lastFlush = time.Now()
	if s.pendN == 0 {
		return
	}
	_, err := s.lj.Write(s.pend)
	if err != nil {
		s.failed(err)
		s.writeErrs.Add(float64(s.pendN))
	} else {
		s.written.Add(float64(s.pendN))
		if s.failing {
			s.o.Log.Info("flow log writable again", "sink", s.o.Name, "path", s.o.Path)
			s.failing = false
		}
	}
	s.pend, s.pendN = s.pend[:0], 0
}

// failed logs the first of a run of write errors.
func (s *Sink) failed(err error) {
	if !s.failing {
		s.o.Log.Error("cannot write the flow log; records are dropped until it is writable", "sink", s.o.Name,
			"path", s.o.Path, "err", err)
		s.failing = true
	}
}
