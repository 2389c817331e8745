package exporter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"sluice/api"
	"sluice/certs"
	"sluice/certs/kubecerts"
	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/collectoraddr"
	"sluice/exporter/source"
	"sluice/exporter/source/ctnetlink"
	"sluice/exporter/source/synthetic"
	"sluice/flow/ipfixmap"
	"sluice/kubeinformers"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/pipeline"
)

// Settings are the settings of `sluice exporter`, one a flag, as a user
// gives them: Run checks them (errors name the flag), opens the metadata
// and connection sources, and runs an Exporter.
type Settings struct {
	Collector    string   // --collector
	Node         string   // --node
	PodCIDRs     []string // --pod-cidr
	ClusterCIDRs []string // --cluster-cidr
	Source       string   // --source: conntrack or synthetic
	Netns        string   // --netns
	Inventory    string   // --inventory
	Kubeconfig   string   // --kubeconfig
	InCluster    bool     // --in-cluster: metadata and attribution with the Pod's ServiceAccount
	Attribution  bool     // --attribution (default true): policy attribution beside the metadata
	Profile      string   // --ie-profile
	// ProfileSet says --ie-profile was given (it applies to IPFIX only).
	ProfileSet     bool
	Rate           float64       // --rate
	PollInterval   time.Duration // --poll-interval
	ActiveTimeout  time.Duration // --active-timeout
	IdleTimeout    time.Duration // --idle-timeout
	MetricsAddress string        // --metrics-address
	MaxConnections int           // --max-connections
	BufferSize     int           // --buffer-size
	// LateNaming (--late-naming) is how long after a connection's start
	// an unnamed local Pod end is looked up again, its final record held
	// back for the name; 0 for never. LateNamingSet says it was given:
	// if not, the wait is DefaultLateNaming or two poll intervals,
	// whichever is longer (Options.LateNaming).
	LateNaming    time.Duration
	LateNamingSet bool
	MaxHeld       int // --max-held
	TLS           TLSFiles
}

// TLSFiles are the --tls-* flags.
type TLSFiles struct {
	CertFile, KeyFile, CAFile string // --tls-cert-file, --tls-key-file, --tls-ca-file
	CertDir                   string // --tls-cert-dir
	ServerName                string // --tls-server-name
	// FromNamespace (--tls-from-namespace) fetches what CertDir would
	// hold from the Kubernetes namespace the aggregator publishes it in.
	FromNamespace string
	// ReloadInterval (--tls-reload-interval) is how often the files are
	// checked for changes, which new connections then use; 0 for never.
	ReloadInterval time.Duration
}

