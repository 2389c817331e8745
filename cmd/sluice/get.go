package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"sluice/api"
	"sluice/sink/flowlog"
)

func newGetCmd() *cobra.Command {
	var server string
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Read state from a running aggregator's API",
	}
	cmd.PersistentFlags().StringVar(&server, "server", api.DefaultServer, "the aggregator's API (sluice.apiAddress)")
	client := func() *api.Client { return &api.Client{Server: server} }
	cmd.AddCommand(newGetFlowRecordsCmd(client), newGetRecordMetricsCmd(client), newGetFlowsCmd())
	return cmd
}

type outputFlag string

func (o outputFlag) check() error {
	switch o {
	case "table", "json", "yaml":
		return nil
	}
	return fmt.Errorf("-o %s: want table, json or yaml", string(o))
}

func newGetFlowRecordsCmd(client func() *api.Client) *cobra.Command {
	var out string
	var srcIP, dstIP, proto string
	var srcPort, dstPort uint16
	var limit int
	cmd := &cobra.Command{
		Use:   "flowrecords",
		Short: "List the flows Aggregate mode is tracking",
		Long: `Lists the flows the aggregator holds (Aggregate mode), with what their next
export would carry. Filters are ANDed; with all five of --srcip, --dstip,
--proto, --srcport and --dstport set, the flow is looked up by its key.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := outputFlag(out).check(); err != nil {
				return err
			}
			q := url.Values{}
			set := func(k, v string) {
				if v != "" && v != "0" {
					q.Set(k, v)
				}
			}
			set("srcip", srcIP)
			set("dstip", dstIP)
			set("proto", proto)
			set("srcport", strconv.Itoa(int(srcPort)))
			set("dstport", strconv.Itoa(int(dstPort)))
			if cmd.Flags().Changed("limit") {
				q.Set("limit", strconv.Itoa(limit))
			}
			fr, err := client().FlowRecords(cmd.Context(), q)
			if err != nil {
				return err
			}
			if fr.Matches > len(fr.Records) {
				fmt.Fprintf(cmd.ErrOrStderr(), "showing %d of %d matching flows; narrow the filters or raise --limit\n",
					len(fr.Records), fr.Matches)
			}
			return printFlowRecords(cmd.OutOrStdout(), out, fr.Records)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "output", "o", "table", "output format: table, json or yaml")
	f.StringVar(&srcIP, "srcip", "", "source IP address")
	f.StringVar(&dstIP, "dstip", "", "destination IP address")
	f.StringVar(&proto, "proto", "", "protocol: a number, or tcp, udp, icmp, icmpv6, sctp")
	f.Uint16Var(&srcPort, "srcport", 0, "source port")
	f.Uint16Var(&dstPort, "dstport", 0, "destination port")
	f.IntVar(&limit, "limit", api.DefaultFlowRecordsLimit, "the most records to fetch")
	return cmd
}

func newGetRecordMetricsCmd(client func() *api.Client) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "recordmetrics",
		Short: "Show the aggregator's record counts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := outputFlag(out).check(); err != nil {
				return err
			}
			m, err := client().RecordMetrics(cmd.Context())
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			switch out {
			case "json", "yaml":
				return printStructured(w, out, m)
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RECORDS-EXPORTED\tRECORDS-RECEIVED\tRECORDS-DROPPED\tFLOWS\tEXPORTERS-CONNECTED\tCLICKHOUSE-EXPORTER\tS3-EXPORTER\tLOG-EXPORTER\tIPFIX-EXPORTER")
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%t\t%t\t%t\t%t\n", m.NumRecordsExported, m.NumRecordsReceived,
				m.NumRecordsDropped, m.NumFlows, m.NumConnToCollector, m.WithClickHouseExporter, m.WithS3Exporter,
				m.WithLogExporter, m.WithIPFIXExporter)
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

func printStructured(w io.Writer, format string, v any) error {
	var b []byte
	var err error
	if format == "yaml" {
		b, err = yaml.Marshal(v)
	} else {
		b, err = json.MarshalIndent(v, "", "  ")
		b = append(b, '\n')
	}
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// printFlowRecords writes records as json, yaml, or a table with the
// columns of antctl's.
func printFlowRecords(w io.Writer, format string, recs []map[string]any) error {
	if format != "table" {
		if recs == nil {
			recs = []map[string]any{}
		}
		return printStructured(w, format, recs)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SRC_IP\tDST_IP\tSPORT\tDPORT\tPROTO\tSRC_POD\tDST_POD\tSRC_NS\tDST_NS\tSERVICE")
	for _, r := range recs {
		str := func(keys ...string) string {
			for _, k := range keys {
				if v, ok := r[k]; ok {
					return fmt.Sprint(v)
				}
			}
			return ""
		}
		protoName := str("protocolIdentifier")
		if p, err := strconv.ParseUint(protoName, 10, 8); err == nil {
			protoName = flowlog.ProtocolName(uint8(p))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			str("sourceIPv4Address", "sourceIPv6Address"), str("destinationIPv4Address", "destinationIPv6Address"),
			str("sourceTransportPort"), str("destinationTransportPort"), protoName,
			str("sourcePodName"), str("destinationPodName"), str("sourcePodNamespace"), str("destinationPodNamespace"),
			str("destinationServicePortName"))
	}
	return tw.Flush()
}
