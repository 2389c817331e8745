package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"
)

// logOptions are the logging flags every long-running command takes.
type logOptions struct {
	format string
	level  string
}

func (o *logOptions) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.format, "log-format", "text", "log format: text or json")
	cmd.Flags().StringVar(&o.level, "log-level", "info", "log level: debug, info, warn or error")
}

func (o *logOptions) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch o.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q is neither text nor json", o.format)
}
