package recommend

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"sluice/policy/observed"
)

// maxListed bounds the connections a rule's comment lists one by one.
const maxListed = 5

// YAML renders the object with its comment: what it is for and, per rule,
// the observed connections that justify it.
func (o *Object) YAML() ([]byte, error) {
	var obj any = o.Policy
	if o.Antrea != nil {
		obj = o.Antrea
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("recommend: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("recommend: %w", err)
	}
	// An unset timestamp is written as null; it is not part of a manifest.
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	y, err := yaml.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("recommend: %w", err)
	}
	var b bytes.Buffer
	for _, l := range o.Comment() {
		b.WriteString("# " + l + "\n")
	}
	b.Write(y)
	return b.Bytes(), nil
}

// Comment is the object's comment, line by line.
func (o *Object) Comment() []string {
	np := o.Policy
	kind, name := "NetworkPolicy", np.Namespace+"/"+np.Name
	if o.Antrea != nil {
		kind, name = "Antrea "+o.Antrea.Kind, o.Antrea.Name
		if o.Antrea.Namespace != "" {
			name = o.Antrea.Namespace + "/" + name
		}
	}
	if o.Workload == nil {
		first := fmt.Sprintf("%s %s: default deny (%s) for every Pod of namespace %s;", kind, name, typesText(o), np.Namespace)
		if o.Antrea != nil {
			first = fmt.Sprintf("%s %s: in the baseline tier, drops (%s) what nothing before it allowed, for every Pod of namespace %s;", kind, name, typesText(o), np.Namespace)
		}
		return []string{first, "the other recommended policies of the namespace allow the observed traffic."}
	}
	w := o.Workload
	var pods []string
	for _, p := range w.Pods {
		pods = append(pods, p.Name)
	}
	out := []string{fmt.Sprintf("%s %s: %s (%s: %s), isolated for %s.",
		kind, name, w.Describe(), count(len(w.Pods), "Pod"), strings.Join(pods, ", "), typesText(o))}
	if len(w.Extra) > 0 {
		var extra []string
		for _, p := range w.Extra {
			extra = append(extra, p.Name)
		}
		out = append(out, fmt.Sprintf("No labels tell the workload apart: the selector also selects %s.", strings.Join(extra, ", ")))
	}
	if len(o.Ingress) == 0 && len(o.Egress) == 0 {
		out = append(out, "No traffic was observed: the policy allows none.")
	}
	for _, dir := range []struct {
		name  string
		rules []*Rule
	}{{"ingress", o.Ingress}, {"egress", o.Egress}} {
		for i, r := range dir.rules {
			out = append(out, ruleLines(dir.name, i, r)...)
		}
	}
	return out
}

func typesText(o *Object) string {
	var t []string
	for _, p := range o.Policy.Spec.PolicyTypes {
		t = append(t, strings.ToLower(string(p)))
	}
	return strings.Join(t, " and ")
}

func ruleLines(dir string, i int, r *Rule) []string {
	ports := "every port and protocol (a protocol NetworkPolicy cannot name, such as ICMP, was observed)"
	if len(r.Ports) > 0 {
		ports = strings.Join(r.Ports, ", ")
	}
	word := "from"
	if dir == "egress" {
		word = "to"
	}
	out := []string{fmt.Sprintf("%s[%d] %s %s, %s: %s, %s, first seen %s, last seen %s",
		dir, i, word, r.Peer, ports, count(len(r.Conns), "connection"), count(int(r.Records), "record"), stamp(r.First), stamp(r.Last))}
	for j, c := range r.Conns {
		if j == maxListed {
			out = append(out, fmt.Sprintf("  ... and %d more connections", len(r.Conns)-maxListed))
			break
		}
		out = append(out, "  "+ConnText(c))
	}
	return out
}

// ConnText describes a connection in one line.
func ConnText(c *observed.Conn) string {
	s := fmt.Sprintf("%s -> %s %s: %s, %s to %s", end(c.SrcNamespace, c.SrcPod, c.Src.String()),
		end(c.DstNamespace, c.DstPod, c.Dst.String()), portText(c), count(int(c.Records()), "record"), stamp(c.First), stamp(c.Last))
	if c.ServicePortName != "" {
		s += " (Service " + c.ServicePortName + ")"
	}
	return s
}

// count is "1 thing" or "n things".
func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func end(ns, pod, ip string) string {
	if pod == "" {
		return ip
	}
	return ns + "/" + pod
}

func portText(c *observed.Conn) string {
	name := protoName(c.Proto)
	switch {
	case c.Proto == 1:
		return "ICMP"
	case c.Proto == 58:
		return "ICMPv6"
	case name == "":
		return fmt.Sprintf("proto %d", c.Proto)
	}
	return fmt.Sprintf("%s/%d", name, c.DstPort)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// WriteYAML writes every object as one YAML stream.
func (r *Result) WriteYAML(w io.Writer) error {
	for i, o := range r.Objects {
		y, err := o.YAML()
		if err != nil {
			return err
		}
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		if _, err := w.Write(y); err != nil {
			return err
		}
	}
	return nil
}

// FileName is the object's file under WriteDir: namespace_name.yaml, or
// name.yaml for a cluster-scoped one.
func (o *Object) FileName() string {
	if o.Antrea != nil && o.Antrea.Namespace == "" {
		return o.Antrea.Name + ".yaml"
	}
	return o.Policy.Namespace + "_" + o.Policy.Name + ".yaml"
}

// WriteDir writes one file per object into dir, creating it.
func (r *Result) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("recommend: %w", err)
	}
	for _, o := range r.Objects {
		y, err := o.YAML()
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, o.FileName()), y, 0o644); err != nil {
			return fmt.Errorf("recommend: %w", err)
		}
	}
	return nil
}
