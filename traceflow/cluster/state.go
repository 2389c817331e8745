// Package cluster holds the cluster state a trace runs against: Nodes,
// Namespaces, Pods, Services with their endpoints, Kubernetes and
// Antrea-native NetworkPolicies and Egresses. It loads that state from
// `kubectl get -o yaml` files, overlays proposed objects for what-if traces,
// and validates it, naming the object in every problem it reports.
package cluster

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"sluice/traceflow/crd"
)

// Node is a cluster Node as the datapath needs it.
type Node struct {
	Name        string
	TransportIP netip.Addr // first InternalIP
	TransportV6 netip.Addr // the first IPv6 InternalIP, if any
	PodCIDRs    []netip.Prefix
	Labels      map[string]string
}

// Pod is a Pod as the datapath needs it.
type Pod struct {
	Namespace   string
	Name        string
	Node        string
	IPs         []netip.Addr
	Labels      map[string]string
	HostNetwork bool
	Created     metav1.Time
	// Ports are the containers' named ports; policy rules that name a
	// port resolve it here, per Pod.
	Ports []NamedPort
	// IPPool is the AntreaIPAM pool the Pod's IPv4 address was allocated
	// from (the Pod's ipam.antrea.io/ippools annotation, else its
	// Namespace's), when that pool is known and holds the address; nil
	// for a per-Node IPAM Pod.
	IPPool *IPPool
	// poolNames is the Pod's own annotation, resolved once all objects
	// are read.
	poolNames []string
}

// IPPool is an AntreaIPAM pool as the datapath needs it.
type IPPool struct {
	Name    string
	Ranges  []IPRange
	Subnet  netip.Prefix // gateway/prefixLength, masked
	Gateway netip.Addr
	VLAN    uint16
}

// IPRange is an inclusive address range.
type IPRange struct{ First, Last netip.Addr }

// Contains reports whether ip is in one of the pool's ranges.
func (p *IPPool) Contains(ip netip.Addr) bool {
	for _, r := range p.Ranges {
		if r.First.BitLen() == ip.BitLen() && r.First.Compare(ip) <= 0 && ip.Compare(r.Last) <= 0 {
			return true
		}
	}
	return false
}

// NamedPort is a container port that has a name.
type NamedPort struct {
	Name     string
	Protocol corev1.Protocol
	Port     uint16
}

// NamedPort resolves a port name for protocol proto (TCP if empty) to
// the Pod's container port, as Kubernetes does for policy rules.
func (p *Pod) NamedPort(name string, proto corev1.Protocol) (uint16, bool) {
	if proto == "" {
		proto = corev1.ProtocolTCP
	}
	for _, np := range p.Ports {
		if np.Name == name && np.Protocol == proto {
			return np.Port, true
		}
	}
	return 0, false
}

// Key is "namespace/name".
func (p *Pod) Key() string { return p.Namespace + "/" + p.Name }

