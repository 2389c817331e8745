package render

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"sluice/traceflow/crd"
)

// DOT writes a Graphviz graph of the trace: the source endpoint, one
// cluster per Node result with its observations in order, and the
// destination when the packet reached it. Drops are drawn in red.
func DOT(w io.Writer, tf *crd.Traceflow) error {
	bw := bufio.NewWriter(w)
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	title := tf.Name
	switch tf.Status.Phase {
	case crd.PhaseSucceeded:
	case crd.PhaseFailed:
		title = fmt.Sprintf("Traceflow %s failed: %s", tf.Name, tf.Status.Reason)
	case crd.PhaseRunning:
		title = fmt.Sprintf("Traceflow %s is running...", tf.Name)
	default:
		title = "Unknown Traceflow status: " + tf.Name
	}
	p("digraph G {\n\tcenter=true;\n\tlabelloc=t;\n\tlabel=%s;\n", quote(title))
	p("\tnode [shape=box, style=\"rounded,filled,solid\", color=\"#696969\", fillcolor=\"#DCDCDC\"];\n")
	p("\tedge [penwidth=2.0, color=\"#C0C0C0\"];\n")
	s := Summarize(tf)
	endpoint := "style=\"filled,bold\", color=\"#808080\", fillcolor=\"#C8C8C8\", shape=ellipse"
	p("\tsource [label=%s, %s];\n", quote(s.Source), endpoint)
	prev := "source"
	last := crd.Action("")
	for i, r := range tf.Status.Results {
		p("\tsubgraph cluster_%d {\n\t\tstyle=\"filled,bold\";\n\t\tbgcolor=\"#F8F8FF\";\n\t\tlabel=%s;\n", i, quote(r.Node))
		for j, o := range r.Observations {
			id := fmt.Sprintf("n%d_%d", i, j)
			attrs := ""
			if o.Action == crd.ActionDropped || o.Action == crd.ActionRejected {
				attrs = ", color=\"#B22222\", fillcolor=\"#EDD5D5\""
			}
			p("\t\t%s [label=%s%s];\n", id, quote(obsLabel(o)), attrs)
			p("\t\t%s -> %s;\n", prev, id)
			prev, last = id, o.Action
		}
		p("\t}\n")
	}
	switch last {
	case crd.ActionDelivered:
		p("\tdestination [label=%s, %s];\n\t%s -> destination;\n", quote(s.Destination), endpoint, prev)
	case crd.ActionForwardedOutOfNetwork:
		p("\tdestination [label=%s, %s];\n\t%s -> destination [style=dashed, color=\"#B20000\"];\n", quote(s.Destination), endpoint, prev)
	}
	p("}\n")
	return bw.Flush()
}

func obsLabel(o crd.Observation) string {
	lines := []string{string(o.Component)}
	if o.ComponentInfo != "" {
		lines = append(lines, o.ComponentInfo)
	}
	lines = append(lines, string(o.Action))
	add := func(k, v string) {
		if v != "" {
			lines = append(lines, k+v)
		}
	}
	add("Netpol: ", o.NetworkPolicy)
	add("Rule: ", o.NetworkPolicyRule)
	add("To: ", o.Pod)
	add("Translated Source IP: ", o.TranslatedSrcIP)
	add("Translated Destination IP: ", o.TranslatedDstIP)
	add("Tunnel Destination IP: ", o.TunnelDstIP)
	add("Egress: ", o.Egress)
	add("Egress IP: ", o.EgressIP)
	add("Egress Node: ", o.EgressNode)
	return strings.Join(lines, "\n")
}

// quote makes a DOT string literal.
func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}
