package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/ovs"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/render"
	"sluice/traceflow/tracer"
)

// traceflowFlags are the options shared by `traceflow` and its subcommands.
type traceflowFlags struct {
	clusterPath    string
	kubeconfig     string
	requestTimeout time.Duration
	trafficMode    string
	tunnelType     string
	serviceCIDRs   []string
	exceptCIDRs    []string
	proxyAll       bool
	encryption     string
	multicast      bool
	bridging       bool
}

func (f *traceflowFlags) register(cmd *cobra.Command) {
	fl := cmd.PersistentFlags()
	fl.StringVar(&f.clusterPath, "cluster", "", "cluster state: a YAML/JSON file, or a directory whose *.yaml, *.yml and *.json files are all read")
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "read the cluster state, read only, from the cluster of this kubeconfig's current context (in a Pod, with neither flag, the Pod's service account is used)")
	fl.DurationVar(&f.requestTimeout, "request-timeout", time.Minute, "with --kubeconfig: the longest the whole read of the cluster state may take (0: no bound)")
	fl.StringVar(&f.trafficMode, "traffic-mode", "encap", "Antrea traffic mode: encap, noEncap, hybrid or networkPolicyOnly")
	fl.StringVar(&f.tunnelType, "tunnel-type", "geneve", "tunnel type in encap and hybrid modes: geneve or vxlan")
	fl.StringSliceVar(&f.serviceCIDRs, "service-cidr", []string{crd.ServiceCIDRDefault}, "Service CIDRs (Egress never SNATs traffic to them)")
	fl.StringSliceVar(&f.exceptCIDRs, "egress-except-cidr", nil, "the agents' egress.exceptCIDRs")
	fl.StringVar(&f.encryption, "traffic-encryption-mode", "none", "the agents' trafficEncryptionMode: none, or wireGuard (encap mode only: Pod traffic to other Nodes is routed through the gateway)")
	fl.BoolVar(&f.multicast, "multicast", false, "the agents' multicast.enable: the reference then cannot trace IPv4 multicast destinations (refused); without it they are routed as any outside address")
	fl.BoolVar(&f.bridging, "enable-bridging-mode", false, "the agents' enableBridgingMode (FlexibleIPAM, noEncap mode only): Pods with an IP from an IPPool are bridged to the Node's uplink")
	fl.BoolVar(&f.proxyAll, "proxy-all", false, "the agents' antreaProxy.proxyAll: NodePorts of each Node's own addresses are load-balanced in OVS")
}

// settingFlags names each model setting's flag, for errors.
var settingFlags = map[string]string{
	"TrafficMode": "--traffic-mode", "TunnelType": "--tunnel-type",
	"ServiceCIDRs": "--service-cidr", "EgressExceptCIDRs": "--egress-except-cidr",
	"TrafficEncryptionMode": "--traffic-encryption-mode", "EnableBridgingMode": "--enable-bridging-mode",
}

// config turns the flags into a pipeline configuration.
func (f *traceflowFlags) config(tag uint8) (pipeline.Config, error) {
	s := modelrun.Settings{TrafficMode: f.trafficMode, TunnelType: f.tunnelType,
		ServiceCIDRs: f.serviceCIDRs, EgressExceptCIDRs: f.exceptCIDRs, ProxyAll: f.proxyAll,
		TrafficEncryptionMode: f.encryption, Multicast: f.multicast, EnableBridgingMode: f.bridging}
	cfg, err := s.Config(tag)
	var se *modelrun.SettingError
	if errors.As(err, &se) {
		return cfg, fmt.Errorf("%s: %w", settingFlags[se.Field], se.Err)
	}
	return cfg, err
}

