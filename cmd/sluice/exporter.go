package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"sluice/certs"
	"sluice/config"
	"sluice/enrich"
	"sluice/exporter"
	"sluice/exporter/collectoraddr"
	"sluice/exporter/connstore"
	"sluice/exporter/source"
	"sluice/exporter/source/ctnetlink"
	"sluice/exporter/source/synthetic"
	"sluice/flow/ipfixmap"
)

// exporterFlags are the flags of `sluice exporter`; defaults are the
// reference agent's.
type exporterFlags struct {
	collector      string
	node           string
	podCIDRs       []string
	clusterCIDRs   []string
	source         string
	netns          string
	inventory      string
	kubeconfig     string
	profile        string
	rate           float64
	poll           time.Duration
	active         time.Duration
	idle           time.Duration
	tlsCert        string
	tlsKey         string
	tlsCA          string
	tlsServerName  string
	tlsCertDir     string
	tlsNamespace   string
	profileSet     bool
	metricsAddress string
	maxConns       int
	bufferSize     int
	log            logOptions
}

func newExporterCmd() *cobra.Command {
	var f exporterFlags
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
			f.profileSet = cmd.Flags().Changed("ie-profile")
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runExporter(ctx, &f, log)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.collector, "collector", "flow-aggregator/flow-aggregator:14739:grpc",
		"aggregator address <host>:[<port>][:<proto>]; host may be namespace/service; proto (grpc, tls, tcp, udp) defaults to tls, port to 4739 (14739 with grpc)")
	fl.StringVar(&f.node, "node", os.Getenv("NODE_NAME"), "this Node's name (default $NODE_NAME, else the host name)")
	fl.StringArrayVar(&f.podCIDRs, "pod-cidr", nil, "this Node's Pod CIDR (repeatable); default the Node's podCIDRs from the metadata source")
	fl.StringArrayVar(&f.clusterCIDRs, "cluster-cidr", nil, "every Node's Pod CIDRs (repeatable, optional): addresses in them count as Pods for the flow type")
	fl.StringVar(&f.source, "source", "conntrack", "connection source: conntrack or synthetic")
	fl.StringVar(&f.netns, "netns", "", "read conntrack in this named network namespace (a name from ip netns list, or a path such as /proc/PID/ns/net) instead of the current one")
	fl.StringVar(&f.inventory, "inventory", "", "Pod metadata from this file (kubectl get pods,nodes,services -A -o yaml), re-read when it changes")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "Pod metadata from the cluster this kubeconfig names")
	fl.StringVar(&f.profile, "ie-profile", ipfixmap.NewestAgent, "IPFIX only: Antrea agent version whose elements are sent: "+fmt.Sprint(ipfixmap.AgentVersions()))
	fl.Float64Var(&f.rate, "rate", 100, "synthetic source: new connections per second")
	fl.DurationVar(&f.poll, "poll-interval", exporter.DefaultPollInterval, "how often the connection table is read (at least 1s)")
	fl.DurationVar(&f.active, "active-timeout", connstore.DefaultActiveTimeout, "a changing connection is exported this often")
	fl.DurationVar(&f.idle, "idle-timeout", connstore.DefaultIdleTimeout, "a connection without new packets for this long is exported once as idle")
	fl.StringVar(&f.tlsCert, "tls-cert-file", "", "client certificate (PEM) for the tls and grpc protocols (grpc requires one)")
	fl.StringVar(&f.tlsKey, "tls-key-file", "", "client certificate's key (PEM)")
	fl.StringVar(&f.tlsCA, "tls-ca-file", "", "CA (PEM) the aggregator's certificate is checked against; default the system roots")
	fl.StringVar(&f.tlsCertDir, "tls-cert-dir", "", "a copy of the aggregator's generated certificate directory: ca.crt, client.crt and client.key in it stand for the --tls-*-file flags not given; with grpc and no --tls-* flag, the generated directory of this machine is used when it has them")
	fl.StringVar(&f.tlsNamespace, "tls-from-namespace", "", "fetch ca.crt and the client certificate the aggregator publishes in this namespace (ConfigMap flow-aggregator-ca, Secret flow-aggregator-client-tls) through the API, with the Pod's service account or $KUBECONFIG; stands for --tls-cert-dir")
	fl.StringVar(&f.tlsServerName, "tls-server-name", "", "name expected in the aggregator's certificate; default the collector host")
	fl.StringVar(&f.metricsAddress, "metrics-address", ":10350", "address of /metrics, /healthz and /readyz; empty for none")
	fl.IntVar(&f.maxConns, "max-connections", connstore.DefaultMaxConnections, "connections tracked at most; more are counted and skipped")
	fl.IntVar(&f.bufferSize, "buffer-size", exporter.DefaultBufferSize, "flow records held while the aggregator is slow or unreachable; the oldest are dropped beyond it")
	f.log.register(cmd)
	cmd.SetContext(context.Background())
	return cmd
}

