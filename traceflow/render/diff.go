package render

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"sluice/traceflow/crd"
)

// Diff prints a what-if comparison: both traces in antctl's YAML layout,
// then the changes, Node by Node, as removed (-) and added (+) observations.
func Diff(w io.Writer, before, after *crd.Traceflow) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "# before")
	if err := YAML(bw, Summarize(before)); err != nil {
		return err
	}
	fmt.Fprintln(bw, "# after (with the proposed objects)")
	if err := YAML(bw, Summarize(after)); err != nil {
		return err
	}
	fmt.Fprintln(bw, "# changes")
	changes := 0
	if before.Status.Phase != after.Status.Phase || before.Status.Reason != after.Status.Reason {
		fmt.Fprintf(bw, "phase: %s -> %s\n", phaseString(before), phaseString(after))
		changes++
	}
	nodes := nodeOrder(before, after)
	for _, n := range nodes {
		a, b := obsLines(before, n), obsLines(after, n)
		ops := diffLines(a, b)
		if len(ops) == 0 {
			continue
		}
		fmt.Fprintf(bw, "node %s:\n", n)
		for _, op := range ops {
			fmt.Fprintf(bw, "  %s\n", op)
		}
		changes++
	}
	if changes == 0 {
		fmt.Fprintln(bw, "none: the proposed objects do not change this trace")
	}
	return bw.Flush()
}

func phaseString(tf *crd.Traceflow) string {
	if tf.Status.Reason != "" {
		return fmt.Sprintf("%s (%s)", tf.Status.Phase, tf.Status.Reason)
	}
	return string(tf.Status.Phase)
}

func nodeOrder(tfs ...*crd.Traceflow) []string {
	var out []string
	seen := map[string]bool{}
	for _, tf := range tfs {
		for _, r := range tf.Status.Results {
			if !seen[r.Node] {
				seen[r.Node] = true
				out = append(out, r.Node)
			}
		}
	}
	return out
}

func obsLines(tf *crd.Traceflow, node string) []string {
	var out []string
	for _, r := range tf.Status.Results {
		if r.Node != node {
			continue
		}
		for _, o := range r.Observations {
			out = append(out, obsLine(o))
		}
	}
	return out
}

// obsLine is one observation on one line: component[/info] action and its
// set fields.
func obsLine(o crd.Observation) string {
	var b strings.Builder
	b.WriteString(string(o.Component))
	if o.ComponentInfo != "" {
		b.WriteString("/" + o.ComponentInfo)
	}
	b.WriteString(" " + string(o.Action))
	for _, kv := range [][2]string{
		{"pod", o.Pod}, {"networkPolicy", o.NetworkPolicy}, {"networkPolicyRule", o.NetworkPolicyRule},
		{"egress", o.Egress}, {"translatedSrcIP", o.TranslatedSrcIP}, {"translatedDstIP", o.TranslatedDstIP},
		{"tunnelDstIP", o.TunnelDstIP}, {"egressIP", o.EgressIP}, {"egressNode", o.EgressNode}, {"srcPodIP", o.SrcPodIP},
	} {
		if kv[1] != "" {
			b.WriteString(" " + kv[0] + "=" + kv[1])
		}
	}
	return b.String()
}

// diffLines returns "- x" and "+ y" lines turning a into b, from a longest
// common subsequence (lists are a handful of lines long).
func diffLines(a, b []string) []string {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, "- "+a[i])
			i++
		default:
			out = append(out, "+ "+b[j])
			j++
		}
	}
	return out
}