// objects reads the cluster state's objects: from files, or from the live
// cluster of --kubeconfig, or, in a Pod given neither, of the Pod's service
// account. Warnings about the live cluster go to stderr.
func (f *traceflowFlags) objects(ctx context.Context, stderr io.Writer) ([]cluster.Object, error) {
	switch {
	case f.clusterPath != "" && f.kubeconfig != "":
		return nil, errors.New("--cluster and --kubeconfig are mutually exclusive: read the state from files or from a live cluster, not both")
	case f.clusterPath != "":
		return cluster.ReadPath(ctx, f.clusterPath)
	case f.kubeconfig == "" && !kube.InCluster():
		return nil, errors.New("no cluster state: give --cluster PATH or --kubeconfig FILE")
	}
	if f.requestTimeout < 0 {
		return nil, fmt.Errorf("--request-timeout %s: must not be negative", f.requestTimeout)
	}
	cfg, err := kube.RESTConfig(f.kubeconfig)
	if err != nil {
		return nil, err
	}
	client, dyn, err := kube.Clients(cfg)
	if err != nil {
		return nil, err
	}
	if f.requestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.requestTimeout)
		defer cancel()
	}
	objs, probs, err := kube.Load(ctx, client, dyn, kube.Options{})
	if err != nil {
		return nil, fmt.Errorf("reading the cluster state from %s: %w", cfg.Host, err)
	}
	for _, p := range probs {
		fmt.Fprintln(stderr, p)
	}
	return objs, nil
}

// model validates objects and builds the datapath, printing warnings.
func (f *traceflowFlags) model(ctx context.Context, stderr io.Writer, objs []cluster.Object, tag uint8, label string) (*pipeline.Model, error) {
	cfg, err := f.config(tag)
	if err != nil {
		return nil, err
	}
	m, probs, err := modelrun.Model(ctx, objs, cfg)
	if err != nil {
		return nil, err
	}
	for _, p := range probs {
		fmt.Fprintf(stderr, "%s%s\n", label, p)
	}
	return m, nil
}

