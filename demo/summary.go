package demo

import (
	"bytes"
	"fmt"
	"sort"

	"sluice/config"
	"sluice/traceflow/render"
)

// printSummary writes the final report: the counts, what policies kept
// out, the busiest pairs, the files, and the trace through the Egress in
// antctl's layout.
func (r *runner) printSummary(s *Summary, traced route) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "\n== sluice demo: summary ==\n%s mode, %.1fs, %.0f new connections/s drawn from %d routes of %d Pods on %d Nodes\n\n",
		s.Mode, s.Elapsed.Seconds(), r.o.Rate, s.Routes, len(r.m.tf.State.Pods), len(s.Exporters))

	b.WriteString("exporters → aggregator (IPFIX over mutual TLS, counted before the connections closed)\n")
	r.exporterTable(&b, s.Exporters, s.Sent, s.Received, fmt.Sprintf("lost %d", s.Lost))
	if !s.PerExporter {
		b.WriteString("  (one source address for all exporters on this host: the aggregator counted them together)\n")
	}

	b.WriteString("\naggregator → sinks\n")
	names := make([]string, 0, len(s.SinkExported))
	for n := range s.SinkExported {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "  %s: %d records exported\n", n, s.SinkExported[n])
	}
	fmt.Fprintf(&b, "  the demo's IPFIX collector received %d records: %d name both Pods", s.CollectorReceived, s.BothPods)
	if s.Mode == config.ModeAggregate {
		fmt.Fprintf(&b, ", %d are inter-Node flows correlated from both Nodes' records", s.Correlated)
	}
	b.WriteString("\n")
	if s.Mode == config.ModeProxy {
		fmt.Fprintf(&b, "  %d carried the future exporter's unknown elements, passed through\n", s.PassedThrough)
	}

	if len(s.Denied) > 0 {
		fmt.Fprintf(&b, "\ndenied by policy, so never answered (%d of %d routes); %d records of denied connections arrived:\n",
			len(s.Denied), len(s.Denied)+s.Routes, s.DeniedRecords)
		for _, d := range s.Denied {
			fmt.Fprintf(&b, "  %s → %s: %s\n", d.Client, d.Target, d.By)
		}
		for _, l := range s.RecentDenied {
			fmt.Fprintf(&b, "  record: %s\n", l)
		}
	}
	egressTable(&b, s.Egresses)
	if len(s.Top) > 0 {
		b.WriteString("\ntop talkers (average over the run)\n")
		talkers(&b, s.Top)
	}
	if s.FlowLog != "" || s.Capture != "" {
		b.WriteString("\nfiles\n")
		if s.FlowLog != "" {
			fmt.Fprintf(&b, "  %s: the flow log\n", s.FlowLog)
		}
		if s.Capture != "" {
			fmt.Fprintf(&b, "  %s: the aggregator's IPFIX export (read it with: sluice ipfix decode %s)\n", s.Capture, s.Capture)
		}
	}
	if s.Trace != nil {
		where := r.o.ClusterDir
		if where == "" {
			where = "examples/cluster"
		}
		what := "traceflow of " + traced.client.Key()
		if r.m.tf.State.EffectiveEgress(traced.client) != nil && traced.external {
			what += " through its Egress"
		}
		fmt.Fprintf(&b, "\n%s:\n$ sluice traceflow -S %s -D %s -f %s --cluster %s\n",
			what, traced.client.Key(), traced.traceDst, traced.spec, where)
		if err := render.YAML(&b, render.Summarize(s.Trace)); err != nil {
			return err
		}
	}
	_, err := r.o.Stdout.Write(b.Bytes())
	return err
}
