package enrich

import (
	"net/netip"
	"time"
)

// Static is a Store over a fixed set of objects, mainly for tests. Pods with
// a non-zero Deleted time take part in time-based look-ups as deleted Pods
// and are never forgotten.
type Static struct {
	snap *snapshot
}

var _ Store = (*Static)(nil)

// NewStatic returns a Store holding copies of the given objects. Later
// objects with the same Node name or Service namespace and name replace
// earlier ones.
func NewStatic(pods []Pod, nodes []Node, services []Service) *Static {
	ps := make([]*Pod, len(pods))
	for i, p := range pods {
		ps[i] = normalizePod(p)
	}
	ns := make([]*Node, len(nodes))
	for i, n := range nodes {
		ns[i] = normalizeNode(n)
	}
	ss := make([]*Service, len(services))
	for i, s := range services {
		ss[i] = normalizeService(s)
	}
	return &Static{snap: buildSnapshot(ps, ns, ss)}
}

// PodByIP implements Store.
func (s *Static) PodByIP(ip netip.Addr, at time.Time) (*Pod, bool) {
	return s.snap.podByIP(ip, at)
}

// NodeByName implements Store.
func (s *Static) NodeByName(name string) (*Node, bool) { return s.snap.nodeByName(name) }

// ServiceByName implements Store.
func (s *Static) ServiceByName(namespace, name string) (*Service, bool) {
	return s.snap.serviceByName(namespace, name)
}

// ServiceByClusterIP implements Store.
func (s *Static) ServiceByClusterIP(ip netip.Addr) (*Service, bool) {
	return s.snap.serviceByClusterIP(ip)
}
