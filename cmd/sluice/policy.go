package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"sluice/policy/flowsrc"
	"sluice/policy/observed"
	"sluice/policy/recommend"
	"sluice/policy/verify"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// policyFlags are the options both policy subcommands share.
type policyFlags struct {
	traceflowFlags
	flows string
	since time.Duration
}

func (f *policyFlags) register(cmd *cobra.Command) {
	f.traceflowFlags.register(cmd)
	fl := cmd.PersistentFlags()
	fl.StringVar(&f.flows, "flows", "", "observed flows: a flow log file (flowLogger format, plain or .gz), a running aggregator's API (http://HOST:10348 or HOST:PORT), or ClickHouse's flows table (tcp://HOST:9000/DB; CH_USERNAME, CH_PASSWORD)")
	fl.DurationVar(&f.since, "since", 0, "only records that ended within this long before now (0: every record)")
}

// load reads the cluster's objects, builds its model and reads the
// observed connections.
func (f *policyFlags) load(ctx context.Context, stderr io.Writer) ([]cluster.Object, *pipeline.Model, *observed.Set, error) {
	if f.since < 0 {
		return nil, nil, nil, fmt.Errorf("--since %s: must not be negative", f.since)
	}
	src, err := flowsrc.Open(f.flows)
	if err != nil {
		return nil, nil, nil, err
	}
	objs, err := f.objects(ctx, stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := f.model(ctx, stderr, objs, crd.FirstTraceflowTag, "")
	if err != nil {
		return nil, nil, nil, err
	}
	set := observed.NewSet(0)
	var since time.Time
	if f.since > 0 {
		since = time.Now().Add(-f.since)
	}
	if err := src.Read(ctx, since, func(r *flowsrc.Record) error { set.Add(r); return nil }); err != nil {
		return nil, nil, nil, err
	}
	if a, ok := src.(*flowsrc.API); ok && a.Truncated {
		fmt.Fprintf(stderr, "warning: the aggregator holds more flows than one answer carries; only the first were read\n")
	}
	if set.Dropped > 0 {
		fmt.Fprintf(stderr, "warning: %d records of connections beyond the first %d distinct ones were left out\n", set.Dropped, observed.DefaultMaxConns)
	}
	return objs, m, set, nil
}

func newPolicyCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Recommend NetworkPolicies from observed flows, and verify policies against them",
	}
	cmd.AddCommand(newPolicyRecommendCmd(), newPolicyVerifyCmd())
	return cmd
}

