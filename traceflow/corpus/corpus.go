// Package corpus reads the Traceflow test corpus: traces with the
// observations the reference reports for them, over the fixture cluster
// and its overlays. The tracer's tests check the model against it and
// package ovscheck checks the model's flows against real Open vSwitch.
package corpus

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
)

// Case is one trace and what it must report.
type Case struct {
	Name     string   `json:"name"`
	Mode     string   `json:"mode,omitempty"` // traffic mode; encap if empty
	Src      string   `json:"src"`            // antctl's -S
	Dst      string   `json:"dst"`            // antctl's -D
	Flow     string   `json:"flow,omitempty"` // antctl's -f
	Overlays []string `json:"overlays,omitempty"`
	ProxyAll bool     `json:"proxyAll,omitempty"` // the agents' antreaProxy.proxyAll
	// TrafficEncryptionMode is the agents' trafficEncryptionMode; none if empty.
	TrafficEncryptionMode string `json:"trafficEncryptionMode,omitempty"`
	// EnableBridgingMode is the agents' enableBridgingMode (noEncap mode).
	EnableBridgingMode bool             `json:"enableBridgingMode,omitempty"`
	Phase              crd.Phase        `json:"phase"`
	Reason             string           `json:"reason,omitempty"`
	Results            []crd.NodeResult `json:"results,omitempty"` // timestamps left out
}

// Tag is the dataplane tag the corpus's models carry.
const Tag = 7

// Load reads the cases of dir/corpus.yaml; dir is the testdata directory
// that also holds cluster/ and overlays/.
func Load(dir string) ([]Case, error) {
	b, err := os.ReadFile(filepath.Join(dir, "corpus.yaml"))
	if err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	var cs []Case
	if err := yaml.UnmarshalStrict(b, &cs); err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	return cs, nil
}

// TrafficMode is the case's mode, encap by default.
func (c *Case) TrafficMode() pipeline.TrafficMode {
	if c.Mode == "" {
		return pipeline.Encap
	}
	return pipeline.TrafficMode(c.Mode)
}

// Model builds the fixture cluster of dir with the case's overlays, mode
// and proxyAll, with the corpus's Traceflow tag.
func (c *Case) Model(ctx context.Context, dir string) (*pipeline.Model, error) {
	objs, err := cluster.ReadPath(ctx, filepath.Join(dir, "cluster"))
	if err != nil {
		return nil, err
	}
	for _, o := range c.Overlays {
		top, err := cluster.ReadPath(ctx, filepath.Join(dir, "overlays", o))
		if err != nil {
			return nil, err
		}
		objs = cluster.Overlay(objs, top)
	}
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		return nil, err
	}
	cfg := pipeline.DefaultConfig()
	cfg.TrafficMode, cfg.Tag, cfg.ProxyAll, cfg.BridgingMode = c.TrafficMode(), Tag, c.ProxyAll, c.EnableBridgingMode
	if cfg.Encryption, err = pipeline.ParseEncryptionMode(c.TrafficEncryptionMode); err != nil {
		return nil, fmt.Errorf("corpus case %q: %w", c.Name, err)
	}
	m, _, err := pipeline.Build(ctx, st, cfg)
	return m, err
}
