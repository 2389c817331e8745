package policy_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"sluice/traceflow/cluster"
)

// npCheck decides connections by the Kubernetes NetworkPolicy semantics
// alone, straight from the objects: an independent check of what the
// recommended policies allow, that shares nothing with the datapath model
// under test (np-guard's netpol-analyzer, the analyzer the issue names,
// is not served by the module proxy here).
type npCheck struct {
	nsLabels map[string]map[string]string
	byIP     map[netip.Addr]*npPod
	policies []networkingv1.NetworkPolicy
}

type npPod struct {
	ns, name string
	labels   map[string]string
	ports    []corev1.ContainerPort
}

func newNPCheck(t *testing.T, objs []cluster.Object) *npCheck {
	t.Helper()
	c := &npCheck{nsLabels: map[string]map[string]string{}, byIP: map[netip.Addr]*npPod{}}
	for _, o := range objs {
		switch {
		case o.Kind == "Namespace" && o.APIVersion == "v1":
			var n corev1.Namespace
			if err := json.Unmarshal(o.Raw, &n); err != nil {
				t.Fatal(err)
			}
			l := map[string]string{"kubernetes.io/metadata.name": n.Name}
			for k, v := range n.Labels {
				l[k] = v
			}
			c.nsLabels[n.Name] = l
		case o.Kind == "Pod" && o.APIVersion == "v1":
			var p corev1.Pod
			if err := json.Unmarshal(o.Raw, &p); err != nil {
				t.Fatal(err)
			}
			if p.Spec.HostNetwork {
				continue
			}
			pod := &npPod{ns: p.Namespace, name: p.Name, labels: p.Labels}
			for _, ct := range p.Spec.Containers {
				pod.ports = append(pod.ports, ct.Ports...)
			}
			for _, ip := range p.Status.PodIPs {
				if a, err := netip.ParseAddr(ip.IP); err == nil {
					c.byIP[a] = pod
				}
			}
		case o.Kind == "NetworkPolicy" && strings.HasPrefix(o.APIVersion, "networking.k8s.io/"):
			var np networkingv1.NetworkPolicy
			if err := json.Unmarshal(o.Raw, &np); err != nil {
				t.Fatal(err)
			}
			c.policies = append(c.policies, np)
		}
	}
	return c
}

func (c *npCheck) selects(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(labels.Set(l))
}

// types is the policy's policyTypes with the API server's defaulting.
func types(np *networkingv1.NetworkPolicy) (in, out bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		in = in || t == networkingv1.PolicyTypeIngress
		out = out || t == networkingv1.PolicyTypeEgress
	}
	return in, out
}

func (c *npCheck) peerMatches(p networkingv1.NetworkPolicyPeer, policyNS string, ip netip.Addr) bool {
	if p.IPBlock != nil {
		cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
		if err != nil || !cidr.Contains(ip) {
			return false
		}
		for _, e := range p.IPBlock.Except {
			if ex, err := netip.ParsePrefix(e); err == nil && ex.Contains(ip) {
				return false
			}
		}
		return true
	}
	pod := c.byIP[ip]
	if pod == nil {
		return false
	}
	if p.NamespaceSelector == nil {
		if pod.ns != policyNS {
			return false
		}
	} else if !c.selects(p.NamespaceSelector, c.nsLabels[pod.ns]) {
		return false
	}
	return c.selects(p.PodSelector, pod.labels)
}

func portMatches(ports []networkingv1.NetworkPolicyPort, proto corev1.Protocol, port int32, server *npPod) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		pr := corev1.ProtocolTCP
		if pp.Protocol != nil {
			pr = *pp.Protocol
		}
		if pr != proto {
			continue
		}
		switch {
		case pp.Port == nil:
			return true
		case pp.Port.Type == 1: // a name, resolved on the serving Pod
			if server == nil {
				continue
			}
			for _, cp := range server.ports {
				cpProto := cp.Protocol
				if cpProto == "" {
					cpProto = corev1.ProtocolTCP
				}
				if cp.Name == pp.Port.StrVal && cpProto == proto && cp.ContainerPort == port {
					return true
				}
			}
		case pp.EndPort != nil:
			if port >= pp.Port.IntVal && port <= *pp.EndPort {
				return true
			}
		case pp.Port.IntVal == port:
			return true
		}
	}
	return false
}