// check checks what needs no file or network, and fills the Node name.
func (s *Settings) check() (collectoraddr.Collector, []netip.Prefix, []netip.Prefix, error) {
	var none collectoraddr.Collector
	coll, err := collectoraddr.Parse(s.Collector)
	if err != nil {
		return none, nil, nil, fmt.Errorf("--collector: %w", err)
	}
	if !slices.Contains(ipfixmap.AgentVersions(), s.Profile) {
		return none, nil, nil, fmt.Errorf("--ie-profile %q: not one of %v", s.Profile, ipfixmap.AgentVersions())
	}
	if s.Node == "" {
		if s.Node, err = os.Hostname(); err != nil || s.Node == "" {
			return none, nil, nil, errors.New("--node: no Node name given, and the host name is unknown")
		}
	}
	if s.Inventory != "" && s.Kubeconfig != "" {
		return none, nil, nil, errors.New("--inventory and --kubeconfig: give one metadata source, not both")
	}
	if s.InCluster && (s.Inventory != "" || s.Kubeconfig != "") {
		return none, nil, nil, errors.New("--in-cluster with --inventory or --kubeconfig: give one metadata source, not both")
	}
	podCIDRs, err := parsePrefixes("pod-cidr", s.PodCIDRs)
	if err != nil {
		return none, nil, nil, err
	}
	clusterCIDRs, err := parsePrefixes("cluster-cidr", s.ClusterCIDRs)
	if err != nil {
		return none, nil, nil, err
	}
	switch {
	case s.Source != "conntrack" && s.Source != "synthetic":
		err = fmt.Errorf("--source %q: want conntrack or synthetic", s.Source)
	case s.Netns != "" && s.Source != "conntrack":
		err = errors.New("--netns only applies to the conntrack source")
	case s.Rate <= 0:
		err = fmt.Errorf("--rate %v: must be positive", s.Rate)
	case s.PollInterval < MinPollInterval:
		err = fmt.Errorf("--poll-interval %v: at least %v", s.PollInterval, MinPollInterval)
	case s.ActiveTimeout <= 0 || s.IdleTimeout <= 0:
		err = errors.New("--active-timeout and --idle-timeout must be positive")
	case s.MaxConnections <= 0 || s.BufferSize <= 0:
		err = errors.New("--max-connections and --buffer-size must be positive")
	case s.LateNaming < 0:
		err = fmt.Errorf("--late-naming %v: must not be negative (0 turns late naming off)", s.LateNaming)
	case s.MaxHeld <= 0:
		err = fmt.Errorf("--max-held %d: must be positive", s.MaxHeld)
	case s.TLS.FromNamespace != "" && s.TLS.CertDir != "":
		err = errors.New("--tls-from-namespace and --tls-cert-dir: give one, not both")
	}
	return coll, podCIDRs, clusterCIDRs, err
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

// Run checks s, serves /healthz, /readyz and /metrics at once, opens the
// sources it names and runs an exporter until ctx ends. While it waits
// for what the set-up needs (certificates, the cluster's metadata, the
// Node's Pod CIDR), /healthz answers 200 and /readyz 503 with what it
// waits for, so that probes do not restart it; ended during the set-up (a
// SIGTERM), it returns nil.
func (s Settings) Run(ctx context.Context, log *slog.Logger) error {
	coll, podCIDRs, clusterCIDRs, err := s.check()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var wg sync.WaitGroup
	defer wg.Wait()
	bgCtx, stopBg := context.WithCancel(ctx)
	defer stopBg()
	st := &setup{}
	if s.MetricsAddress != "" {
		ln, err := net.Listen("tcp", s.MetricsAddress)
		if err != nil {
			return fmt.Errorf("--metrics-address: %w", err)
		}
		st.api = api.New(reg, log)
		wg.Go(func() {
			if err := st.api.Serve(bgCtx, ln); err != nil {
				log.Error("/healthz, /readyz and /metrics are no longer served", "err", err)
			}
		})
		log.Info("serving /healthz, /readyz and /metrics", "address", ln.Addr().String())
	}
	st.waiting("starting")
	err = s.run(ctx, bgCtx, &wg, st, reg, coll, podCIDRs, clusterCIDRs, log)
	if err != nil && ctx.Err() != nil {
		log.Info("stopped before the set-up was complete", "waiting_for", st.what)
		return nil
	}
	return err
}

// setup is what the exporter waits for before it exports, for /readyz.
type setup struct {
	api  *api.Server // nil without --metrics-address
	what string
}

func (st *setup) waiting(what string) {
	st.what = what
	if st.api != nil {
		st.api.SetNotReady("waiting for " + what)
	}
}

// run is Run once the probes are served: ctx is the run's, bgCtx (ended
// when Run returns) that of the background tasks wg waits for.
func (s Settings) run(ctx, bgCtx context.Context, wg *sync.WaitGroup, st *setup, reg *prometheus.Registry,
	coll collectoraddr.Collector, podCIDRs, clusterCIDRs []netip.Prefix, log *slog.Logger) error {
	var err error
	if ns := s.TLS.FromNamespace; ns != "" {
		st.waiting(fmt.Sprintf("the aggregator's certificates (ConfigMap %s and Secret %s in namespace %s)",
			kubecerts.CAConfigMap, kubecerts.ClientSecret, ns))
		if s.TLS.CertDir, err = clusterCertDir(ctx, ns, log); err != nil {
			return err
		}
		defer os.RemoveAll(s.TLS.CertDir)
	}
	tlsConf, tlsReload, err := s.TLS.config(coll.Proto, tlsServerName(s.TLS.ServerName, coll), log)
	if err != nil {
		return err
	}
	if coll.Proto == "grpc" && s.ProfileSet {
		log.Warn("--ie-profile applies to IPFIX only; over gRPC every field the exporter has is sent", "ie_profile", s.Profile)
	}
	if tlsReload != nil {
		wg.Go(func() { tlsReload.Run(bgCtx) })
	}
	// One informer factory for the Pod metadata and the attribution's
	// watch: one set of lists and watches of the cluster.
	meta, err := enrich.OpenSource(enrich.SourceOptions{Inventory: s.Inventory, Kubeconfig: s.Kubeconfig, InCluster: s.InCluster,
		ShareInformers: true, Logger: log})
	if err != nil {
		return fmt.Errorf("%s: %w", s.metadataFlag(), err)
	}
	var shared *kubeinformers.Shared
	if k, ok := meta.(*enrich.Kube); ok && k.Informers() != nil {
		shared = k.Informers()
		wg.Go(func() {
			<-bgCtx.Done() // its users stop with it
			shared.Shutdown()
		})
	}
	var store enrich.Store
	if meta != nil {
		store = meta
		st.waiting("the Pods, Nodes and Services of the cluster (" + s.metadataFlag() + ")")
		// A source that fails closes Ready too: say so, or records would
		// go without metadata and no one would know why.
		wg.Go(func() {
			if err := meta.Run(bgCtx); err != nil && bgCtx.Err() == nil {
				log.Error("the Pod metadata source failed; records go on without its metadata", "err", err)
			}
		})
		select {
		case <-meta.Ready():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if len(podCIDRs) == 0 && store != nil {
		if n, ok := store.NodeByName(s.Node); ok {
			podCIDRs = n.PodCIDRs
		}
		// The live cluster allocates Pod CIDRs after the Node registers:
		// wait for the Node to get one, as its informer reports.
		if len(podCIDRs) == 0 && s.Inventory == "" && s.Source != "synthetic" {
			st.waiting(fmt.Sprintf("a Pod CIDR of Node %s (spec.podCIDRs; or give --pod-cidr)", s.Node))
			if podCIDRs, err = waitPodCIDRs(ctx, store, s.Node, log); err != nil {
				return err
			}
		}
	}
	if len(podCIDRs) == 0 && store == nil {
		// In a Pod (or with $KUBECONFIG), the Node object tells.
		st.waiting(fmt.Sprintf("a Pod CIDR of Node %s (spec.podCIDRs; or give --pod-cidr)", s.Node))
		if podCIDRs, err = inClusterPodCIDRs(ctx, s.Node, s.Source == "synthetic", log); err != nil {
			return err
		}
	}
	if len(podCIDRs) == 0 {
		if s.Source != "synthetic" {
			return fmt.Errorf("--pod-cidr: none given, and the metadata source has no podCIDRs for Node %q", s.Node)
		}
		podCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}
		log.Info("no Pod CIDR given; the synthetic source uses a default", "pod_cidr", podCIDRs[0])
	}

	attr, err := s.openAttribution(bgCtx, wg, shared, log)
	if err != nil {
		return err
	}
	src, err := s.openSource(podCIDRs, clusterCIDRs, reg, log)
	if err != nil {
		return err
	}
	st.waiting("the first read of the connection table")
	o := s.tuning()
	o.Node, o.PodCIDRs, o.ClusterCIDRs, o.Source, o.Store, o.Attributor = s.Node, podCIDRs, clusterCIDRs, src, store, attr
	o.Collector, o.TLS, o.API, o.Registry, o.Log = coll, tlsConf, st.api, reg, log
	e, err := New(o)
	if err != nil {
		src.Close()
		return err
	}
	return e.Run(ctx)
}

// tuning is the Options the flags set directly; Run adds the sources,
// the collector and the rest.
func (s *Settings) tuning() Options {
	return Options{Profile: s.Profile, PollInterval: s.PollInterval, ActiveTimeout: s.ActiveTimeout,
		IdleTimeout: s.IdleTimeout, MaxConnections: s.MaxConnections, BufferSize: s.BufferSize,
		LateNaming: s.lateNaming(), MaxHeld: s.MaxHeld}
}

// lateNaming is --late-naming as Options.LateNaming takes it: 0 for its
// default when the flag was not given, negative for never.
func (s *Settings) lateNaming() time.Duration {
	switch {
	case !s.LateNamingSet:
		return 0
	case s.LateNaming == 0:
		return -1
	}
	return s.LateNaming
}

// metadataFlag names the flag of the metadata source, for errors.
func (s *Settings) metadataFlag() string {
	switch {
	case s.Inventory != "":
		return "--inventory"
	case s.InCluster:
		return "--in-cluster"
	}
	return "--kubeconfig"
}

// How often the policy attribution model is rebuilt at most: the
// inventory file is checked every attributionFileInterval; the live
// cluster's changes are loaded at most every attributionKubeInterval
// (changes meanwhile are loaded together).
const (
	attributionFileInterval = 2 * time.Second
	attributionKubeInterval = 500 * time.Millisecond
)

// openAttribution loads the policy model from the metadata source's
// objects and keeps it current in the background; nil when there is no
// metadata source or --attribution=false. Its watch joins shared, the
// Pod metadata's informers, when not nil. A state the model cannot use is
// a warning: the
// exporter runs without attribution until a reload succeeds.
func (s *Settings) openAttribution(ctx context.Context, wg *sync.WaitGroup, shared *kubeinformers.Shared, log *slog.Logger) (*attribution.Attributor, error) {
	if !s.Attribution {
		return nil, nil
	}
	if s.Inventory != "" {
		a := attribution.New(attribution.Options{Log: log})
		l := attribution.NewLoader(a, attribution.FileSource(s.Inventory), pipeline.DefaultConfig())
		if _, err := l.Load(ctx); err != nil {
			log.Warn("no policy attribution until the cluster state can be modelled", "err", err)
		}
		wg.Go(func() { l.Run(ctx, attributionFileInterval) })
		return a, nil
	}
	if s.Kubeconfig == "" && !s.InCluster {
		return nil, nil
	}
	flag := "--kubeconfig"
	if s.InCluster {
		flag = "--in-cluster"
	}
	cfg, err := kube.RESTConfig(s.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	client, dyn, err := kube.Clients(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	// The informers follow the cluster; each change reaches the model
	// (a new generation) within attributionKubeInterval of its event.
	w := kube.NewWatcher(client, dyn, kube.WatchOptions{Logger: log, Informers: shared})
	a := attribution.New(attribution.Options{Log: log})
	a.SetWatchStats(func() attribution.WatchStats {
		st := w.Stats()
		return attribution.WatchStats{Events: st.Events, Errors: st.WatchErrors, Objects: st.Objects}
	})
	l := attribution.NewLoader(a, attribution.WatchSource(w), pipeline.DefaultConfig())
	l.TrackChanges(w.Changes) // each poll catches the model up first (Exporter.poll)
	wg.Go(func() {
		if err := w.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("no policy attribution: cannot watch the cluster state", "err", err)
		}
	})
	wg.Go(func() { l.Follow(ctx, w.Changed(), attributionKubeInterval) })
	return a, nil
}

// openSource opens the connection source --source names. For conntrack
// it also makes sure conntrack counts bytes and packets (see
// checkAccounting).
func (s *Settings) openSource(podCIDRs, clusterCIDRs []netip.Prefix, reg prometheus.Registerer, log *slog.Logger) (source.Source, error) {
	if s.Source == "conntrack" {
		src, err := ctnetlink.Open(s.Netns)
		if err != nil {
			return nil, fmt.Errorf("--source conntrack: %w", err)
		}
		s.checkAccounting(reg, log)
		return src, nil
	}
	src, err := synthetic.New(synthetic.Options{Rate: s.Rate, PodCIDRs: podCIDRs, PeerCIDRs: clusterCIDRs,
		Seed: uint64(time.Now().UnixNano())})
	if err != nil {
		return nil, fmt.Errorf("--source synthetic: %w", err)
	}
	return src, nil
}

// checkAccounting turns conntrack's accounting on in the network namespace
// read when it is off: without it every counter of every record is 0. A
// container whose /proc/sys is read-only cannot: then it warns, once, what
// to set on the Node. The gauge follows the sysctl.
func (s *Settings) checkAccounting(reg prometheus.Registerer, log *slog.Logger) {
	was, _ := ctnetlink.Accounting(s.Netns)
	on, err := ctnetlink.EnableAccounting(s.Netns)
	switch {
	case err != nil:
		log.Warn("conntrack does not count bytes and packets, and the exporter cannot turn it on: "+
			"the byte and packet counters of every flow record will be 0. "+
			"Set the sysctl "+ctnetlink.AccountingSysctl+"=1 on the Node (in the network namespace the exporter reads), "+
			"or run the exporter where /proc/sys is writable", "netns", s.Netns, "err", err)
	case on && !was:
		log.Info("turned conntrack accounting on, for the byte and packet counters (connections older than this have none)",
			"sysctl", ctnetlink.AccountingSysctl+"=1", "netns", s.Netns)
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_exporter_conntrack_accounting",
		Help: "1 when conntrack counts bytes and packets (" + ctnetlink.AccountingSysctl + "=1 in the network namespace read); 0 when the counters are all 0."},
		func() float64 {
			if on, err := ctnetlink.Accounting(s.Netns); err == nil && on {
				return 1
			}
			return 0
		}))
}

// config is the client TLS configuration for the collector protocol: nil
// for tcp and udp, whose --tls-* flags are refused; the system roots and no
// client certificate for tls by default; and for grpc, which the aggregator
// serves with mutual TLS only, a client certificate, from the flags or from
// this machine's generated certificate directory (an aggregator and an
// exporter on one machine need no flags).
//
// With f.ReloadInterval, the configuration reads the files' current
// content at each handshake (see certs.Reloader, returned to be run), and
// checks the aggregator's certificate against serverName.
func (f TLSFiles) config(proto, serverName string, log *slog.Logger) (*tls.Config, *certs.Reloader, error) {
	anyFlag := f.CertFile != "" || f.KeyFile != "" || f.CAFile != "" || f.CertDir != ""
	if proto != "tls" && proto != "grpc" {
		if anyFlag { // --tls-server-name alone was always let through
			return nil, nil, fmt.Errorf("--tls-* flags given, but the collector protocol is %s, not tls or grpc", proto)
		}
		return nil, nil, nil
	}
	dir := f.CertDir
	if dir == "" && !anyFlag && proto == "grpc" {
		if d, err := certs.DefaultDir(); err == nil && fileExists(filepath.Join(d, certs.ClientCertFile)) {
			dir = d
			log.Info("using the generated client certificate of this machine", "dir", d)
		}
	}
	certFile, keyFile, caFile := f.CertFile, f.KeyFile, f.CAFile
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
		return nil, nil, errors.New("--tls-cert-file/--tls-key-file: the grpc protocol needs a client certificate signed by the aggregator's CA " +
			"(or --tls-cert-dir with the aggregator's generated client.crt, client.key and ca.crt)")
	}
	b, err := certs.LoadClient(certFile, keyFile, caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-cert-file/--tls-key-file/--tls-ca-file/--tls-cert-dir: %w", err)
	}
	if f.ReloadInterval <= 0 {
		return b.ClientTLS(f.ServerName), nil, nil
	}
	var files []string
	for _, p := range []string{certFile, keyFile, caFile} {
		if p != "" {
			files = append(files, p)
		}
	}
	r, err := certs.NewReloader(b, certs.ReloadOptions{
		Load:     func() (*certs.Bundle, error) { return certs.LoadClient(certFile, keyFile, caFile) },
		Files:    files,
		Interval: f.ReloadInterval,
		Notify: func(nb *certs.Bundle, err error) {
			if err != nil {
				log.Warn("TLS certificate files changed but do not load; keeping the ones in use", "files", files, "err", err)
				return
			}
			attrs := []any{"files", files}
			if nb.Client != nil && nb.Client.Leaf != nil {
				attrs = append(attrs, "serial", nb.Client.Leaf.SerialNumber.String(), "not_after", nb.Client.Leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			log.Info("TLS certificates reloaded; new connections use them", attrs...)
		},
	})
	if err != nil {
		return nil, nil, err
	}
	cfg, err := r.ClientTLS(serverName)
	if err != nil {
		return nil, nil, fmt.Errorf("--tls-server-name: %w", err)
	}
	return cfg, r, nil
}

// tlsServerName is the name the aggregator's certificate must hold:
// --tls-server-name, else the Service's DNS name when the collector is a
// Service (Antrea agents check flow-aggregator.flow-aggregator.svc), else
// the collector's host.
func tlsServerName(flag string, c collectoraddr.Collector) string {
	if flag != "" {
		return flag
	}
	if ns, name, ok := c.ServiceRef(); ok {
		return name + "." + ns + ".svc"
	}
	return c.Host
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