func newTraceflowCmd() *cobra.Command {
	var (
		f traceflowFlags
		o traceOptions
	)
	cmd := &cobra.Command{
		Use:     "traceflow -S NS/POD -D DEST [-f FLOW] (--cluster PATH | --kubeconfig FILE)",
		Aliases: []string{"tf", "traceflows"},
		Short:   "Trace a packet through a model of the cluster's Antrea datapath",
		Long: `Builds, from the cluster state, each Node's modelled OVS pipeline (the tables
Antrea installs, as prioritised match/action flows), injects a packet at the
source Pod's port, runs it Node by Node through the tunnel or the host
routes, and prints what Antrea's Traceflow would report.

The cluster state comes from files (--cluster) or, read only, from a live
cluster (--kubeconfig; in a Pod, with neither flag, the Pod's service
account): Nodes, Namespaces, Pods, Services, EndpointSlices,
NetworkPolicies and Antrea's Egresses, NetworkPolicies and
ClusterNetworkPolicies. A missing Antrea CRD is a warning.

-S is ns/pod or pod (namespace default). -D is ns/name, name or an IP; a
name is a Pod if one exists, otherwise a Service. -f describes the packet:
icmp|tcp|udp, ipv6, tcp_src=, tcp_dst=, tcp_flags=, udp_src=, udp_dst=,
icmp_id=, icmp_seq=.

--with FILE overlays proposed objects (a new Egress, a changed policy) on
the state before tracing; --diff traces both and prints what changed.
--traceflow FILE reads a Traceflow object instead of -S/-D/-f and prints it
back with its status.

The exit status is 0 when the trace ran, whatever its phase, and 2 with a
message when the input cannot be used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runTrace(cmd, &f, &o)
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVarP(&o.src, "source", "S", "", "source Pod: ns/pod or pod")
	fl.StringVarP(&o.dst, "destination", "D", "", "destination: ns/pod, ns/service, pod, service or an IP")
	fl.StringVarP(&o.flow, "flow", "f", "", `packet, e.g. "tcp,tcp_dst=80" (default ICMP echo request)`)
	fl.StringVarP(&o.output, "output", "o", "yaml", "output format: yaml, json or dot")
	fl.StringArrayVar(&o.withFiles, "with", nil, "overlay proposed objects from FILE (or directory) on the cluster state; repeatable")
	fl.BoolVar(&o.diff, "diff", false, "with --with: trace before and after the change and print both and what changed")
	fl.StringVar(&o.objectFile, "traceflow", "", "read a Traceflow object (YAML or JSON; - for stdin) and print it back with its status")
	fl.BoolVar(&o.showFlows, "show-flows", false, "print, on stderr, every flow the packet hit on each Node")
	cmd.AddCommand(newTraceflowPipelineCmd(&f))
	return cmd
}

// traceOptions are the flags of a trace.
type traceOptions struct {
	src, dst, flow, output string
	withFiles              []string
	diff                   bool
	objectFile             string
	showFlows              bool
}

// traceflow checks the flags and returns the Traceflow of --traceflow, or
// nil when -S, -D and -f describe it.
func (o *traceOptions) traceflow() (*crd.Traceflow, error) {
	switch o.output {
	case "yaml", "json", "dot":
	default:
		return nil, fmt.Errorf("-o %q: want yaml, json or dot", o.output)
	}
	if o.diff && len(o.withFiles) == 0 {
		return nil, errors.New("--diff needs --with FILE (the proposed change)")
	}
	if o.objectFile != "" {
		if o.src != "" || o.dst != "" || o.flow != "" {
			return nil, errors.New("--traceflow replaces -S, -D and -f; give one or the other")
		}
		return readTraceflow(o.objectFile)
	}
	if o.src == "" || o.dst == "" {
		return nil, errors.New("please provide source (-S) and destination (-D)")
	}
	return nil, nil
}

// runTrace reads the state, overlays --with, traces (twice with --diff)
// and prints the result.
func runTrace(cmd *cobra.Command, f *traceflowFlags, o *traceOptions) error {
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	tf, err := o.traceflow()
	if err != nil {
		return err
	}
	objs, err := f.objects(ctx, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	var proposed []cluster.Object
	for _, w := range o.withFiles {
		top, err := cluster.ReadPath(ctx, w)
		if err != nil {
			return fmt.Errorf("--with: %w", err)
		}
		proposed = cluster.Overlay(proposed, top)
	}
	after := cluster.Overlay(objs, proposed)
	run := func(objs []cluster.Object, label string, tf *crd.Traceflow) (*tracer.Trace, error) {
		m, err := f.model(ctx, cmd.ErrOrStderr(), objs, crd.FirstTraceflowTag, label)
		if err != nil {
			return nil, err
		}
		if tf == nil {
			if tf, err = newTraceflow(m.State, o.src, o.dst, o.flow); err != nil {
				return nil, err
			}
		}
		return tracer.Run(ctx, m, tf, tracer.Options{})
	}
	out := cmd.OutOrStdout()
	if o.diff {
		before, err := run(objs, "before: ", tf)
		if err != nil {
			return err
		}
		// The same name and packet on both sides, so only the state differs.
		next, err := run(after, "after: ", before.Traceflow.Clone())
		if err != nil {
			return err
		}
		return render.Diff(out, before.Traceflow, next.Traceflow)
	}
	tr, err := run(after, "", tf)
	if err != nil {
		return err
	}
	if o.showFlows {
		printHops(cmd.ErrOrStderr(), tr.Hops)
	}
	return printTrace(out, tr.Traceflow, o.output, o.objectFile != "")
}

// newTraceflow builds the Traceflow that antctl would create (the web
// UI's Traceflow page makes its object the same way).
func newTraceflow(st *cluster.State, src, dst, flow string) (*crd.Traceflow, error) {
	tf, err := modelrun.NewTraceflow(st, src, dst, flow)
	var fe *modelrun.FlowError
	if errors.As(err, &fe) {
		return nil, fmt.Errorf("-f: %w", fe.Err)
	}
	return tf, err
}

func readTraceflow(path string) (*crd.Traceflow, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(io.LimitReader(os.Stdin, 1<<20))
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("--traceflow: %w", err)
	}
	objs, err := cluster.ParseObjects(data, path)
	if err != nil {
		return nil, fmt.Errorf("--traceflow: %w", err)
	}
	if len(objs) != 1 || objs[0].Kind != crd.KindTraceflow {
		return nil, fmt.Errorf("--traceflow: %s must hold exactly one Traceflow object", path)
	}
	return crd.DecodeTraceflow(objs[0].Raw)
}

func printTrace(w io.Writer, tf *crd.Traceflow, format string, object bool) error {
	switch {
	case format == "dot":
		return render.DOT(w, tf)
	case object && format == "json":
		return render.JSON(w, tf)
	case object:
		return render.ObjectYAML(w, tf)
	case format == "json":
		return render.JSON(w, render.Summarize(tf))
	default:
		return render.YAML(w, render.Summarize(tf))
	}
}

func printHops(w io.Writer, hops []tracer.Hop) {
	for _, h := range hops {
		fmt.Fprintf(w, "# node %s\n", h.Node)
		for i, s := range h.Trail {
			switch {
			case s.Flow == "" && i == len(h.Trail)-1:
				fmt.Fprintf(w, "table=%s: no flow matched (drop)\n", s.Table)
			case s.Flow == "":
				// A resubmit's miss returns to the caller.
				fmt.Fprintf(w, "table=%s: no flow matched\n", s.Table)
			default:
				fmt.Fprintln(w, s.Flow)
			}
		}
		if h.Result != nil {
			for _, f := range h.Result.Learned {
				fmt.Fprintf(w, "# learned: %s\n", f)
			}
		}
		if h.Note != "" {
			fmt.Fprintf(w, "# %s\n", h.Note)
		}
	}
}

func newTraceflowPipelineCmd(f *traceflowFlags) *cobra.Command {
	var node string
	var tag uint8
	var script bool
	cmd := &cobra.Command{
		Use:   "pipeline --node NAME [--ovs-script] (--cluster PATH | --kubeconfig FILE)",
		Short: "Print a Node's modelled flows in ovs-ofctl dump-flows syntax, or a script that loads them",
		Long: `Prints every flow of the Node's modelled bridge, table by table in pipeline
order, then its groups, as ovs-ofctl dump-flows and dump-groups would show
them (without counters). --tag adds the flows a running Traceflow with that
dataplane tag installs.

--ovs-script prints instead a shell script of ovs-vsctl and ovs-ofctl
commands that builds the bridge on a running Open vSwitch: the bridge
(userspace datapath by default), its ports with the modelled OpenFlow port
numbers, the groups and every flow, tables numbered in pipeline order. The
environment renames what it creates: BR (default br-int), PORT_PREFIX
(default antrea-) and DATAPATH_TYPE (default netdev).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if node == "" {
				return errors.New("--node NAME is required")
			}
			objs, err := f.objects(ctx, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			m, err := f.model(ctx, cmd.ErrOrStderr(), objs, tag, "")
			if err != nil {
				return err
			}
			nm := m.Nodes[node]
			if nm == nil {
				var names []string
				for _, n := range m.State.Nodes {
					names = append(names, n.Name)
				}
				return fmt.Errorf("node %q is not in the cluster state (Nodes: %s)", node, strings.Join(names, ", "))
			}
			if script {
				return ovs.Script(cmd.OutOrStdout(), nm, m.Config)
			}
			return printPipeline(cmd.OutOrStdout(), nm.Bridge)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the Node whose bridge to print")
	cmd.Flags().BoolVar(&script, "ovs-script", false, "print a shell script that builds the bridge on a running Open vSwitch")
	cmd.Flags().Uint8Var(&tag, "tag", 0, "also print the flows of a Traceflow with this dataplane tag (1-63)")
	return cmd
}

func printPipeline(w io.Writer, br *datapath.Bridge) error {
	for _, fl := range br.Flows() {
		if _, err := fmt.Fprintln(w, fl.String()); err != nil {
			return err
		}
	}
	for _, g := range br.Groups() {
		if _, err := fmt.Fprintln(w, g.String()); err != nil {
			return err
		}
	}
	return nil
}
