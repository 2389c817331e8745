package enrich

import (
	"cmp"
	"maps"
	"math"
	"net/netip"
	"slices"
	"time"
)

// podEntry is one Pod that has held an IP. Times are Unix nanoseconds so that
// the hot path compares integers.
type podEntry struct {
	created int64 // math.MinInt64 when unknown
	deleted int64 // math.MaxInt64 while alive
	pod     *Pod
}

type serviceKey struct {
	namespace, name string
}

// snapshot is an immutable view of the objects of a Store. Readers load it
// through an atomic pointer and never lock.
type snapshot struct {
	// pods holds, per IP, every remembered Pod that has held the IP, ordered
	// by creation time (oldest first).
	pods     map[netip.Addr][]podEntry
	nodes    map[string]*Node
	services map[serviceKey]*Service
	// byClusterIP indexes the Services by ClusterIP, live ones over
	// remembered deleted ones.
	byClusterIP map[netip.Addr]*Service

	livePods, deletedPods int
}

func (s *snapshot) podByIP(ip netip.Addr, at time.Time) (*Pod, bool) {
	if s == nil {
		return nil, false
	}
	entries := s.pods[ip.Unmap()]
	if len(entries) == 0 {
		return nil, false
	}
	zero := at.IsZero()
	if !zero {
		t := unixNano(at)
		for i := len(entries) - 1; i >= 0; i-- {
			if e := &entries[i]; e.created <= t && t < e.deleted {
				return e.pod, true
			}
		}
	}
	var recent *podEntry
	for i := len(entries) - 1; i >= 0; i-- {
		e := &entries[i]
		if e.deleted == math.MaxInt64 {
			return e.pod, true
		}
		if zero && (recent == nil || e.deleted > recent.deleted) {
			recent = e
		}
	}
	if recent != nil {
		return recent.pod, true
	}
	return nil, false
}

func (s *snapshot) nodeByName(name string) (*Node, bool) {
	if s == nil {
		return nil, false
	}
	n, ok := s.nodes[name]
	return n, ok
}

func (s *snapshot) serviceByName(namespace, name string) (*Service, bool) {
	if s == nil {
		return nil, false
	}
	svc, ok := s.services[serviceKey{namespace, name}]
	return svc, ok
}

func (s *snapshot) serviceByClusterIP(ip netip.Addr) (*Service, bool) {
	if s == nil {
		return nil, false
	}
	svc, ok := s.byClusterIP[ip.Unmap()]
	return svc, ok
}

const (
	minUnixSec = math.MinInt64/int64(time.Second) + 1
	maxUnixSec = math.MaxInt64/int64(time.Second) - 1
)

// unixNano is t.UnixNano clamped to the int64 range; the zero time is
// math.MinInt64.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	switch s := t.Unix(); {
	case s < minUnixSec:
		return math.MinInt64
	case s > maxUnixSec:
		return math.MaxInt64
	}
	return t.UnixNano()
}

// buildSnapshot indexes objects that are already normalized (see
// normalizePod); it keeps the pointers.
func buildSnapshot(pods []*Pod, nodes []*Node, services []*Service) *snapshot {
	s := &snapshot{
		pods:     make(map[netip.Addr][]podEntry, len(pods)),
		nodes:    make(map[string]*Node, len(nodes)),
		services: make(map[serviceKey]*Service, len(services)),
	}
	s.byClusterIP = make(map[netip.Addr]*Service, len(services))
	for _, p := range pods {
		if p.Deleted.IsZero() {
			s.livePods++
		} else {
			s.deletedPods++
		}
		e := podEntry{created: unixNano(p.Created), deleted: math.MaxInt64, pod: p}
		if !p.Deleted.IsZero() {
			e.deleted = unixNano(p.Deleted)
		}
		for _, ip := range p.IPs {
			s.pods[ip] = append(s.pods[ip], e)
		}
	}
	for _, entries := range s.pods {
		if len(entries) > 1 {
			slices.SortFunc(entries, comparePodEntries)
		}
	}
	for _, n := range nodes {
		s.nodes[n.Name] = n
	}
	for _, svc := range services {
		s.services[serviceKey{svc.Namespace, svc.Name}] = svc
		// Later Services win: callers list deleted ones first, so a
		// ClusterIP reused by a live Service names that one.
		for _, ip := range svc.ClusterIPs {
			s.byClusterIP[ip] = svc
		}
	}
	return s
}

// comparePodEntries orders by creation time, then live after deleted, then
// by deletion time and UID so that the order is deterministic.
func comparePodEntries(a, b podEntry) int {
	return cmp.Or(
		cmp.Compare(a.created, b.created),
		cmp.Compare(a.deleted, b.deleted),
		cmp.Compare(a.pod.UID, b.pod.UID),
		cmp.Compare(a.pod.Namespace, b.pod.Namespace),
		cmp.Compare(a.pod.Name, b.pod.Name),
	)
}

// normalizePod returns a copy of p owned by a Store: slices and maps are
// cloned, IPs are unmapped and deduplicated (invalid ones dropped), and the
// labels JSON is computed.
func normalizePod(p Pod) *Pod {
	q := p
	q.Labels = maps.Clone(p.Labels)
	q.IPs = normalizeAddrs(p.IPs)
	q.labelsJSON = marshalLabels(q.Labels)
	return &q
}

func normalizeNode(n Node) *Node {
	q := n
	q.InternalIP = n.InternalIP.Unmap()
	q.PodCIDRs = slices.Clone(n.PodCIDRs)
	return &q
}

func normalizeService(s Service) *Service {
	q := s
	q.ClusterIPs = normalizeAddrs(s.ClusterIPs)
	q.Ports = slices.Clone(s.Ports)
	return &q
}

func normalizeAddrs(addrs []netip.Addr) []netip.Addr {
	if len(addrs) == 0 {
		return nil
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if !a.IsValid() {
			continue
		}
		a = a.Unmap()
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}