func parsePrefixes(flag string, vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %w", flag, v, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func runExporter(ctx context.Context, f *exporterFlags, log *slog.Logger) error {
	coll, err := collectoraddr.Parse(f.collector)
	if err != nil {
		return fmt.Errorf("--collector: %w", err)
	}
	if !slices.Contains(ipfixmap.AgentVersions(), f.profile) {
		return fmt.Errorf("--ie-profile %q: not one of %v", f.profile, ipfixmap.AgentVersions())
	}
	if f.node == "" {
		if f.node, err = os.Hostname(); err != nil || f.node == "" {
			return errors.New("--node: no Node name given, and the host name is unknown")
		}
	}
	if f.inventory != "" && f.kubeconfig != "" {
		return errors.New("--inventory and --kubeconfig: give one metadata source, not both")
	}
	podCIDRs, err := parsePrefixes("pod-cidr", f.podCIDRs)
	if err != nil {
		return err
	}
	clusterCIDRs, err := parsePrefixes("cluster-cidr", f.clusterCIDRs)
	if err != nil {
		return err
	}
	if f.source != "conntrack" && f.source != "synthetic" {
		return fmt.Errorf("--source %q: want conntrack or synthetic", f.source)
	}
	if f.netns != "" && f.source != "conntrack" {
		return errors.New("--netns only applies to the conntrack source")
	}
	if f.rate <= 0 {
		return fmt.Errorf("--rate %v: must be positive", f.rate)
	}
	if f.poll < exporter.MinPollInterval {
		return fmt.Errorf("--poll-interval %v: at least %v", f.poll, exporter.MinPollInterval)
	}
	if f.active <= 0 || f.idle <= 0 {
		return errors.New("--active-timeout and --idle-timeout must be positive")
	}
	if f.maxConns <= 0 || f.bufferSize <= 0 {
		return errors.New("--max-connections and --buffer-size must be positive")
	}

	if f.tlsNamespace != "" {
		if f.tlsCertDir != "" {
			return errors.New("--tls-from-namespace and --tls-cert-dir: give one, not both")
		}
		if f.tlsCertDir, err = clusterCertDir(ctx, f.tlsNamespace, log); err != nil {
			return err
		}
		defer os.RemoveAll(f.tlsCertDir)
	}
	tlsConf, err := exporterTLS(f, coll.Proto, log)
	if err != nil {
		return err
	}
	if coll.Proto == "grpc" && f.profileSet {
		log.Warn("--ie-profile applies to IPFIX only; over gRPC every field the exporter has is sent", "ie_profile", f.profile)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	bgCtx, stopBg := context.WithCancel(ctx)
	defer stopBg()
	var store enrich.Store
	switch {
	case f.inventory != "":
		inv, err := enrich.NewInventory(f.inventory, enrich.InventoryOptions{Logger: log})
		if err != nil {
			return fmt.Errorf("--inventory: %w", err)
		}
		store = inv
		wg.Add(1)
		go func() { defer wg.Done(); _ = inv.Run(bgCtx) }()
	case f.kubeconfig != "":
		rc, err := enrich.KubeConfig(f.kubeconfig)
		if err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return fmt.Errorf("--kubeconfig: %w", err)
		}
		k := enrich.NewKube(client, enrich.KubeOptions{Logger: log})
		store = k
		wg.Add(1)
		go func() { defer wg.Done(); _ = k.Run(bgCtx) }()
		select {
		case <-k.Ready():
		case <-ctx.Done():
			return nil
		}
	}
	if len(podCIDRs) == 0 && store != nil {
		if n, ok := store.NodeByName(f.node); ok {
			podCIDRs = n.PodCIDRs
		}
	}
	if len(podCIDRs) == 0 && store == nil {
		if podCIDRs, err = inClusterPodCIDRs(ctx, f.node, f.source == "synthetic", log); err != nil {
			return err
		}
	}
	if len(podCIDRs) == 0 {
		if f.source != "synthetic" {
			return fmt.Errorf("--pod-cidr: none given, and the metadata source has no podCIDRs for Node %q", f.node)
		}
		podCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
		log.Info("no Pod CIDR given; the synthetic source uses a default", "pod_cidr", podCIDRs[0])
	}

	var src source.Source
	if f.source == "conntrack" {
		if src, err = ctnetlink.Open(f.netns); err != nil {
			return fmt.Errorf("--source conntrack: %w", err)
		}
	} else {
		if src, err = synthetic.New(synthetic.Options{Rate: f.rate, PodCIDRs: podCIDRs, PeerCIDRs: clusterCIDRs,
			Seed: uint64(time.Now().UnixNano())}); err != nil {
			return fmt.Errorf("--source synthetic: %w", err)
		}
	}
	opts := exporter.Options{Node: f.node, PodCIDRs: podCIDRs, ClusterCIDRs: clusterCIDRs, Source: src, Store: store,
		Collector: coll, Profile: f.profile, TLS: tlsConf, PollInterval: f.poll, ActiveTimeout: f.active, IdleTimeout: f.idle,
		MaxConnections: f.maxConns, BufferSize: f.bufferSize, MetricsAddress: f.metricsAddress, Log: log}
	e, err := exporter.New(opts)
	if err != nil {
		src.Close()
		return err
	}
	return e.Run(ctx)
}

