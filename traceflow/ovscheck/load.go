package ovscheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"sluice/traceflow/datapath"
	"sluice/traceflow/ovs"
	"sluice/traceflow/pipeline"
)

// Bridge is one Node's bridge loaded into the server.
type Bridge struct {
	s      *Server
	Name   string
	Node   *pipeline.NodeModel
	Tables ovs.Tables
}

// Load builds nm's bridge named br (its interfaces prefixed by prefix)
// by running the script `sluice traceflow pipeline --ovs-script` prints,
// then checks that OVS holds exactly the modelled flows and groups. Only
// one bridge with a tunnel port can exist at a time (OVS allows one
// flow-based tunnel per UDP port): Delete the previous one first.
func (s *Server) Load(ctx context.Context, m *pipeline.Model, node, br, prefix string) (*Bridge, error) {
	nm := m.Nodes[node]
	if nm == nil {
		return nil, fmt.Errorf("ovscheck: no Node %s in the model", node)
	}
	var script strings.Builder
	if err := ovs.Script(&script, nm, m.Config); err != nil {
		return nil, err
	}
	c := s.daemon("sh", "-s")
	c.Env = append(c.Env, "BR="+br, "PORT_PREFIX="+prefix)
	c.Stdin = strings.NewReader(script.String())
	if out, err := c.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ovscheck: loading Node %s: %w: %s", node, err, out)
	}
	b := &Bridge{s: s, Name: br, Node: nm, Tables: ovs.TablesOf(nm.Bridge)}
	return b, b.Verify(ctx)
}

// Delete removes the bridge.
func (b *Bridge) Delete(ctx context.Context) error {
	_, err := b.s.Run(ctx, "", "ovs-vsctl", "--if-exists", "del-br", b.Name)
	return err
}

// Verify checks that the bridge holds exactly the modelled flows and
// groups: as many as the model has, and none that OVS, comparing with
// ovs-ofctl diff-flows, finds different.
func (b *Bridge) Verify(ctx context.Context) error {
	var flows, groups []string
	for _, f := range b.Node.Bridge.Flows() {
		s, err := b.Tables.FlowText(f)
		if err != nil {
			return err
		}
		flows = append(flows, s)
	}
	for _, g := range b.Node.Bridge.Groups() {
		s, err := b.Tables.GroupText(g)
		if err != nil {
			return err
		}
		groups = append(groups, s)
	}
	count := func(marker string, args ...string) (int, error) {
		out, err := b.s.Run(ctx, "", "ovs-ofctl", append([]string{"-O", "OpenFlow15"}, args...)...)
		n := 0
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, marker) {
				n++
			}
		}
		return n, err
	}
	nf, err := count("actions=", "dump-flows", "--no-stats", b.Name)
	if err != nil {
		return err
	}
	ng, err := count("group_id=", "dump-groups", b.Name)
	if err != nil {
		return err
	}
	if nf != len(flows) || ng != len(groups) {
		return fmt.Errorf("ovscheck: bridge %s holds %d flows and %d groups, the model %d and %d", b.Name, nf, ng, len(flows), len(groups))
	}
	// diff-flows reads a file, not stdin.
	file := filepath.Join(b.s.Dir, b.Name+".flows")
	if err := os.WriteFile(file, []byte(strings.Join(flows, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("ovscheck: %w", err)
	}
	diff, err := b.s.Run(ctx, "", "ovs-ofctl", "-O", "OpenFlow15", "diff-flows", b.Name, file)
	if err != nil || strings.TrimSpace(diff) != "" {
		return fmt.Errorf("ovscheck: bridge %s differs from the model (- in OVS, + in the model):\n%s%v", b.Name, diff, err)
	}
	return nil
}

// learnedFlow is a dumped flow with a hard timeout: only learn actions
// install such flows in the model.
var learnedFlow = regexp.MustCompile(`^table=\d+, hard_timeout=`)

// Learned returns the flows learn actions installed in the bridge, as
// dump-flows prints them without counters, sorted.
func (b *Bridge) Learned(ctx context.Context) ([]string, error) {
	out, err := b.s.Run(ctx, "", "ovs-ofctl", "-O", "OpenFlow15", "dump-flows", "--no-stats", b.Name)
	if err != nil {
		return nil, err
	}
	var learned []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); learnedFlow.MatchString(l) {
			learned = append(learned, l)
		}
	}
	sort.Strings(learned)
	return learned, nil
}

// ForgetLearned deletes every learned flow, so the next packet finds the
// bridge as loaded. Learned flows all match an IP protocol, which the
// table's default flow does not: a non-strict delete spares it.
func (b *Bridge) ForgetLearned(ctx context.Context) error {
	t, ok := b.Tables[pipeline.TSessionAffinity]
	if !ok {
		return nil
	}
	for _, eth := range []string{"ip", "ipv6"} {
		if _, err := b.s.Run(ctx, "", "ovs-ofctl", "-O", "OpenFlow15", "del-flows", b.Name, fmt.Sprintf("table=%d,%s", t, eth)); err != nil {
			return err
		}
	}
	return nil
}

// CompareLearned lists how the flows OVS learned differ from the flows
// the model's run learned.
func (b *Bridge) CompareLearned(ctx context.Context, want []*datapath.Flow) ([]string, error) {
	var w []string
	for _, f := range want {
		s, err := b.Tables.FlowText(f)
		if err != nil {
			return nil, err
		}
		w = append(w, s)
	}
	sort.Strings(w)
	got, err := b.Learned(ctx)
	if err != nil {
		return nil, err
	}
	if strings.Join(got, "\n") == strings.Join(w, "\n") {
		return nil, nil
	}
	return []string{fmt.Sprintf("learned flows: OVS %q, model %q", got, w)}, nil
}
