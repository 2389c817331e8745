package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"sluice/aggregator"
	"sluice/config"
)

func newAggregatorCmd() *cobra.Command {
	var path string
	var logOpts logOptions
	cmd := &cobra.Command{
		Use:   "aggregator --config FILE",
		Short: "Collect flow records from the exporters and send them on",
		Long: `Runs the flow aggregator. The configuration file takes every key of Antrea's
flow-aggregator.conf (with the same defaults) plus Sluice's own settings under
the "sluice" key; see examples/ for one file per mode. Without --config, the
defaults apply.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := logOpts.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cfg := config.Default()
			if path != "" {
				if cfg, err = aggregator.LoadConfig(path); err != nil {
					return fmt.Errorf("configuration:\n%w", err)
				}
			}
			a, err := aggregator.New(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return a.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&path, "config", "", "configuration file (YAML)")
	logOpts.register(cmd)
	cmd.SetContext(context.Background())
	return cmd
}
