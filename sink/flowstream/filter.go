package flowstream

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"sluice/flow"
	"sluice/flow/flowpb"
)

// Filter is a compiled FlowFilter: filters are ANDed, the values of one
// list ORed, and an empty filter matches everything. The namespace, Pod,
// label and IP filters look at the end(s) of the flow the direction names;
// Service names and flow types do not depend on it.
type Filter struct {
	from, to   bool
	namespaces map[string]bool
	pods       []podName
	selector   labels.Selector // nil: no label filter
	services   map[string]bool
	flowTypes  map[uint8]bool
	prefixes   []netip.Prefix

	// labelCache maps a labels JSON object to its parsed set; records of
	// one Pod share the string, so the cache stays small. It is reset
	// when it reaches labelCacheSize.
	labelCache map[string]labels.Set
}

const labelCacheSize = 4096

type podName struct{ namespace, name string }

// Compile checks and compiles a FlowFilter (nil matches everything).
func Compile(f *flowpb.FlowFilter) (*Filter, error) {
	c := &Filter{from: true, to: true}
	switch d := f.GetDirection(); d {
	case flowpb.FilterDirection_FILTER_DIRECTION_BOTH:
	case flowpb.FilterDirection_FILTER_DIRECTION_FROM:
		c.to = false
	case flowpb.FilterDirection_FILTER_DIRECTION_TO:
		c.from = false
	default:
		return nil, fmt.Errorf("direction %d: want BOTH (0), FROM (1) or TO (2)", d)
	}
	if ns := f.GetNamespaces(); len(ns) > 0 {
		c.namespaces = map[string]bool{}
		for _, n := range ns {
			c.namespaces[n] = true
		}
	}
	for _, p := range f.GetPodNames() {
		ns, name, ok := strings.Cut(p, "/")
		if !ok {
			ns, name = "", p
		}
		if name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("pod name %q: want name or namespace/name", p)
		}
		c.pods = append(c.pods, podName{ns, name})
	}
	if s := f.GetPodLabelSelector(); s != "" {
		sel, err := labels.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("label selector %q: %w", s, err)
		}
		c.selector = sel
		c.labelCache = map[string]labels.Set{}
	}
	if svcs := f.GetServiceNames(); len(svcs) > 0 {
		c.services = map[string]bool{}
		for _, s := range svcs {
			if !strings.Contains(s, "/") {
				return nil, fmt.Errorf("service name %q: want namespace/name", s)
			}
			c.services[s] = true
		}
	}
	if ts := f.GetFlowTypes(); len(ts) > 0 {
		c.flowTypes = map[uint8]bool{}
		for _, t := range ts {
			if t < 0 || t > 255 {
				return nil, fmt.Errorf("flow type %d is out of range", t)
			}
			c.flowTypes[uint8(t)] = true
		}
	}
	for _, s := range f.GetIpAddresses() {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("IP address %q: neither an address nor a CIDR prefix", s)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		c.prefixes = append(c.prefixes, p.Masked())
	}
	return c, nil
}

// Match reports whether f passes the filter.
func (c *Filter) Match(f *flow.Flow) bool {
	if c.flowTypes != nil && !(f.Present.Has(flow.FlowType) && c.flowTypes[f.FlowType]) {
		return false
	}
	if c.services != nil {
		svc, _, _ := strings.Cut(f.DestinationServicePortName, ":")
		if !c.services[svc] && !c.services[f.DestinationServicePortName] {
			return false
		}
	}
	src := side{f.SourcePodNamespace, f.SourcePodName, f.SourcePodLabels, f.SourceIP}
	dst := side{f.DestinationPodNamespace, f.DestinationPodName, f.DestinationPodLabels, f.DestinationIP}
	// Unset fields hold zero values, which never match.
	either := func(test func(side) bool) bool { return c.from && test(src) || c.to && test(dst) }
	if c.namespaces != nil && !either(func(s side) bool { return s.ns != "" && c.namespaces[s.ns] }) {
		return false
	}
	if c.pods != nil && !either(func(s side) bool {
		for _, p := range c.pods {
			if s.pod == p.name && (p.namespace == "" || p.namespace == s.ns) {
				return true
			}
		}
		return false
	}) {
		return false
	}
	if c.selector != nil && !either(func(s side) bool {
		set, ok := c.labelSet(s.labels)
		return ok && c.selector.Matches(set)
	}) {
		return false
	}
	if c.prefixes != nil && !either(func(s side) bool {
		if !s.ip.IsValid() {
			return false
		}
		ip := s.ip.Unmap()
		for _, p := range c.prefixes {
			if p.Contains(ip) {
				return true
			}
		}
		return false
	}) {
		return false
	}
	return true
}

// side is one end of a flow.
type side struct {
	ns, pod, labels string
	ip              netip.Addr
}

// labelSet parses a labels JSON object ("" means the labels are unknown:
// no selector matches then).
func (c *Filter) labelSet(s string) (labels.Set, bool) {
	if s == "" {
		return nil, false
	}
	if set, ok := c.labelCache[s]; ok {
		return set, true
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, false
	}
	if len(c.labelCache) >= labelCacheSize {
		clear(c.labelCache)
	}
	c.labelCache[s] = m
	return m, true
}
