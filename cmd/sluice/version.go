package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is the release this source tree is (the chart's appVersion) as a
// development build; `make image` and the Dockerfile set the release itself
// with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of sluice",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "sluice %s %s %s/%s%s\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH, revision())
		},
	}
}

// revision is the VCS revision the binary was built from, when known.
func revision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return " " + s.Value[:12]
		}
	}
	return ""
}
