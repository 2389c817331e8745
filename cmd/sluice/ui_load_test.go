package main

import (
	"context"
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/ring"
	"sluice/ui"
)

// loadRate is the records a second the Flows page must keep up with.
const loadRate = 5000

// TestUIFlowsKeepUpAt5000PerSecond: while 5,000 records a second pass the
// pipeline's buffer, the Flows page stays responsive (frames and long
// tasks measured in the page with requestAnimationFrame and a
// PerformanceObserver), says that it shows a sample, and the pipeline is
// never held back (its producer keeps its rate).
func TestUIFlowsKeepUpAt5000PerSecond(t *testing.T) {
	chromiumPath(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	buf := ring.New[*flow.Flow](8192)
	reg := prometheus.NewRegistry()
	srv, err := ui.New(ui.Options{Buffer: buf, Gatherer: reg, Registerer: reg, Mode: "Aggregate"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	tapped := make(chan struct{})
	go func() { srv.Run(ctx); close(tapped) }()
	defer func() { cancel(); <-served; <-tapped }()

	// The producer: the pipeline's side, at loadRate, in 10 ms steps.
	pool := make([]*flow.Flow, 200)
	for i := range pool {
		pool[i] = flowtest.Full(i, true)
		if i%10 == 0 {
			pool[i].Egress.RuleAction, pool[i].Ingress.RuleAction = flow.ActionDrop, 0
		}
	}
	var produced atomic.Uint64
	start := time.Now()
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		batch := make([]*flow.Flow, 0, loadRate)
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			due := uint64(time.Since(start).Seconds()*loadRate) - produced.Load()
			batch = batch[:0]
			for i := uint64(0); i < due; i++ {
				batch = append(batch, pool[(produced.Load()+i)%uint64(len(pool))])
			}
			buf.Produce(batch...)
			produced.Add(due)
		}
	}()

	b := newBrowser(t, 1280, 800)
	base := ui.URL(ln.Addr().String())
	b.run(t, 30*time.Second, chromedp.Navigate(base+"#/flows"))
	b.waitJS(t, 60*time.Second, `document.querySelectorAll('.tbody [role=row]').length > 0 && /Sampling: showing/.test(document.querySelector('.sampling').textContent)`)
	// Five seconds of frames and long tasks, measured in the page.
	b.run(t, 10*time.Second, chromedp.Evaluate[chromedp.Void](`(() => {
	  const p = window.__perf = {long: [], frames: [], start: performance.now(), done: false, rows0: document.getElementById('flow-count').textContent}
	  new PerformanceObserver(l => { for (const e of l.getEntries()) p.long.push(e.duration) }).observe({type: 'longtask'})
	  let last = performance.now()
	  const loop = (ts) => { p.frames.push(ts - last); last = ts; if (ts - p.start < 5000) requestAnimationFrame(loop); else p.done = true }
	  requestAnimationFrame(loop)
	})()`))
	b.waitJS(t, 60*time.Second, `window.__perf.done`)
	var perf struct {
		Long, Frames []float64
		Rows0, Rows  string
		Sampling     string
	}
	b.eval(t, `({Long: __perf.long, Frames: __perf.frames, Rows0: __perf.rows0, Rows: document.getElementById('flow-count').textContent, Sampling: document.querySelector('.sampling').textContent})`, &perf)
	elapsed := time.Since(start)
	sort.Float64s(perf.Frames)
	var longTotal, longMax float64
	for _, d := range perf.Long {
		longTotal += d
		longMax = max(longMax, d)
	}
	if len(perf.Frames) == 0 {
		t.Fatal("no frames measured")
	}
	p95 := perf.Frames[len(perf.Frames)*95/100]
	t.Logf("%d frames in 5 s, p50 %.1f ms, p95 %.1f ms, max %.1f ms; %d long tasks, %.0f ms in all, longest %.0f ms; rows %s → %s; %q",
		len(perf.Frames), perf.Frames[len(perf.Frames)/2], p95, perf.Frames[len(perf.Frames)-1], len(perf.Long), longTotal, longMax, perf.Rows0, perf.Rows, perf.Sampling)
	// Bounds that hold on a busy machine (two cores shared with other
	// work) and not for a page that stalls: at least 5 frames a second at
	// the 95th percentile, under 60 % of the time in long tasks, none of
	// 1.5 s. (A table that is not virtualised spends seconds a frame.)
	if p95 > 200 {
		t.Errorf("frame time p95 %.1f ms, want at most 200 ms", p95)
	}
	if longTotal > 3000 || longMax >= 1500 {
		t.Errorf("long tasks: %.0f ms of 5000 ms, longest %.0f ms", longTotal, longMax)
	}
	if !strings.HasPrefix(perf.Sampling, "Sampling: showing") {
		t.Errorf("the page does not say that it samples: %q", perf.Sampling)
	}
	// The pipeline's producer was never held back.
	if n, want := produced.Load(), uint64(elapsed.Seconds()*loadRate*0.9); n < want {
		t.Errorf("the producer made %d records in %s, want at least %d", n, elapsed, want)
	}
}
