package cluster

import (
	"fmt"
	"net/netip"

	"sluice/traceflow/crd"
)

// maxGroupDepth bounds child-group nesting; Antrea allows one level, a
// little more costs nothing and still stops a loop.
const maxGroupDepth = 8

// GroupMembers resolves the ClusterGroup name (ns "") or the Group name of
// namespace ns, with its child groups: the Pods it selects and its IP
// blocks. A missing group or a loop of child groups is an error.
func (s *State) GroupMembers(ns, name string) ([]*Pod, []netip.Prefix, error) {
	var pods []*Pod
	var blocks []netip.Prefix
	seen := map[*Pod]bool{}
	var walk func(name string, depth int) error
	walk = func(name string, depth int) error {
		kind := crd.KindClusterGroup
		if ns != "" {
			kind = crd.KindGroup
		}
		if depth > maxGroupDepth {
			return fmt.Errorf("%s %q: child groups nest more than %d deep (a loop?)", kind, name, maxGroupDepth)
		}
		g := s.Groups[ns+"/"+name]
		if g == nil {
			return fmt.Errorf("%s %q is not in the cluster state", kind, name)
		}
		for _, ib := range g.Spec.IPBlocks {
			p, err := netip.ParsePrefix(ib.CIDR)
			if err != nil {
				return fmt.Errorf("%s %q: ipBlocks: %w", kind, name, err)
			}
			blocks = append(blocks, p.Masked())
		}
		if g.Spec.PodSelector != nil || g.Spec.NamespaceSelector != nil {
			sel, err := s.SelectPods(g.Spec.PodSelector, g.Spec.NamespaceSelector, ns)
			if err != nil {
				return fmt.Errorf("%s %q: %w", kind, name, err)
			}
			for _, p := range sel {
				if !seen[p] {
					seen[p] = true
					pods = append(pods, p)
				}
			}
		}
		for _, c := range g.Spec.ChildGroups {
			if err := walk(c, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(name, 0); err != nil {
		return nil, nil, err
	}
	return pods, blocks, nil
}
