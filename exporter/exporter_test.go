package exporter

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sluice/exporter/collectoraddr"
	"sluice/exporter/source/synthetic"
	"sluice/ipfix"
)

// TestRunSyntheticToCollector: the whole exporter with the synthetic
// source sends decodable records to a real TCP collector, serves its
// metrics, and on shutdown leaves nothing unsent.
func TestRunSyntheticToCollector(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var records, domainOK atomic.Int64
	domain := ObservationDomain("node-7")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				d := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
				mr := ipfix.NewMessageReader(c)
				for {
					m, err := mr.Next()
					if err != nil || d.Reset(m, time.Now()) != nil {
						return
					}
					for d.Next() {
						records.Add(1)
						if d.Header().ObservationDomainID == domain {
							domainOK.Add(1)
						}
					}
				}
			}()
		}
	}()
	local := []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}
	src, err := synthetic.New(synthetic.Options{Rate: 2000, PodCIDRs: local,
		PeerCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.8.0/24")}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	coll, err := collectoraddr.Parse(ln.Addr().String() + ":tcp")
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Node: "node-7", PodCIDRs: local, Source: src, Collector: coll, PollInterval: time.Second,
		ActiveTimeout: time.Second, MetricsAddress: "127.0.0.1:0", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for records.Load() < 300 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if records.Load() < 300 {
		t.Fatalf("%d records arrived", records.Load())
	}
	resp, err := http.Get("http://" + e.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"sluice_exporter_records_exported_total", `sluice_exporter_connections{state="open"}`,
		`sluice_exporter_records_total{reason="end_of_flow"}`, "sluice_exporter_connected 1", "sluice_exporter_poll_duration_seconds_bucket"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if r, err := http.Get("http://" + e.MetricsAddr() + "/readyz"); err != nil || r.StatusCode != 200 {
		t.Errorf("/readyz: %v %v", r, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if e.Queue().Len() != 0 {
		t.Fatalf("%d records unsent at shutdown", e.Queue().Len())
	}
	if records.Load() != domainOK.Load() {
		t.Fatalf("%d of %d records in the Node's observation domain", domainOK.Load(), records.Load())
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	src, _ := synthetic.New(synthetic.Options{Rate: 1, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}})
	coll, _ := collectoraddr.Parse("127.0.0.1:1:tcp")
	base := Options{Node: "n", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, Source: src, Collector: coll}
	for name, mod := range map[string]func(*Options){
		"no source":        func(o *Options) { o.Source = nil },
		"fast poll":        func(o *Options) { o.PollInterval = 10 * time.Millisecond },
		"no Pod CIDR":      func(o *Options) { o.PodCIDRs = nil },
		"no node":          func(o *Options) { o.Node = "" },
		"bad profile":      func(o *Options) { o.Profile = "v0.1" },
		"negative buffer":  func(o *Options) { o.BufferSize = -1 },
		"negative held":    func(o *Options) { o.MaxHeld = -1 },
		"metrics in use":   func(o *Options) { o.MetricsAddress = "127.0.0.1:notaport" },
		"no collector set": func(o *Options) { o.Collector = collectoraddr.Collector{} },
	} {
		o := base
		mod(&o)
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
