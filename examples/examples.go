// Package examples carries the example files that commands need at run
// time, so that they work from any directory: the demo cluster.
package examples

import (
	"embed"
	"io/fs"
)

//go:embed cluster/*.yaml
var files embed.FS

// Cluster returns the demo cluster's object files (cluster/*.yaml), in the
// format `sluice traceflow --cluster` reads.
func Cluster() fs.FS {
	sub, err := fs.Sub(files, "cluster")
	if err != nil {
		panic(err) // the embedded tree always has the directory
	}
	return sub
}
