package ui

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Series the Health page reads.
const (
	metricReceived  = "sluice_collector_records_received_total"
	metricSessions  = "sluice_collector_sessions_open"
	metricUnknown   = "sluice_skew_unknown_elements_total"
	metricMissing   = "sluice_skew_missing_elements_total"
	metricExported  = "sluice_sink_records_exported_total"
	metricConnected = "sluice_sink_connected"
	metricSinkDrop  = "sluice_sink_records_dropped_total"
)

// rateSpan is how far back rates look.
const rateSpan = 5 * time.Second

// activeSpan: an exporter whose records arrived within it is active.
const activeSpan = 10 * time.Second

// series is one sample of one time series.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

type snapshot struct {
	at     time.Time
	series map[string]series // by name and labels
}

func seriesKey(name string, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(name)
	for _, k := range keys {
		b.WriteString("," + k + "=" + labels[k])
	}
	return b.String()
}

// sampler keeps the last few samples of the metrics, so that rates are
// read over a few seconds (bounded: one sample a second, activeSpan of
// them).
type sampler struct {
	g     prometheus.Gatherer
	mu    sync.Mutex
	snaps []snapshot
}

func newSampler(g prometheus.Gatherer) *sampler { return &sampler{g: g} }

func (s *sampler) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	s.sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sample(now)
		}
	}
}

func (s *sampler) take(now time.Time) snapshot {
	snap := snapshot{at: now, series: map[string]series{}}
	if s.g == nil {
		return snap
	}
	mfs, err := s.g.Gather()
	if err != nil && len(mfs) == 0 {
		return snap
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var v float64
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			default:
				continue
			}
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			snap.series[seriesKey(mf.GetName(), labels)] = series{name: mf.GetName(), labels: labels, value: v}
		}
	}
	return snap
}

