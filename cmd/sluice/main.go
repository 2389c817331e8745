// Command sluice is Kubernetes network-flow visibility and packet path
// tracing: one binary with a subcommand per component.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		// cobra has printed usage errors already; ours carry their own text.
		os.Exit(exitCode(err))
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Kubernetes network-flow visibility and packet path tracing",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCmd(), newIPFIXCmd(), newAggregatorCmd(), newGetCmd(), newTraceflowCmd())
	root.AddCommand(newExporterCmd(), newDemoCmd(), newClickHouseCmd(), newPolicyCmd())
	return root
}

// exitError carries an exit status without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func exitCode(err error) int {
	if e, ok := err.(exitError); ok {
		return e.code
	}
	fmt.Fprintln(os.Stderr, "sluice:", err)
	return 2
}