// allowed decides a connection (destination after DNAT).
func (c *npCheck) allowed(src, dst netip.Addr, proto corev1.Protocol, port int32) bool {
	return c.direction(src, dst, proto, port, false) && c.direction(src, dst, proto, port, true)
}

func (c *npCheck) direction(src, dst netip.Addr, proto corev1.Protocol, port int32, ingress bool) bool {
	self, peerIP := c.byIP[src], dst
	if ingress {
		self, peerIP = c.byIP[dst], src
	}
	if self == nil {
		return true // only Pods are isolated
	}
	isolated := false
	for i := range c.policies {
		np := &c.policies[i]
		in, out := types(np)
		if np.Namespace != self.ns || !c.selects(&np.Spec.PodSelector, self.labels) || (ingress && !in) || (!ingress && !out) {
			continue
		}
		isolated = true
		if ingress {
			for _, r := range np.Spec.Ingress {
				if c.rule(r.From, r.Ports, np.Namespace, peerIP, proto, port, self) {
					return true
				}
			}
		} else {
			for _, r := range np.Spec.Egress {
				if c.rule(r.To, r.Ports, np.Namespace, peerIP, proto, port, c.byIP[dst]) {
					return true
				}
			}
		}
	}
	return !isolated
}

func (c *npCheck) rule(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, ns string, peerIP netip.Addr, proto corev1.Protocol, port int32, server *npPod) bool {
	if !portMatches(ports, proto, port, server) {
		return false
	}
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if c.peerMatches(p, ns, peerIP) {
			return true
		}
	}
	return false
}

func k8sProto(p uint8) corev1.Protocol {
	switch p {
	case 6:
		return corev1.ProtocolTCP
	case 17:
		return corev1.ProtocolUDP
	case 132:
		return corev1.ProtocolSCTP
	}
	return "" // ICMP and others: only a rule without ports matches
}

// TestNPCheckSemantics: the checker itself, on hand-written cases whose
// answers follow from the Kubernetes documentation.
func TestNPCheckSemantics(t *testing.T) {
	objs, err := cluster.ParseObjects([]byte(`
apiVersion: v1
kind: Namespace
metadata: {name: a, labels: {team: x}}
---
apiVersion: v1
kind: Namespace
metadata: {name: b}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: a, labels: {app: web}}
spec: {containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}
status: {podIPs: [{ip: 10.0.0.1}]}
---
apiVersion: v1
kind: Pod
metadata: {name: cli, namespace: b, labels: {app: cli}}
spec: {containers: [{name: c}]}
status: {podIPs: [{ip: 10.0.0.2}]}
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: a, labels: {app: other}}
spec: {containers: [{name: c}]}
status: {podIPs: [{ip: 10.0.0.3}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-in, namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: b}}, podSelector: {matchLabels: {app: cli}}}]
    ports: [{port: http}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cli-out, namespace: b}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 10.0.0.0/30, except: [10.0.0.3/32]}}]
`), "semantics")
	if err != nil {
		t.Fatal(err)
	}
	c := newNPCheck(t, objs)
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		src, dst string
		proto    corev1.Protocol
		port     int32
		want     bool
	}{
		{"10.0.0.2", "10.0.0.1", corev1.ProtocolTCP, 8080, true},  // named port, peer in b
		{"10.0.0.2", "10.0.0.1", corev1.ProtocolTCP, 80, false},   // another port
		{"10.0.0.2", "10.0.0.1", corev1.ProtocolUDP, 8080, false}, // another protocol
		{"10.0.0.3", "10.0.0.1", corev1.ProtocolTCP, 8080, false}, // same namespace, not selected
		{"10.0.0.2", "10.0.0.3", corev1.ProtocolTCP, 1, false},    // egress except
		{"10.0.0.1", "10.0.0.3", corev1.ProtocolTCP, 1, true},     // nothing isolates either
		{"10.0.0.2", "192.0.2.1", corev1.ProtocolTCP, 1, false},   // egress outside the block
		{"192.0.2.1", "10.0.0.3", corev1.ProtocolTCP, 1, true},
	} {
		if got := c.allowed(ip(tc.src), ip(tc.dst), tc.proto, tc.port); got != tc.want {
			t.Errorf("%s -> %s %s/%d: allowed=%v, want %v", tc.src, tc.dst, tc.proto, tc.port, got, tc.want)
		}
	}
}