// IP returns the Pod's address of one family.
func (p *Pod) IP(v6 bool) (netip.Addr, bool) {
	for _, ip := range p.IPs {
		if ip.Is6() == v6 {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Protocol corev1.Protocol
	Port     uint16
	NodePort uint16 // 0 unless the Service is a NodePort or LoadBalancer one
}

// Endpoint is one ready address behind a Service with its ports by name.
type Endpoint struct {
	IP    netip.Addr
	Node  string            // the EndpointSlice's nodeName; "" if unknown
	Ports map[string]uint16 // port name ("" for unnamed) -> target port
	Proto map[string]corev1.Protocol
}

// Service is a ClusterIP Service and its endpoints (from EndpointSlices).
type Service struct {
	Namespace  string
	Name       string
	ClusterIPs []netip.Addr
	// ExternalIPs and LoadBalancerIPs (status.loadBalancer.ingress) are
	// load-balanced like the ClusterIPs.
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// InternalLocal is internalTrafficPolicy: Local: traffic from Pods to
	// the ClusterIPs goes only to endpoints on the Pod's own Node.
	InternalLocal bool
	// AffinityTimeout is sessionAffinity ClientIP's timeout in seconds
	// (sessionAffinityConfig.clientIP.timeoutSeconds, 10800 by default);
	// 0 without affinity.
	AffinityTimeout int
	Headless        bool
	Ports           []ServicePort
	Endpoints       []Endpoint
	HasSlices       bool
	Selector        map[string]string
}

// DefaultAffinityTimeout is Kubernetes' default ClientIP session
// affinity timeout in seconds (three hours).
const DefaultAffinityTimeout = 10800

// Key is "namespace/name".
func (s *Service) Key() string { return s.Namespace + "/" + s.Name }

// State is the whole modelled cluster. It is built once and then only read,
// so one State can serve concurrent traces.
type State struct {
	Nodes           []*Node
	Namespaces      map[string]map[string]string // name -> labels
	Pods            []*Pod
	Services        []*Service
	NetworkPolicies []*networkingv1.NetworkPolicy
	AntreaPolicies  []*crd.AntreaPolicy
	Egresses        []*crd.Egress
	// Groups holds ClusterGroups under "/name" and Groups under
	// "namespace/name".
	Groups map[string]*crd.AntreaGroup
	// IPPools are the AntreaIPAM pools by name; NamespacePools the
	// ipam.antrea.io/ippools annotation of each Namespace that has one.
	IPPools        map[string]*IPPool
	NamespacePools map[string][]string

	nodeByName map[string]*Node
	podByKey   map[string]*Pod
	podByIP    map[netip.Addr]*Pod
	svcByKey   map[string]*Service
}

// Node returns the Node with that name.
func (s *State) Node(name string) *Node { return s.nodeByName[name] }

// Pod returns the Pod "ns/name".
func (s *State) Pod(ns, name string) *Pod { return s.podByKey[ns+"/"+name] }

// PodByIP returns the (non-hostNetwork) Pod that owns ip.
func (s *State) PodByIP(ip netip.Addr) *Pod { return s.podByIP[ip] }

// Service returns the Service "ns/name".
func (s *State) Service(ns, name string) *Service { return s.svcByKey[ns+"/"+name] }

// NodeByTransportIP returns the Node whose transport address is ip.
func (s *State) NodeByTransportIP(ip netip.Addr) *Node {
	for _, n := range s.Nodes {
		if n.TransportIP == ip || n.TransportV6 == ip {
			return n
		}
	}
	return nil
}

// NodeForPodIP returns the Node whose PodCIDR contains ip.
func (s *State) NodeForPodIP(ip netip.Addr) *Node {
	for _, n := range s.Nodes {
		for _, c := range n.PodCIDRs {
			if c.Contains(ip) {
				return n
			}
		}
	}
	return nil
}

// PodsOnNode returns the Pods scheduled on a Node in key order.
func (s *State) PodsOnNode(node string) []*Pod {
	var out []*Pod
	for _, p := range s.Pods {
		if p.Node == node && !p.HostNetwork {
			out = append(out, p)
		}
	}
	return out
}

// SelectPods returns the Pods matched by a Pod selector and a Namespace
// selector. A nil Namespace selector means the namespace ns (if not empty)
// or every namespace; a nil Pod selector means every Pod.
func (s *State) SelectPods(podSel, nsSel *metav1.LabelSelector, ns string) ([]*Pod, error) {
	ps := labels.Everything()
	var err error
	if podSel != nil {
		if ps, err = metav1.LabelSelectorAsSelector(podSel); err != nil {
			return nil, fmt.Errorf("pod selector: %w", err)
		}
	}
	var nss labels.Selector
	if nsSel != nil {
		if nss, err = metav1.LabelSelectorAsSelector(nsSel); err != nil {
			return nil, fmt.Errorf("namespace selector: %w", err)
		}
	}
	var out []*Pod
	for _, p := range s.Pods {
		if p.HostNetwork {
			continue
		}
		switch {
		case nss != nil:
			if !nss.Matches(labels.Set(s.Namespaces[p.Namespace])) {
				continue
			}
		case ns != "" && p.Namespace != ns:
			continue
		}
		if ps.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	return out, nil
}

// EffectiveEgress returns the Egress that applies to a Pod: of all Egresses
// selecting it, the first created (then by name), because upstream the
// first one bound wins and the others wait as alternatives.
func (s *State) EffectiveEgress(p *Pod) *crd.Egress {
	for _, e := range s.Egresses {
		pods, err := s.SelectPods(e.Spec.AppliedTo.PodSelector, e.Spec.AppliedTo.NamespaceSelector, "")
		if err != nil {
			continue
		}
		if e.Spec.AppliedTo.PodSelector == nil && e.Spec.AppliedTo.NamespaceSelector == nil {
			continue // an empty appliedTo selects nothing
		}
		for _, q := range pods {
			if q == p {
				return e
			}
		}
	}
	return nil
}

// EgressAssignment is an Egress's effective IP and the Node holding it,
// read from its status; ok is false when it has none.
func EgressAssignment(e *crd.Egress) (ip netip.Addr, node string, ok bool) {
	ip, err := netip.ParseAddr(e.Status.EgressIP)
	if err != nil || e.Status.EgressNode == "" {
		return netip.Addr{}, "", false
	}
	return ip, e.Status.EgressNode, true
}

// index rebuilds the lookup maps and sorts every list so that flows and
// outputs do not depend on input order.
func (s *State) index() {
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })
	sort.Slice(s.Pods, func(i, j int) bool { return s.Pods[i].Key() < s.Pods[j].Key() })
	sort.Slice(s.Services, func(i, j int) bool { return s.Services[i].Key() < s.Services[j].Key() })
	sort.Slice(s.NetworkPolicies, func(i, j int) bool {
		return objKey(&s.NetworkPolicies[i].ObjectMeta) < objKey(&s.NetworkPolicies[j].ObjectMeta)
	})
	sort.Slice(s.AntreaPolicies, func(i, j int) bool {
		a, b := s.AntreaPolicies[i], s.AntreaPolicies[j]
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return objKey(&a.ObjectMeta) < objKey(&b.ObjectMeta)
	})
	sort.SliceStable(s.Egresses, func(i, j int) bool {
		a, b := s.Egresses[i], s.Egresses[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	s.nodeByName = map[string]*Node{}
	for _, n := range s.Nodes {
		s.nodeByName[n.Name] = n
	}
	s.podByKey = map[string]*Pod{}
	s.podByIP = map[netip.Addr]*Pod{}
	for _, p := range s.Pods {
		s.podByKey[p.Key()] = p
		if !p.HostNetwork {
			for _, ip := range p.IPs {
				s.podByIP[ip] = p
			}
		}
	}
	s.svcByKey = map[string]*Service{}
	for _, sv := range s.Services {
		s.svcByKey[sv.Key()] = sv
	}
	if s.Namespaces == nil {
		s.Namespaces = map[string]map[string]string{}
	}
}

func objKey(m *metav1.ObjectMeta) string {
	if m.Namespace == "" {
		return m.Name
	}
	return m.Namespace + "/" + m.Name
}

// Severity of a Problem.
type Severity int

// Severities: a warning leaves the state usable, an error does not.
const (
	Warning Severity = iota
	Error
)

// Problem is a validation finding about one object.
type Problem struct {
	Severity Severity
	Object   string // e.g. "Pod default/web"
	Message  string
}

func (p Problem) String() string {
	sev := "warning"
	if p.Severity == Error {
		sev = "error"
	}
	return fmt.Sprintf("%s: %s: %s", sev, p.Object, p.Message)
}

// Problems is a list of findings.
type Problems []Problem

// Err returns the errors among the findings as one error, or nil.
func (ps Problems) Err() error {
	var msgs []string
	for _, p := range ps {
		if p.Severity == Error {
			msgs = append(msgs, p.Object+": "+p.Message)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("unusable cluster state: %s", strings.Join(msgs, "; "))
}