func (s *sampler) sample(now time.Time) {
	snap := s.take(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snaps = append(s.snaps, snap)
	keep := int(activeSpan/time.Second) + 2
	if len(s.snaps) > keep {
		s.snaps = append(s.snaps[:0], s.snaps[len(s.snaps)-keep:]...)
	}
}

// Health is GET /api/health.
type Health struct {
	At        int64            `json:"at"`
	Mode      string           `json:"mode"`
	Exporters []ExporterHealth `json:"exporters"`
	// Sessions are the collectors' open sessions by transport.
	Sessions map[string]float64 `json:"sessions"`
	// In is records received a second; Out records exported a second,
	// all sinks together.
	In  float64 `json:"in"`
	Out float64 `json:"out"`
	// Drops are every counter of records (or datagrams) lost, by series
	// and labels, with their totals and rates.
	Drops []Drop       `json:"drops"`
	Sinks []SinkHealth `json:"sinks"`
	// UI is the web UI's own tap.
	UI UIHealth `json:"ui"`
}

// ExporterHealth is one exporter (by the address it sends from).
type ExporterHealth struct {
	Address   string  `json:"address"`
	Transport string  `json:"transport"`
	Records   float64 `json:"records"`
	Rate      float64 `json:"rate"`
	Active    bool    `json:"active"`
	// Unknown and Missing are the skew counts: elements the aggregator
	// did not know, and elements of the newest agent set the records
	// lacked, summed over records; per record in the Profile.
	Unknown float64 `json:"unknown"`
	Missing float64 `json:"missing"`
	Profile string  `json:"profile"`
}

// Drop is one drop counter.
type Drop struct {
	Series string            `json:"series"`
	Labels map[string]string `json:"labels"`
	Total  float64           `json:"total"`
	Rate   float64           `json:"rate"`
}

// SinkHealth is one running sink.
type SinkHealth struct {
	Name      string  `json:"name"`
	Connected bool    `json:"connected"`
	Exported  float64 `json:"exported"`
	Rate      float64 `json:"rate"`
	Dropped   float64 `json:"dropped"`
}

// UIHealth are the UI's own figures.
type UIHealth struct {
	Seen    float64 `json:"seen"`
	Dropped float64 `json:"dropped"`
}

// dropSeries reports whether a series counts lost records.
func dropSeries(name string) bool {
	return strings.HasSuffix(name, "_total") && (strings.Contains(name, "dropped") || strings.Contains(name, "evicted") || strings.Contains(name, "lost"))
}

// profile describes an exporter's element set from its skew counts.
func profile(records, unknown, missing float64) string {
	if records == 0 {
		return "no records yet"
	}
	u, m := unknown/records, missing/records
	switch {
	case u > 0 && m > 0:
		return "mixed: " + fmtPer(u) + " unknown and " + fmtPer(m) + " missing elements a record"
	case u > 0:
		return "newer than the aggregator: " + fmtPer(u) + " unknown elements a record"
	case m > 0:
		return "older than the newest agent: " + fmtPer(m) + " missing elements a record"
	}
	return "the newest agent's element set"
}

func fmtPer(v float64) string {
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// report builds the Health page's figures from the newest sample and the
// one rateSpan before it.
func (s *sampler) report(now time.Time, mode string, sinks []string) Health {
	s.mu.Lock()
	snaps := append([]snapshot(nil), s.snaps...)
	s.mu.Unlock()
	cur := s.take(now)
	base, activeBase := cur, cur
	for _, sn := range snaps {
		if now.Sub(sn.at) <= rateSpan+500*time.Millisecond && base.at == cur.at {
			base = sn
		}
		if now.Sub(sn.at) <= activeSpan+500*time.Millisecond && activeBase.at == cur.at {
			activeBase = sn
		}
	}
	rate := func(key string) float64 {
		d := cur.at.Sub(base.at).Seconds()
		if d <= 0 {
			return 0
		}
		return max(0, (cur.series[key].value-base.series[key].value)/d)
	}
	h := Health{At: now.UnixMilli(), Mode: mode, Sessions: map[string]float64{}, Exporters: []ExporterHealth{}, Drops: []Drop{}, Sinks: []SinkHealth{}}
	byExporter := map[string]*ExporterHealth{}
	for key, se := range cur.series {
		switch {
		case se.name == metricReceived:
			a := se.labels["exporter"]
			e := byExporter[a]
			if e == nil {
				e = &ExporterHealth{Address: a}
				byExporter[a] = e
			}
			if e.Transport == "" || se.value > 0 {
				e.Transport = se.labels["transport"]
			}
			e.Records += se.value
			e.Rate += rate(key)
			if prev, ok := activeBase.series[key]; activeBase.at.Equal(cur.at) || !ok {
				e.Active = e.Active || se.value > 0
			} else if se.value > prev.value {
				e.Active = true
			}
			h.In += rate(key)
		case se.name == metricSessions:
			h.Sessions[se.labels["transport"]] += se.value
		case se.name == metricExported:
			h.Out += rate(key)
		case se.name == "sluice_ui_flows_seen_total":
			h.UI.Seen = se.value
		}
		if dropSeries(se.name) {
			if se.name == "sluice_ui_flows_dropped_total" {
				h.UI.Dropped += se.value
			}
			h.Drops = append(h.Drops, Drop{Series: se.name, Labels: se.labels, Total: se.value, Rate: rate(key)})
		}
	}
	for a, e := range byExporter {
		e.Unknown = cur.series[seriesKey(metricUnknown, map[string]string{"exporter": a})].value
		e.Missing = cur.series[seriesKey(metricMissing, map[string]string{"exporter": a})].value
		e.Profile = profile(e.Records, e.Unknown, e.Missing)
		h.Exporters = append(h.Exporters, *e)
	}
	sort.Slice(h.Exporters, func(i, j int) bool { return h.Exporters[i].Address < h.Exporters[j].Address })
	sort.Slice(h.Drops, func(i, j int) bool {
		return seriesKey(h.Drops[i].Series, h.Drops[i].Labels) < seriesKey(h.Drops[j].Series, h.Drops[j].Labels)
	})
	for _, name := range sinks {
		k := map[string]string{"sink": name}
		sh := SinkHealth{Name: name,
			Connected: cur.series[seriesKey(metricConnected, k)].value > 0,
			Exported:  cur.series[seriesKey(metricExported, k)].value,
			Rate:      rate(seriesKey(metricExported, k))}
		for _, se := range cur.series {
			if se.name == metricSinkDrop && se.labels["sink"] == name {
				sh.Dropped += se.value
			}
		}
		h.Sinks = append(h.Sinks, sh)
	}
	return h
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.health.report(time.Now(), s.o.Mode, s.o.Sinks))
}
