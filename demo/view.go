package demo

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// ANSI sequences: cursor home, clear the screen, clear to the end of the
// line, clear to the end of the screen. A frame is drawn over the last
// one, each line cleared after its text, so that it does not flicker.
const (
	cursorHome  = "\x1b[H"
	clearScreen = "\x1b[2J"
	clearLine   = "\x1b[K"
	clearBelow  = "\x1b[J"
)

// header says what runs, once, before plain lines.
func (r *runner) header() {
	if r.o.Terminal {
		return
	}
	fmt.Fprintf(r.o.Stdout, "sluice demo: %s mode, %d Nodes, %d Pods, %.0f new connections/s %s, drawn from %d routes (%d denied by policy)\n",
		r.o.Mode, len(r.nodes), len(r.m.tf.State.Pods), r.o.Rate, r.lasting(), len(r.m.routes), len(r.m.denied))
}

// lasting says how long traffic flows.
func (r *runner) lasting() string {
	if r.o.UntilInterrupted {
		return "until Ctrl-C"
	}
	return "for " + r.o.Duration.String()
}

// rateWindow is the span rates are averaged over: records leave the
// aggregator in bursts (once a second per sink, at each active timeout).
const rateWindow = 5 * time.Second

// watch shows the view every Refresh until ctx ends.
func (r *runner) watch(ctx context.Context, start time.Time) {
	t := time.NewTicker(r.o.Refresh)
	defer t.Stop()
	history := []figures{r.figures(start)}
	if r.o.Terminal {
		fmt.Fprint(r.o.Stdout, clearScreen)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f := r.figures(now)
			for len(history) > 1 && f.at.Sub(history[1].at) >= rateWindow {
				history = history[1:]
			}
			if r.o.Terminal {
				r.frame(f, history[0], start)
			} else {
				r.line(f, history[0], start)
			}
			history = append(history, f)
		}
	}
}

func perSecond(now, before uint64, dt time.Duration) float64 {
	if dt <= 0 || now < before {
		return 0
	}
	return float64(now-before) / dt.Seconds()
}

// line is one plain line of figures.
func (r *runner) line(f, prev figures, start time.Time) {
	dt := f.at.Sub(prev.at)
	var b strings.Builder
	fmt.Fprintf(&b, "[%3.0fs] sent %d, received %d (%.0f/s); exported %d (%.0f/s): %d name both Pods",
		f.at.Sub(start).Seconds(), f.sent, f.received, perSecond(f.received, prev.received, dt),
		f.stats.out, perSecond(f.stats.out, prev.stats.out, dt), f.stats.bothPods)
	if r.stats.aggregate {
		fmt.Fprintf(&b, ", %d correlated", f.stats.correlated)
	}
	fmt.Fprintf(&b, "; %d denied", f.stats.denied)
	for _, e := range f.stats.egress {
		fmt.Fprintf(&b, "; Egress %s (%s): %d", e.Name, e.IP, e.Records)
	}
	fmt.Fprintf(&b, "; skew: %d unknown, %d missing IEs", f.unknown, f.missing)
	if len(f.stats.top) > 0 {
		t := f.stats.top[0]
		fmt.Fprintf(&b, "; top: %s → %s %s", t.From, t.To, bitRate(t.BitsPerSecond))
	}
	fmt.Fprintln(r.o.Stdout, b.String())
}

// frame redraws the terminal.
func (r *runner) frame(f, prev figures, start time.Time) {
	dt := f.at.Sub(prev.at)
	var b bytes.Buffer
	if u := r.agg.UIURL(); u != "" {
		fmt.Fprintf(&b, "web UI: %s\n", u)
	}
	of := "of " + r.o.Duration.String()
	if r.o.UntilInterrupted {
		of = "(Ctrl-C stops)"
	}
	fmt.Fprintf(&b, "sluice demo · %s mode · %d Nodes, %d Pods, %d routes (%d denied by policy) · %.0fs %s\n\n",
		r.o.Mode, len(r.nodes), len(r.m.tf.State.Pods), len(r.m.routes), len(r.m.denied),
		f.at.Sub(start).Seconds(), of)
	fmt.Fprintf(&b, "exporters → aggregator (IPFIX, mutual TLS): %.0f records/s over the last 5 s\n",
		perSecond(f.received, prev.received, dt))
	r.exporterTable(&b, f.nodes, f.sent, f.received, "")
	fmt.Fprintf(&b, "\naggregator → IPFIX collector: %.0f records/s; %d records, %d name both Pods",
		perSecond(f.stats.out, prev.stats.out, dt), f.stats.out, f.stats.bothPods)
	recent := "latest inter-Node records (each Node's own, the other Pod filled in by the aggregator)"
	if r.stats.aggregate {
		fmt.Fprintf(&b, ", %d correlated across Nodes", f.stats.correlated)
		recent = "latest correlated records (both Pods named, both Nodes reported)"
	}
	b.WriteString("\n")
	if !r.distinct {
		fmt.Fprintf(&b, "skew (all exporters): %d unknown IEs, %d missing IEs\n", f.unknown, f.missing)
	}
	b.WriteString("\ntop talkers (average since start)\n")
	talkers(&b, f.stats.top)
	fmt.Fprintf(&b, "\n%s\n", recent)
	for _, l := range f.stats.recent {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	egressTable(&b, f.stats.egress)
	fmt.Fprintf(&b, "\nlatest denied connections (%d records: unanswered, and a policy of the model drops them)\n", f.stats.denied)
	for _, l := range f.stats.recentDenied {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	screen := cursorHome + strings.ReplaceAll(b.String(), "\n", clearLine+"\n") + clearBelow
	_, _ = io.WriteString(r.o.Stdout, screen)
}

// exporterTable prints one row per exporter and the totals.
func (r *runner) exporterTable(w io.Writer, nodes []ExporterFigures, sent, received uint64, lost string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tPROFILE\tFROM\tSENT\tRECEIVED\tUNKNOWN IEs\tMISSING IEs")
	for _, n := range nodes {
		if r.distinct {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%d\t%d\t%d\n", n.Node, n.Profile, n.Address, n.Sent, n.Received, n.SkewUnknown, n.SkewMissing)
		} else {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t-\t-\t-\n", n.Node, n.Profile, n.Address, n.Sent)
		}
	}
	fmt.Fprintf(tw, "  total\t\t\t%d\t%d\t%s\t\n", sent, received, lost)
	_ = tw.Flush()
}

// egressTable prints the records that left through each Egress.
func egressTable(w io.Writer, egress []EgressFigures) {
	if len(egress) == 0 {
		return
	}
	fmt.Fprintln(w, "\nleaving through an Egress")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  EGRESSNAME\tEGRESSIP\tEGRESS NODE\tRECORDS")
	for _, e := range egress {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\n", e.Name, e.IP, e.Node, e.Records)
	}
	_ = tw.Flush()
}

func talkers(w io.Writer, top []Talker) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, t := range top {
		fmt.Fprintf(tw, "  %s → %s\t%s\t%s\n", t.From, t.To, bitRate(t.BitsPerSecond), octets(t.Octets))
	}
	_ = tw.Flush()
}

func bitRate(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.1f Gb/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f Mb/s", bps/1e6)
	case bps >= 1e3:
		return fmt.Sprintf("%.1f kb/s", bps/1e3)
	}
	return fmt.Sprintf("%.0f b/s", bps)
}

func octets(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
