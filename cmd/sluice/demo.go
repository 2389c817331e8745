package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"sluice/config"
	"sluice/demo"
)

func newDemoCmd() *cobra.Command {
	var (
		mode, out, clusterDir string
		clickHouseURL         string
		uiAddress             string
		duration              time.Duration
		rate                  float64
		logOpts               logOptions
	)
	cmd := &cobra.Command{
		Use:   "demo [--mode aggregate|proxy] [--duration 30s|0] [--ui-address ADDR] [--out DIR] [--rate N] [--cluster DIR] [--clickhouse-url tcp://HOST:9000]",
		Short: "Run a whole cluster's flow pipeline and a trace on this machine",
		Long: `Runs, in one process on loopback, an aggregator and one exporter per Node
of an example cluster (bundled; --cluster for your own YAML), each exporter
making up traffic between the cluster's Pods, to its Services and out
through its Egresses, as the Pods' demo.sluice.io/talks-to annotations ask
and the NetworkPolicies allow. The exporters send different Antrea agent
element sets (an old one, the newest, one newer than the aggregator) to
show version skew being handled.

The aggregator serves the web UI (flows, service map, Traceflow, health)
on --ui-address; its URL is the first line printed. --duration 0 keeps
traffic flowing until Ctrl-C, to explore it.

While it runs it shows the top talkers, correlated records and record
rates (redrawn on a terminal, plain lines otherwise); at the end, a
summary of what was sent, received and exported, and a Traceflow of one
Pod through its Egress in antctl's layout. --out DIR keeps the flow log
(Aggregate mode) and a capture of the aggregator's IPFIX export.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var m string
			switch strings.ToLower(mode) {
			case "aggregate":
				m = config.ModeAggregate
			case "proxy":
				m = config.ModeProxy
			default:
				return fmt.Errorf("--mode %q: want aggregate or proxy", mode)
			}
			if duration < 0 {
				return fmt.Errorf("--duration %s: must be positive, or 0 to run until Ctrl-C", duration)
			}
			if rate <= 0 {
				return fmt.Errorf("--rate %v: must be positive", rate)
			}
			// The default port taken (another demo runs), any free one will do.
			if !cmd.Flags().Changed("ui-address") && uiAddress != "" {
				if ln, err := net.Listen("tcp", uiAddress); err != nil {
					uiAddress = "127.0.0.1:0"
				} else {
					ln.Close()
				}
			}
			log, err := logOpts.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			stdout := cmd.OutOrStdout()
			isTerm := false
			if f, ok := stdout.(*os.File); ok {
				isTerm = term.IsTerminal(int(f.Fd()))
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// The first signal starts the orderly stop (draining can take
			// a few seconds); a second one ends the process at once.
			go func() { <-ctx.Done(); stop() }()
			_, err = demo.Run(ctx, demo.Options{Mode: m, Duration: duration, UntilInterrupted: duration == 0, UIAddress: uiAddress, Rate: rate, ClusterDir: clusterDir, Out: out, ClickHouseURL: clickHouseURL,
				Stdout: stdout, Terminal: isTerm, Log: log})
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&mode, "mode", "aggregate", "aggregator mode: aggregate (correlate both Nodes' records) or proxy (enrich each record)")
	fl.DurationVar(&duration, "duration", demo.DefaultDuration, "how long traffic flows; 0 runs until Ctrl-C")
	fl.StringVar(&uiAddress, "ui-address", demo.DefaultUIAddress, `where the web UI listens (host:port; a port alone binds to 127.0.0.1; "" turns it off)`)
	fl.StringVar(&out, "out", "", "directory for the flow log (aggregate mode) and the capture of the aggregator's IPFIX export")
	fl.Float64Var(&rate, "rate", demo.DefaultRate, "new connections per second in the whole cluster")
	fl.StringVar(&clusterDir, "cluster", "", "cluster objects (a directory of YAML/JSON, as sluice traceflow reads) instead of the bundled example")
	fl.StringVar(&clickHouseURL, "clickhouse-url", "", "also write the records to this ClickHouse (tcp://host:9000; CH_USERNAME, CH_PASSWORD), creating the flows table if missing")
	logOpts.register(cmd)
	// The view is the demo's output: the components speak only of problems.
	lvl := fl.Lookup("log-level")
	lvl.DefValue = "warn"
	_ = lvl.Value.Set("warn")
	return cmd
}
