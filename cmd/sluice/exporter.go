package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"sluice/exporter"
	"sluice/exporter/connstore"
	"sluice/flow/ipfixmap"
)

// exporterFlags are the flags of `sluice exporter`; defaults are the
// reference agent's.
type exporterFlags struct {
	s   exporter.Settings
	log logOptions
}

func newExporterCmd() *cobra.Command {
	cmd, _ := newExporterCmdFlags()
	return cmd
}

// settings are the exporter's Settings as cmd's flags give them.
func (f *exporterFlags) settings(cmd *cobra.Command) exporter.Settings {
	s := f.s
	s.ProfileSet = cmd.Flags().Changed("ie-profile")
	s.LateNamingSet = cmd.Flags().Changed("late-naming")
	return s
}

// newExporterCmdFlags is newExporterCmd, and the flags it fills (for tests).
func newExporterCmdFlags() (*cobra.Command, *exporterFlags) {
	f := new(exporterFlags)
	cmd := &cobra.Command{
		Use:   "exporter --collector HOST:PORT[:PROTO] --pod-cidr CIDR",
		Short: "Export this Node's Pod connections to the aggregator",
		Long: `Runs the per-Node flow exporter. It polls the connection table (Linux conntrack
through netlink, optionally inside a named network namespace, or a synthetic
source for load tests), keeps the connections of this Node's Pods, and sends
flow records to the aggregator over gRPC (Antrea's FlowExportService, mutual
TLS; the default) or over IPFIX (tls, tcp or udp) with the element set of the
chosen Antrea agent version. See docs/exporter.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := f.log.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			s := f.settings(cmd)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return s.Run(ctx, log)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.s.Collector, "collector", "flow-aggregator/flow-aggregator:14739:grpc",
		"aggregator address <host>:[<port>][:<proto>]; host may be namespace/service; proto (grpc, tls, tcp, udp) defaults to tls, port to 4739 (14739 with grpc)")
	fl.StringVar(&f.s.Node, "node", os.Getenv("NODE_NAME"), "this Node's name (default $NODE_NAME, else the host name)")
	fl.StringArrayVar(&f.s.PodCIDRs, "pod-cidr", nil, "this Node's Pod CIDR (repeatable); default the Node's podCIDRs from the metadata source")
	fl.StringArrayVar(&f.s.ClusterCIDRs, "cluster-cidr", nil, "every Node's Pod CIDRs (repeatable, optional): addresses in them count as Pods for the flow type")
	fl.StringVar(&f.s.Source, "source", "conntrack", "connection source: conntrack or synthetic")
	fl.StringVar(&f.s.Netns, "netns", "", "read conntrack in this named network namespace (a name from ip netns list, or a path such as /proc/PID/ns/net) instead of the current one")
	fl.StringVar(&f.s.Inventory, "inventory", "", "Pod metadata from this file (kubectl get pods,nodes,services -A -o yaml), re-read when it changes")
	fl.StringVar(&f.s.Kubeconfig, "kubeconfig", "", "Pod metadata and policy attribution from the cluster this kubeconfig names")
	fl.BoolVar(&f.s.InCluster, "in-cluster", false, "Pod metadata and policy attribution from the cluster this Pod runs in, with its ServiceAccount (which needs get, list and watch on what docs/exporter.md lists)")
	fl.BoolVar(&f.s.Attribution, "attribution", true, "with --in-cluster, --kubeconfig or --inventory: also name the policy rules and Egress acting on each connection; false keeps the Pod metadata only (and needs only pods, nodes and services)")
	fl.StringVar(&f.s.Profile, "ie-profile", ipfixmap.NewestAgent, "IPFIX only: Antrea agent version whose elements are sent: "+fmt.Sprint(ipfixmap.AgentVersions()))
	fl.Float64Var(&f.s.Rate, "rate", 100, "synthetic source: new connections per second")
	fl.DurationVar(&f.s.PollInterval, "poll-interval", exporter.DefaultPollInterval, "how often the connection table is read (at least 1s)")
	fl.DurationVar(&f.s.ActiveTimeout, "active-timeout", connstore.DefaultActiveTimeout, "a changing connection is exported this often")
	fl.DurationVar(&f.s.IdleTimeout, "idle-timeout", connstore.DefaultIdleTimeout, "a connection without new packets for this long is exported once as idle")
	fl.StringVar(&f.s.TLS.CertFile, "tls-cert-file", "", "client certificate (PEM) for the tls and grpc protocols (grpc requires one)")
	fl.StringVar(&f.s.TLS.KeyFile, "tls-key-file", "", "client certificate's key (PEM)")
	fl.StringVar(&f.s.TLS.CAFile, "tls-ca-file", "", "CA (PEM) the aggregator's certificate is checked against; default the system roots")
	fl.StringVar(&f.s.TLS.CertDir, "tls-cert-dir", "", "a copy of the aggregator's generated certificate directory: ca.crt, client.crt and client.key in it stand for the --tls-*-file flags not given; with grpc and no --tls-* flag, the generated directory of this machine is used when it has them")
	fl.StringVar(&f.s.TLS.FromNamespace, "tls-from-namespace", "", "fetch ca.crt and the client certificate the aggregator publishes in this namespace (ConfigMap flow-aggregator-ca, Secret flow-aggregator-client-tls) through the API, with the Pod's service account or $KUBECONFIG; stands for --tls-cert-dir")
	fl.StringVar(&f.s.TLS.ServerName, "tls-server-name", "", "name expected in the aggregator's certificate; default the collector host")
	fl.DurationVar(&f.s.TLS.ReloadInterval, "tls-reload-interval", 10*time.Second, "how often the --tls-* files are checked for changes; new connections use renewed files without a restart (0: never)")
	fl.StringVar(&f.s.MetricsAddress, "metrics-address", ":10350", "address of /metrics, /healthz and /readyz; empty for none")
	fl.IntVar(&f.s.MaxConnections, "max-connections", connstore.DefaultMaxConnections, "connections tracked at most; more are counted and skipped")
	fl.IntVar(&f.s.BufferSize, "buffer-size", exporter.DefaultBufferSize, "flow records held while the aggregator is slow or unreachable; the oldest are dropped beyond it")
	fl.DurationVar(&f.s.LateNaming, "late-naming", exporter.DefaultLateNaming, "how long after a connection starts a local end no Pod is known for yet (a Pod whose IP the kubelet has not posted) is looked up again, and its final record held back for the name; when not given, two poll intervals if that is longer; 0 turns it off")
	fl.IntVar(&f.s.MaxHeld, "max-held", exporter.DefaultMaxHeld, "final records held back for a Pod name at most (--late-naming); beyond it they are exported unnamed at once and counted")
	f.log.register(cmd)
	cmd.SetContext(context.Background())
	return cmd, f
}
