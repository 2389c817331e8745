package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"sluice/sink/clickhouse"
)

func newClickHouseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "clickhouse",
		Short: "ClickHouse sink tools",
	}
	var (
		database, server string
		ttl              time.Duration
	)
	schema := &cobra.Command{
		Use:   "schema [--database default] [--server-version 18.16] [--ttl 12h]",
		Short: "Print the DDL of the flows table and its views",
		Long: `Prints the statements that create the flows table (Antrea's columns plus
destinationServiceIP) and the flows_pod_view, flows_node_view and
flows_policy_view materialized views, for a current ClickHouse or, with
--server-version, for an older server: what it cannot take (TTL before
19.6, LowCardinality before 19.1) is left out and said so in a comment.
Feed it to the server with: sluice clickhouse schema | clickhouse-client --multiquery
The aggregator creates what is missing itself with clickHouse.createSchema: true.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := clickhouse.SchemaOptions{Database: database, TTL: ttl}
			if server != "" {
				v, err := clickhouse.ParseVersion(server)
				if err != nil {
					return fmt.Errorf("--server-version: %w", err)
				}
				o.Server = v
			}
			if ttl < 0 {
				return fmt.Errorf("--ttl %s: must not be negative", ttl)
			}
			stmts, omitted := clickhouse.Schema(o)
			w := cmd.OutOrStdout()
			for _, s := range omitted {
				fmt.Fprintf(w, "-- left out for ClickHouse %s: %s\n", server, s)
			}
			for _, s := range stmts {
				fmt.Fprintf(w, "%s;\n\n", strings.TrimSpace(s.SQL))
			}
			return nil
		},
	}
	fl := schema.Flags()
	fl.StringVar(&database, "database", "default", "database of the table and views")
	fl.StringVar(&server, "server-version", "", "server version the DDL is for (default: a current server)")
	fl.DurationVar(&ttl, "ttl", 0, "delete rows this long after their insertion (0 keeps them)")
	cmd.AddCommand(schema)
	return cmd
}