func newPolicyRecommendCmd() *cobra.Command {
	var (
		f      policyFlags
		o      recommend.Options
		format string
		outDir string
	)
	cmd := &cobra.Command{
		Use:   "recommend --flows SOURCE (--cluster DIR | --kubeconfig PATH) [--since DURATION] [--isolation ingress|egress|both] [--format k8s|antrea] [-o DIR]",
		Short: "Recommend NetworkPolicies that allow exactly the observed traffic",
		Long: `Reads observed flows and the cluster's objects and writes Kubernetes
NetworkPolicies that allow exactly the observed traffic: one per workload
(Pods grouped by their Deployment, StatefulSet, DaemonSet or Job; Pods
without an owner by their labels), selected by labels that select exactly
that workload; peers by namespace and workload labels; outside addresses
aggregated into CIDRs (--cidr-prefix); ports as observed, by name where the
Pods name them; Service traffic on the endpoints' ports, as the datapath
sees it after DNAT. A default deny per namespace (or per workload) isolates
the rest, for --isolation.

Connections that records or the cluster's current policies deny are not
made allowed, unless --include-denied. Each object carries a comment
naming, for each rule, the observed connections that justify it.

--format antrea writes Antrea-native policies instead: an Antrea
NetworkPolicy per workload in the application tier (Allow rules, and with
--default-deny workload a last Drop rule), and a namespace's default deny
as a ClusterNetworkPolicy in the baseline tier.

Without -o the objects are one YAML stream on stdout; with -o DIR one file
per object. Check them with sluice policy verify before applying them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			switch format {
			case recommend.FormatK8s, recommend.FormatAntrea:
				o.Format = format
			default:
				return fmt.Errorf("--format %q: want k8s or antrea", format)
			}
			// recommend.Options reads a 0 prefix as "the default"; given
			// on the command line it would silently become /24 (or /64).
			for _, p := range []struct {
				flag string
				v    int
			}{{"cidr-prefix", o.PrefixV4}, {"cidr-prefix-v6", o.PrefixV6}} {
				if p.v == 0 && cmd.Flags().Changed(p.flag) {
					return fmt.Errorf("--%s 0: want a prefix length of 1 or more (an ipBlock of every address allows all outside traffic)", p.flag)
				}
			}
			objs, m, set, err := f.load(ctx, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			res, err := recommend.Recommend(ctx, m, objs, set.Conns(), o)
			if err != nil {
				return err
			}
			s := res.Skipped
			fmt.Fprintf(cmd.ErrOrStderr(), "%d records, %d distinct connections: %d carried by %d policies; left out: %d denied, %d not modelled, %d outside the chosen namespaces, %d not replayable",
				set.Records, set.Len(), res.Carried, len(res.Objects), s.Denied, s.NotModelled, s.OutOfScope, s.Errors)
			if s.ServiceAddress > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), ", %d to a Service address before DNAT (endpoint unknown)", s.ServiceAddress)
			}
			fmt.Fprintln(cmd.ErrOrStderr())
			if err := checkDenied(ctx, &f, objs, res, cmd.ErrOrStderr()); err != nil {
				return err
			}
			if outDir != "" {
				return res.WriteDir(outDir)
			}
			return res.WriteYAML(cmd.OutOrStdout())
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&o.Isolation, "isolation", recommend.IsolationBoth, "which traffic the policies isolate: ingress, egress or both")
	fl.StringVar(&format, "format", recommend.FormatK8s, "policy format: k8s (Kubernetes NetworkPolicy) or antrea (Antrea NetworkPolicy in the application tier; a namespace's default deny as a ClusterNetworkPolicy in the baseline tier)")
	fl.StringVarP(&outDir, "output-dir", "o", "", "write one file per object into DIR instead of one YAML stream on stdout")
	fl.StringVar(&o.DefaultDeny, "default-deny", recommend.DenyNamespace, "where the default deny goes: namespace (one deny-all policy per namespace) or workload (each workload's own policy)")
	fl.IntVar(&o.PrefixV4, "cidr-prefix", recommend.DefaultPrefixV4, "aggregate outside IPv4 addresses into CIDRs of this prefix length")
	fl.IntVar(&o.PrefixV6, "cidr-prefix-v6", recommend.DefaultPrefixV6, "aggregate outside IPv6 addresses into CIDRs of this prefix length")
	fl.StringSliceVarP(&o.Namespaces, "namespace", "n", nil, "recommend policies for these namespaces only (default: every namespace with an observed Pod)")
	fl.BoolVar(&o.IncludeDenied, "include-denied", false, "also allow connections that records or the current policies deny")
	return cmd
}

func newPolicyVerifyCmd() *cobra.Command {
	var (
		f      policyFlags
		files  []string
		output string
		max    int
	)
	cmd := &cobra.Command{
		Use:   "verify --flows SOURCE (--cluster DIR | --kubeconfig PATH) -f FILE|DIR ... [-o table|json|yaml]",
		Short: "Replay observed flows with and without candidate policies and report what changes",
		Long: `Replays each distinct observed connection (its first packet; connections
are deduplicated by the fields that decide a verdict: addresses after
DNAT, protocol and destination port) through the datapath model twice:
with the cluster as it is, and with the candidate objects of -f overlaid,
as sluice traceflow --with does. Reports the observed allowed connections
the candidates would block (with the rule that blocks each), the denied
ones they would allow, how many keep their verdict, and the allowed
surface the candidates open beyond the observed traffic.

Exit status: 0 when no observed allowed connection would be blocked, 1
when one would, 2 on bad input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			switch output {
			case "table", "json", "yaml":
			default:
				return fmt.Errorf("-o %q: want table, json or yaml", output)
			}
			if len(files) == 0 {
				return errors.New("-f FILE|DIR is required: the candidate policies")
			}
			var cands []cluster.Object
			for _, p := range files {
				objs, err := cluster.ReadPath(ctx, p)
				if err != nil {
					return fmt.Errorf("-f: %w", err)
				}
				cands = cluster.Overlay(cands, objs)
			}
			objs, before, set, err := f.load(ctx, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			after, err := f.model(ctx, cmd.ErrOrStderr(), cluster.Overlay(objs, cands), crd.FirstTraceflowTag, "with the candidates: ")
			if err != nil {
				return fmt.Errorf("with the candidates: %w", err)
			}
			rep, err := verify.Verify(ctx, before, after, cands, set.Conns(), verify.Options{MaxSurface: max})
			if err != nil {
				return err
			}
			if err := rep.Write(cmd.OutOrStdout(), output); err != nil {
				return err
			}
			if rep.Blocks() {
				return exitError{1}
			}
			return nil
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.StringArrayVarP(&files, "filename", "f", nil, "candidate policies: a YAML/JSON file or a directory of them; repeatable")
	fl.StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	fl.IntVar(&max, "max-surface", verify.DefaultMaxSurface, "list at most this many entries of the unobserved allowed surface")
	return cmd
}

// maxWidenedListed bounds the connections checkDenied lists.
const maxWidenedListed = 10

// checkDenied replays the connections the recommendation left out as
// denied through the model with the recommendation overlaid, and warns of
// any it would allow: NetworkPolicies add up, and one cannot always tell a
// denied Pod or address from an allowed one of the same workload or rule.
func checkDenied(ctx context.Context, f *policyFlags, objs []cluster.Object, res *recommend.Result, stderr io.Writer) error {
	if len(res.Denied) == 0 {
		return nil
	}
	var b bytes.Buffer
	if err := res.WriteYAML(&b); err != nil {
		return err
	}
	cands, err := cluster.ParseObjects(b.Bytes(), "recommended policies")
	if err != nil {
		return fmt.Errorf("reading back the recommended policies: %w", err)
	}
	after, err := f.model(ctx, io.Discard, cluster.Overlay(objs, cands), crd.FirstTraceflowTag, "")
	if err != nil {
		return fmt.Errorf("the model with the recommended policies: %w", err)
	}
	var widened []*observed.Conn
	for _, c := range res.Denied {
		v, err := tracer.Decide(ctx, after, tracer.Connection{Src: c.Src, Dst: c.Dst, Proto: c.Proto, SrcPort: c.SrcPort, DstPort: c.DstPort})
		if err == nil && !v.Denied {
			widened = append(widened, c)
		}
	}
	if len(widened) == 0 {
		return nil
	}
	fmt.Fprintf(stderr, "warning: the policies would allow %d of the %d connections denied now (a rule cannot tell them from allowed ones of the same workload, address or port); narrow the rules before applying them:\n", len(widened), len(res.Denied))
	for i, c := range widened {
		if i == maxWidenedListed {
			fmt.Fprintf(stderr, "  ... and %d more (sluice policy verify lists them all under newly allowed)\n", len(widened)-maxWidenedListed)
			break
		}
		fmt.Fprintf(stderr, "  %s\n", recommend.ConnText(c))
	}
	return nil
}
