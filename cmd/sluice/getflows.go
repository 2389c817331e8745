package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"sluice/certs"
	"sluice/config"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/sink/flowstream"
)

// defaultStreamServer is where FlowStreamService listens by default
// (sluice.flowStreamAddress, Antrea's port).
const defaultStreamServer = "localhost:14740"

func newGetFlowsCmd() *cobra.Command {
	var (
		server, caFile, serverName, out, direction, since string
		namespaces, pods, services, flowTypes, ips        []string
		selector                                          string
		follow                                            bool
		maxCount                                          uint32
	)
	cmd := &cobra.Command{
		Use:   "flows",
		Short: "Read the flows the aggregator hands to its sinks (FlowStreamService)",
		Long: `Reads the aggregator's flow stream (flowStreamService.enable): the flows the
aggregator still holds in its buffer, then, with --follow, new ones as they
come. Filters are ANDed; the values of one filter (repeated, or comma
separated) are ORed. --direction says which end of a flow the namespace,
Pod, label and IP filters look at.

The stream is TLS: the aggregator's certificate is checked against --ca-file,
by default the CA in the aggregator's generated certificate directory when
it exists on this machine, otherwise the system's roots.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out != "table" && out != "json" {
				return fmt.Errorf("-o %s: want table or json", out)
			}
			// --server (the HTTP API) is a flag of every "get" command, but
			// the flow stream is a separate gRPC service: say so rather
			// than silently ignoring the address given.
			if f := cmd.Flags().Lookup("server"); f != nil && f.Changed {
				return fmt.Errorf("--server is the HTTP API's address; get flows reads the flow stream service: use --stream-server (sluice.flowStreamAddress)")
			}
			filter := &flowpb.FlowFilter{Namespaces: namespaces, PodNames: pods, PodLabelSelector: selector, ServiceNames: services}
			switch direction {
			case "both":
			case "from":
				filter.Direction = flowpb.FilterDirection_FILTER_DIRECTION_FROM
			case "to":
				filter.Direction = flowpb.FilterDirection_FILTER_DIRECTION_TO
			default:
				return fmt.Errorf("--direction %s: want both, from or to", direction)
			}
			for _, t := range flowTypes {
				ft, err := parseFlowType(t)
				if err != nil {
					return err
				}
				filter.FlowTypes = append(filter.FlowTypes, ft)
			}
			for _, ip := range ips {
				if _, err := netip.ParsePrefix(ip); err != nil {
					if _, err := netip.ParseAddr(ip); err != nil {
						return fmt.Errorf("--ip %s: neither an address nor a CIDR prefix", ip)
					}
				}
				filter.IpAddresses = append(filter.IpAddresses, ip)
			}
			req := &flowpb.GetFlowsRequest{Filter: filter, Follow: follow, MaxCount: maxCount}
			if since != "" {
				t, err := parseSince(since, time.Now())
				if err != nil {
					return err
				}
				req.Since = timestamppb.New(t)
			}
			tlsConf, err := streamTLS(caFile, serverName)
			if err != nil {
				return err
			}
			// Ctrl-C ends a --follow stream cleanly (the table is flushed).
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return getFlows(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), server, tlsConf, req, out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&server, "stream-server", defaultStreamServer, "the aggregator's flow stream service (sluice.flowStreamAddress)")
	f.StringVar(&caFile, "ca-file", "", "PEM CA that signed the aggregator's certificate (default: the generated CA, if found)")
	f.StringVar(&serverName, "server-name", "", "name to expect in the aggregator's certificate (default: the host of --stream-server)")
	f.StringVarP(&out, "output", "o", "table", "output format: table, or json (one object per line)")
	f.StringSliceVarP(&namespaces, "namespace", "n", nil, "Pod namespace")
	f.StringSliceVar(&pods, "pod", nil, "Pod name, or namespace/name")
	f.StringVarP(&selector, "selector", "l", "", "Pod label selector (app=web,tier!=db)")
	f.StringSliceVar(&services, "service", nil, "destination Service, namespace/name")
	f.StringSliceVar(&flowTypes, "flow-type", nil, "intra-node, inter-node, to-external or from-external")
	f.StringSliceVar(&ips, "ip", nil, "IP address or CIDR prefix")
	f.StringVar(&direction, "direction", "both", "which end the namespace, Pod, label and IP filters match: both, from or to")
	f.StringVar(&since, "since", "", "only flows that ended after this: a duration ago (5m) or an RFC 3339 time")
	f.BoolVarP(&follow, "follow", "f", false, "keep streaming new flows")
	f.Uint32Var(&maxCount, "max-count", 0, "stop after this many flows (0: no limit)")
	return cmd
}

func parseFlowType(s string) (flowpb.FlowType, error) {
	switch strings.ToLower(s) {
	case "intra-node", "intranode", "1":
		return flowpb.FlowType_FLOW_TYPE_INTRA_NODE, nil
	case "inter-node", "internode", "2":
		return flowpb.FlowType_FLOW_TYPE_INTER_NODE, nil
	case "to-external", "toexternal", "3":
		return flowpb.FlowType_FLOW_TYPE_TO_EXTERNAL, nil
	case "from-external", "fromexternal", "4":
		return flowpb.FlowType_FLOW_TYPE_FROM_EXTERNAL, nil
	}
	return 0, fmt.Errorf("--flow-type %s: want intra-node, inter-node, to-external or from-external", s)
}

func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--since %s: a duration must not be negative", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--since %s: want a duration (5m) or an RFC 3339 time", s)
	}
	return t, nil
}

// streamTLS verifies the aggregator against caFile, or the generated CA
// when it is on this machine, or the system roots.
func streamTLS(caFile, serverName string) (*tls.Config, error) {
	if caFile == "" {
		if dir, err := (config.ServerTLS{}).CertDirectory(); err == nil {
			if p := filepath.Join(dir, certs.CACertFile); fileExists(p) {
				caFile = p
			}
		}
	}
	b, err := certs.LoadClient("", "", caFile)
	if err != nil {
		return nil, err
	}
	return b.ClientTLS(serverName), nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func getFlows(ctx context.Context, w, errw io.Writer, server string, tlsConf *tls.Config, req *flowpb.GetFlowsRequest, out string) error {
	var tw *tabwriter.Writer
	if out == "table" {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "END\tSRC\tDST\tPROTO\tSERVICE\tTYPE\tPACKETS\tBYTES\tREV-PACKETS\tREV-BYTES")
	}
	var dropped uint64
	err := flowstream.Get(ctx, server, tlsConf, req, func(r *flowpb.GetFlowsResponse) error {
		if r.GetDroppedCount() > dropped {
			fmt.Fprintf(errw, "the stream lost %d flows (reading too slowly)\n", r.GetDroppedCount()-dropped)
			dropped = r.GetDroppedCount()
		}
		for _, f := range r.GetFlows() {
			if tw == nil {
				b, err := protojson.Marshal(f)
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintf(w, "%s\n", b); err != nil {
					return err
				}
				continue
			}
			flowRow(tw, f)
		}
		if tw != nil {
			return tw.Flush()
		}
		return nil
	})
	if tw != nil {
		tw.Flush()
	}
	// gRPC reports a cancelled stream as a status, not as ctx's error.
	if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
		return nil
	}
	return err
}

func flowRow(w io.Writer, f *flowpb.Flow) {
	k := f.GetK8S()
	end := "-"
	if ts := f.GetEndTs(); ts != nil {
		end = ts.AsTime().UTC().Format(time.RFC3339)
	}
	side := func(ns, pod string, ip []byte, port uint32) string {
		a, _ := netip.AddrFromSlice(ip)
		ap := "-"
		if a.IsValid() {
			ap = netip.AddrPortFrom(a, uint16(port)).String()
		}
		if pod != "" {
			return ns + "/" + pod + " (" + ap + ")"
		}
		return ap
	}
	t := f.GetTransport()
	fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", end,
		side(k.GetSourcePodNamespace(), k.GetSourcePodName(), f.GetIp().GetSource(), t.GetSourcePort()),
		side(k.GetDestinationPodNamespace(), k.GetDestinationPodName(), f.GetIp().GetDestination(), t.GetDestinationPort()),
		protoName(t.GetProtocolNumber()), orDash(k.GetDestinationServicePortName()), flowTypeName(k.GetFlowType()),
		f.GetStats().GetPacketTotalCount(), f.GetStats().GetOctetTotalCount(),
		f.GetReverseStats().GetPacketTotalCount(), f.GetReverseStats().GetOctetTotalCount())
}

func protoName(n uint32) string {
	if n > 255 {
		return strconv.FormatUint(uint64(n), 10)
	}
	return flow.ProtocolName(uint8(n))
}

func flowTypeName(t flowpb.FlowType) string {
	if t < 0 || t > 255 {
		return "-"
	}
	return orDash(flow.FlowTypeName(uint8(t)))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
