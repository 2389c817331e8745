// Package render prints a finished Traceflow: antctl's YAML and JSON
// layout, the full Traceflow object, a Graphviz graph, and the difference
// between two traces of a what-if run.
package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"

	"sluice/traceflow/crd"
)

// Summary is antctl's output object, fields in its order.
type Summary struct {
	Name        string           `json:"name" yaml:"name"`
	Phase       crd.Phase        `json:"phase,omitempty" yaml:"phase,omitempty"`
	Reason      string           `json:"reason,omitempty" yaml:"reason,omitempty"`
	Source      string           `json:"source" yaml:"source"`
	Destination string           `json:"destination" yaml:"destination"`
	Results     []crd.NodeResult `json:"results,omitempty" yaml:"results,omitempty"`
}

// Summarize builds antctl's view of a Traceflow.
func Summarize(tf *crd.Traceflow) Summary {
	d := tf.Spec.Destination
	dst := d.IP
	switch {
	case d.Pod != "":
		dst = d.Namespace + "/" + d.Pod
	case d.Service != "":
		dst = d.Namespace + "/" + d.Service
	}
	return Summary{
		Name: tf.Name, Phase: tf.Status.Phase, Reason: tf.Status.Reason,
		// antctl always prints "<ns>/<pod>", even when both are empty.
		Source:      tf.Spec.Source.Namespace + "/" + tf.Spec.Source.Pod,
		Destination: dst, Results: tf.Status.Results,
	}
}

// YAML writes v the way antctl does: go-yaml v3, 4-space indentation.
func YAML(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(4)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("render yaml: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("render yaml: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// JSON writes v with 2-space indentation and, like antctl, no trailing
// newline.
func JSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("render json: %w", err)
	}
	_, err = w.Write(b)
	return err
}

// ObjectYAML writes a full Traceflow object. It goes through JSON first so
// that the Kubernetes field names and omitempty rules apply, then YAML.
func ObjectYAML(w io.Writer, tf *crd.Traceflow) error {
	b, err := json.Marshal(tf)
	if err != nil {
		return fmt.Errorf("render yaml: %w", err)
	}
	var node yaml.Node
	if err := yaml.Unmarshal(b, &node); err != nil {
		return fmt.Errorf("render yaml: %w", err)
	}
	clearStyle(&node)
	return YAML(w, &node)
}

// clearStyle drops the flow style that JSON input gives every node, so the
// object prints as block YAML.
func clearStyle(n *yaml.Node) {
	n.Style &^= yaml.FlowStyle
	for _, c := range n.Content {
		clearStyle(c)
	}
}