// exporterTLS is the client TLS configuration for the collector protocol:
// nil for tcp and udp, whose --tls-* flags are refused; the system roots
// and no client certificate for tls by default; and for grpc, which the
// aggregator serves with mutual TLS only, a client certificate, from the
// flags or from this machine's generated certificate directory (an
// aggregator and an exporter on one machine need no flags).
func exporterTLS(f *exporterFlags, proto string, log *slog.Logger) (*tls.Config, error) {
	anyFlag := f.tlsCert != "" || f.tlsKey != "" || f.tlsCA != "" || f.tlsCertDir != ""
	if proto != "tls" && proto != "grpc" {
		if anyFlag { // --tls-server-name alone was always let through
			return nil, fmt.Errorf("--tls-* flags given, but the collector protocol is %s, not tls or grpc", proto)
		}
		return nil, nil
	}
	dir := f.tlsCertDir
	if dir == "" && !anyFlag && proto == "grpc" {
		if d, err := (config.ServerTLS{}).CertDirectory(); err == nil && fileExists(filepath.Join(d, certs.ClientCertFile)) {
			dir = d
			log.Info("using the generated client certificate of this machine", "dir", d)
		}
	}
	certFile, keyFile, caFile := f.tlsCert, f.tlsKey, f.tlsCA
	if dir != "" {
		or := func(v, name string) string {
			if v != "" {
				return v
			}
			return filepath.Join(dir, name)
		}
		certFile, keyFile, caFile = or(certFile, certs.ClientCertFile), or(keyFile, certs.ClientKeyFile), or(caFile, certs.CACertFile)
	}
	if proto == "grpc" && certFile == "" {
		return nil, errors.New("--tls-cert-file/--tls-key-file: the grpc protocol needs a client certificate signed by the aggregator's CA " +
			"(or --tls-cert-dir with the aggregator's generated client.crt, client.key and ca.crt)")
	}
	b, err := certs.LoadClient(certFile, keyFile, caFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file/--tls-key-file/--tls-ca-file/--tls-cert-dir: %w", err)
	}
	return b.ClientTLS(f.tlsServerName), nil
}
