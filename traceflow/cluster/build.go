package cluster

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"sluice/traceflow/crd"
)

// Build converts objects into a State and validates it. The State is nil
// only when the problems include an error.
func Build(objs []Object) (*State, Problems) {
	b := builder{st: &State{Namespaces: map[string]map[string]string{},
		IPPools: map[string]*IPPool{}, NamespacePools: map[string][]string{}}}
	var slices []*discoveryv1.EndpointSlice
	for _, o := range objs {
		group := ""
		if i := strings.IndexByte(o.APIVersion, '/'); i >= 0 {
			group = o.APIVersion[:i]
		}
		switch {
		case group == "" && o.Kind == "Node":
			var n corev1.Node
			if b.decode(o, &n) {
				b.node(o, &n)
			}
		case group == "" && o.Kind == "Namespace":
			var n corev1.Namespace
			if b.decode(o, &n) {
				b.st.Namespaces[n.Name] = withNameLabel(n.Name, n.Labels)
				if v, ok := n.Annotations[crd.AnnotationIPPools]; ok {
					b.st.NamespacePools[n.Name] = poolNames(v)
				}
			}
		case group == "" && o.Kind == "Pod":
			var p corev1.Pod
			if b.decode(o, &p) {
				b.pod(o, &p)
			}
		case group == "" && o.Kind == "Service":
			var s corev1.Service
			if b.decode(o, &s) {
				b.service(o, &s)
			}
		case group == "discovery.k8s.io" && o.Kind == "EndpointSlice":
			var s discoveryv1.EndpointSlice
			if b.decode(o, &s) {
				slices = append(slices, &s)
			}
		case group == "networking.k8s.io" && o.Kind == "NetworkPolicy":
			var np networkingv1.NetworkPolicy
			if b.decode(o, &np) {
				b.k8sPolicy(o, &np)
			}
		case group == "crd.antrea.io" && (o.Kind == crd.KindAntreaNetworkPolicy || o.Kind == crd.KindAntreaClusterPolicy):
			var ap crd.AntreaPolicy
			if b.decode(o, &ap) {
				b.antreaPolicy(o, &ap)
			}
		case group == "crd.antrea.io" && (o.Kind == crd.KindClusterGroup || o.Kind == crd.KindGroup):
			var g crd.AntreaGroup
			if b.decode(o, &g) {
				b.group(o, &g)
			}
		case group == "crd.antrea.io" && o.Kind == crd.KindIPPool:
			var ip crd.IPPool
			if b.decode(o, &ip) {
				b.ipPool(o, &ip)
			}
		case group == "crd.antrea.io" && o.Kind == crd.KindEgress:
			var e crd.Egress
			if b.decode(o, &e) {
				b.egress(o, &e)
			}
		default:
			b.warn(o.Describe(), "kind %s (%s) is not part of the model; ignored", o.Kind, o.APIVersion)
		}
	}
	b.skipAddressless()
	b.st.index()
	b.podPools()
	for _, s := range slices {
		b.endpointSlice(s)
	}
	b.crossChecks()
	if b.probs.Err() != nil {
		return nil, b.probs
	}
	return b.st, b.probs
}

type builder struct {
	st    *State
	probs Problems
	// addressless are the Nodes skipped for having no InternalIP (yet):
	// their Pods are skipped too.
	addressless map[string]bool
}

func (b *builder) warn(obj, format string, args ...any) {
	b.probs = append(b.probs, Problem{Warning, obj, fmt.Sprintf(format, args...)})
}

func (b *builder) fail(obj, format string, args ...any) {
	b.probs = append(b.probs, Problem{Error, obj, fmt.Sprintf(format, args...)})
}

func (b *builder) decode(o Object, into any) bool {
	if err := json.Unmarshal(o.Raw, into); err != nil {
		b.fail(o.Describe(), "cannot decode (%s): %v", o.Source, err)
		return false
	}
	return true
}

func withNameLabel(name string, l map[string]string) map[string]string {
	out := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range l {
		out[k] = v
	}
	return out
}

func (b *builder) node(o Object, n *corev1.Node) {
	node := &Node{Name: n.Name, Labels: n.Labels}
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			b.fail(o.Describe(), "InternalIP %q is not an IP address", a.Address)
			return
		}
		if ip.Is4() && !node.TransportIP.IsValid() {
			node.TransportIP = ip
		}
		if ip.Is6() && !node.TransportV6.IsValid() {
			node.TransportV6 = ip
		}
	}
	if !node.TransportIP.IsValid() {
		node.TransportIP = node.TransportV6 // an IPv6-only Node
	}
	if !node.TransportIP.IsValid() {
		// A Node that has not reported its addresses yet (joining) must
		// not stop every trace in the cluster: it is left out, and so
		// are its Pods (see skipAddressless).
		b.warn(o.Describe(), "has no InternalIP address (needed as the tunnel endpoint); ignored")
		if b.addressless == nil {
			b.addressless = map[string]bool{}
		}
		b.addressless[n.Name] = true
		return
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			b.fail(o.Describe(), "podCIDR %q is not a CIDR", c)
			return
		}
		node.PodCIDRs = append(node.PodCIDRs, p.Masked())
	}
	if len(node.PodCIDRs) == 0 {
		b.warn(o.Describe(), "has no spec.podCIDR; no Pod can be reached on it")
	}
	b.st.Nodes = append(b.st.Nodes, node)
}

func (b *builder) pod(o Object, p *corev1.Pod) {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return // finished Pods hold no interface
	}
	pod := &Pod{
		Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Labels: p.Labels,
		HostNetwork: p.Spec.HostNetwork, Created: p.CreationTimestamp,
	}
	if v, ok := p.Annotations[crd.AnnotationIPPools]; ok {
		pod.poolNames = poolNames(v)
	}
	if pod.Namespace == "" {
		pod.Namespace = "default"
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == "" || cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
				continue
			}
			proto := cp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			pod.Ports = append(pod.Ports, NamedPort{Name: cp.Name, Protocol: proto, Port: uint16(cp.ContainerPort)})
		}
	}
	ips := []string{}
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = append(ips, p.Status.PodIP)
	}
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			b.fail(o.Describe(), "Pod IP %q is not an IP address", s)
			return
		}
		pod.IPs = append(pod.IPs, ip)
	}
	if pod.Node == "" {
		b.warn(o.Describe(), "is not scheduled (no spec.nodeName); ignored")
		return
	}
	if len(pod.IPs) == 0 && !pod.HostNetwork {
		b.warn(o.Describe(), "has no IP address yet; ignored")
		return
	}
	b.st.Pods = append(b.st.Pods, pod)
}

func (b *builder) service(o Object, s *corev1.Service) {
	svc := &Service{Namespace: s.Namespace, Name: s.Name, Selector: s.Spec.Selector}
	if svc.Namespace == "" {
		svc.Namespace = "default"
	}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, c := range ips {
		if c == corev1.ClusterIPNone {
			svc.Headless = true
			continue
		}
		ip, err := netip.ParseAddr(c)
		if err != nil {
			b.fail(o.Describe(), "clusterIP %q is not an IP address", c)
			return
		}
		svc.ClusterIPs = append(svc.ClusterIPs, ip)
	}
	for _, c := range s.Spec.ExternalIPs {
		ip, err := netip.ParseAddr(c)
		if err != nil {
			b.fail(o.Describe(), "externalIP %q is not an IP address", c)
			return
		}
		svc.ExternalIPs = append(svc.ExternalIPs, ip)
	}
	for _, in := range s.Status.LoadBalancer.Ingress {
		if in.IP == "" {
			continue // a hostname-only ingress is resolved outside the cluster
		}
		ip, err := netip.ParseAddr(in.IP)
		if err != nil {
			b.fail(o.Describe(), "loadBalancer ingress IP %q is not an IP address", in.IP)
			return
		}
		svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, ip)
	}
	svc.InternalLocal = s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		svc.AffinityTimeout = DefaultAffinityTimeout
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			svc.AffinityTimeout = int(*c.ClientIP.TimeoutSeconds)
		}
	}
	for _, p := range s.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		if p.Port < 1 || p.Port > 65535 {
			b.fail(o.Describe(), "port %d is out of range", p.Port)
			return
		}
		sp := ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)}
		if p.NodePort > 0 && p.NodePort <= 65535 {
			sp.NodePort = uint16(p.NodePort)
		}
		svc.Ports = append(svc.Ports, sp)
	}
	b.st.Services = append(b.st.Services, svc)
}

func (b *builder) endpointSlice(s *discoveryv1.EndpointSlice) {
	obj := "EndpointSlice " + s.Namespace + "/" + s.Name
	svcName := s.Labels[discoveryv1.LabelServiceName]
	if svcName == "" {
		b.warn(obj, "has no %s label; ignored", discoveryv1.LabelServiceName)
		return
	}
	ns := s.Namespace
	if ns == "" {
		ns = "default"
	}
	svc := b.st.Service(ns, svcName)
	if svc == nil {
		b.warn(obj, "belongs to Service %s/%s, which is not in the cluster state; ignored", ns, svcName)
		return
	}
	svc.HasSlices = true
	ports := map[string]uint16{}
	protos := map[string]corev1.Protocol{}
	for _, p := range s.Ports {
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			b.warn(obj, "port %q has no valid number; ignored", name)
			continue
		}
		ports[name] = uint16(*p.Port)
		protos[name] = corev1.ProtocolTCP
		if p.Protocol != nil {
			protos[name] = *p.Protocol
		}
	}
	for _, ep := range s.Endpoints {
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue
		}
		for _, a := range ep.Addresses {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				b.fail(obj, "endpoint address %q is not an IP address", a)
				continue
			}
			node := ""
			if ep.NodeName != nil {
				node = *ep.NodeName
			}
			svc.Endpoints = append(svc.Endpoints, Endpoint{IP: ip, Node: node, Ports: ports, Proto: protos})
		}
	}
}

func (b *builder) k8sPolicy(o Object, np *networkingv1.NetworkPolicy) {
	if np.Namespace == "" {
		np.Namespace = "default"
	}
	if _, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil {
		b.fail(o.Describe(), "podSelector: %v", err)
		return
	}
	check := func(peers []networkingv1.NetworkPolicyPeer) bool {
		for _, p := range peers {
			if p.IPBlock != nil {
				if _, err := netip.ParsePrefix(p.IPBlock.CIDR); err != nil {
					b.fail(o.Describe(), "ipBlock cidr %q is not a CIDR", p.IPBlock.CIDR)
					return false
				}
				for _, e := range p.IPBlock.Except {
					if _, err := netip.ParsePrefix(e); err != nil {
						b.fail(o.Describe(), "ipBlock except %q is not a CIDR", e)
						return false
					}
				}
			}
			for _, sel := range []*metav1.LabelSelector{p.PodSelector, p.NamespaceSelector} {
				if sel == nil {
					continue
				}
				if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
					b.fail(o.Describe(), "peer selector: %v", err)
					return false
				}
			}
		}
		return true
	}
	for _, r := range np.Spec.Ingress {
		if !check(r.From) {
			return
		}
	}
	for _, r := range np.Spec.Egress {
		if !check(r.To) {
			return
		}
	}
	b.st.NetworkPolicies = append(b.st.NetworkPolicies, np)
}

func (b *builder) group(o Object, g *crd.AntreaGroup) {
	if g.Kind == crd.KindClusterGroup {
		g.Namespace = ""
	} else if g.Namespace == "" {
		g.Namespace = "default"
	}
	for _, ib := range g.Spec.IPBlocks {
		if _, err := netip.ParsePrefix(ib.CIDR); err != nil {
			b.fail(o.Describe(), "ipBlocks: cidr %q is not a CIDR", ib.CIDR)
			return
		}
	}
	for _, sel := range []*metav1.LabelSelector{g.Spec.PodSelector, g.Spec.NamespaceSelector} {
		if sel == nil {
			continue
		}
		if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			b.fail(o.Describe(), "selector: %v", err)
			return
		}
	}
	if len(g.Spec.ServiceReference) > 0 || len(g.Spec.ExternalEntitySelector) > 0 {
		b.warn(o.Describe(), "serviceReference and externalEntitySelector are not modelled; they select nothing")
	}
	if b.st.Groups == nil {
		b.st.Groups = map[string]*crd.AntreaGroup{}
	}
	b.st.Groups[g.Namespace+"/"+g.Name] = g
}

func (b *builder) antreaPolicy(o Object, ap *crd.AntreaPolicy) {
	if ap.Kind == crd.KindAntreaNetworkPolicy && ap.Namespace == "" {
		ap.Namespace = "default"
	}
	if ap.Kind == crd.KindAntreaClusterPolicy {
		ap.Namespace = ""
	}
	if _, ok := TierPriority(ap.Spec.Tier); !ok {
		b.fail(o.Describe(), "tier %q is not one of the static tiers (emergency, securityops, networkops, platform, application, baseline)", ap.Spec.Tier)
		return
	}
	checkPeers := func(where string, peers []crd.PolicyPeer) bool {
		for _, p := range peers {
			if p.IPBlock != nil {
				if _, err := netip.ParsePrefix(p.IPBlock.CIDR); err != nil {
					b.fail(o.Describe(), "%s: ipBlock cidr %q is not a CIDR", where, p.IPBlock.CIDR)
					return false
				}
			}
			if p.Namespaces != nil {
				if p.NamespaceSelector != nil {
					b.fail(o.Describe(), "%s: namespaces and namespaceSelector cannot be set together in one peer", where)
					return false
				}
				if p.Namespaces.Match != "" && p.Namespaces.Match != crd.NamespaceMatchSelf {
					b.fail(o.Describe(), "%s: namespaces.match %q is not Self", where, p.Namespaces.Match)
					return false
				}
				if p.Namespaces.Match != "" && len(p.Namespaces.SameLabels) > 0 {
					b.fail(o.Describe(), "%s: namespaces sets both match and sameLabels", where)
					return false
				}
				for _, k := range p.Namespaces.SameLabels {
					if errs := validation.IsQualifiedName(k); len(errs) > 0 {
						b.fail(o.Describe(), "%s: sameLabels key %q: %s", where, k, strings.Join(errs, "; "))
						return false
					}
				}
				switch {
				case ap.Kind == crd.KindAntreaNetworkPolicy:
					b.warn(o.Describe(), "%s: a namespaced NetworkPolicy has no namespaces field upstream (the API server drops it); the peer selects in the policy's namespace", where)
				case p.Namespaces.Match == "" && len(p.Namespaces.SameLabels) == 0:
					b.warn(o.Describe(), "%s: namespaces selects by neither match nor sameLabels; upstream leaves that peer out of the rule", where)
				}
			}
			for _, sel := range []*metav1.LabelSelector{p.PodSelector, p.NamespaceSelector} {
				if sel == nil {
					continue
				}
				if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
					b.fail(o.Describe(), "%s: selector: %v", where, err)
					return false
				}
			}
		}
		return true
	}
	if !checkPeers("appliedTo", ap.Spec.AppliedTo) {
		return
	}
	for dir, rules := range map[string][]crd.AntreaPolicyRule{"ingress": ap.Spec.Ingress, "egress": ap.Spec.Egress} {
		for i, r := range rules {
			where := fmt.Sprintf("%s rule %d", dir, i)
			switch r.Action {
			case crd.RuleActionAllow, crd.RuleActionDrop, crd.RuleActionReject, crd.RuleActionPass:
			default:
				b.fail(o.Describe(), "%s: action %q is not Allow, Drop, Reject or Pass", where, r.Action)
				return
			}
			if !checkPeers(where, r.From) || !checkPeers(where, r.To) || !checkPeers(where, r.AppliedTo) {
				return
			}
			if len(ap.Spec.AppliedTo) == 0 && len(r.AppliedTo) == 0 {
				b.fail(o.Describe(), "%s: no appliedTo in the spec or the rule", where)
				return
			}
			for _, pr := range r.Protocols {
				if pr.ICMP != nil {
					for _, v := range []*int32{pr.ICMP.ICMPType, pr.ICMP.ICMPCode} {
						if v != nil && (*v < 0 || *v > 255) {
							b.fail(o.Describe(), "%s: icmp type or code %d is not in 0..255", where, *v)
							return
						}
					}
				}
				if pr.IGMP != nil {
					b.warn(o.Describe(), "%s: igmp is not modelled (that entry matches nothing): upstream's Traceflow cannot trace IGMP, its agent failing to build a protocol-2 packet, which has no IGMP body", where)
				}
			}
			if len(r.L7Protocols) > 0 {
				b.warn(o.Describe(), "%s: l7Protocols are not modelled; the rule is traced as its layer-4 part (upstream redirects the traffic it allows to the L7 engine, and its trace times out)", where)
			}
		}
	}
	b.st.AntreaPolicies = append(b.st.AntreaPolicies, ap)
}

// TierPriority maps Antrea's static tiers to their priority (lower wins).
func TierPriority(tier string) (int, bool) {
	switch strings.ToLower(tier) {
	case "emergency":
		return 50, true
	case "securityops":
		return 100, true
	case "networkops":
		return 150, true
	case "platform":
		return 200, true
	case "", "application":
		return 250, true
	case "baseline":
		return 253, true
	}
	return 0, false
}

func (b *builder) egress(o Object, e *crd.Egress) {
	for _, s := range append([]string{e.Spec.EgressIP, e.Status.EgressIP}, e.Spec.EgressIPs...) {
		if s == "" {
			continue
		}
		if _, err := netip.ParseAddr(s); err != nil {
			b.fail(o.Describe(), "egress IP %q is not an IP address", s)
			return
		}
	}
	for _, sel := range []*metav1.LabelSelector{e.Spec.AppliedTo.PodSelector, e.Spec.AppliedTo.NamespaceSelector} {
		if sel == nil {
			continue
		}
		if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			b.fail(o.Describe(), "appliedTo: %v", err)
			return
		}
	}
	b.st.Egresses = append(b.st.Egresses, e)
}

// skipAddressless leaves out the Pods of Nodes that were left out for
// having no InternalIP, with a warning each, before the state is indexed.
func (b *builder) skipAddressless() {
	if len(b.addressless) == 0 {
		return
	}
	nodes := map[string]bool{}
	for _, n := range b.st.Nodes {
		nodes[n.Name] = true
	}
	kept := b.st.Pods[:0]
	for _, p := range b.st.Pods {
		if b.addressless[p.Node] && !nodes[p.Node] {
			b.warn("Pod "+p.Key(), "is on Node %q, which has no InternalIP address; ignored", p.Node)
			continue
		}
		kept = append(kept, p)
	}
	clear(b.st.Pods[len(kept):])
	b.st.Pods = kept
}

// crossChecks finds inconsistencies between objects.
func (b *builder) crossChecks() {
	for _, ap := range b.st.AntreaPolicies {
		obj := ap.Kind + " " + ap.Name
		if ap.Namespace != "" {
			obj = ap.Kind + " " + ap.Namespace + "/" + ap.Name
		}
		peers := append([]crd.PolicyPeer(nil), ap.Spec.AppliedTo...)
		for _, r := range append(append([]crd.AntreaPolicyRule(nil), ap.Spec.Ingress...), ap.Spec.Egress...) {
			peers = append(append(append(peers, r.From...), r.To...), r.AppliedTo...)
		}
		for _, p := range peers {
			if p.Group == "" {
				continue
			}
			if _, _, err := b.st.GroupMembers(ap.Namespace, p.Group); err != nil {
				b.warn(obj, "%v; that peer matches nothing", err)
			}
		}
	}
	st := b.st
	for i, n := range st.Nodes {
		for _, m := range st.Nodes[i+1:] {
			if n.Name == m.Name {
				b.fail("Node "+n.Name, "defined twice")
			}
			for _, c := range n.PodCIDRs {
				for _, d := range m.PodCIDRs {
					if c.Overlaps(d) {
						b.fail("Node "+m.Name, "podCIDR %s overlaps podCIDR %s of Node %s", d, c, n.Name)
					}
				}
			}
			if n.TransportIP == m.TransportIP {
				b.fail("Node "+m.Name, "InternalIP %s is also the InternalIP of Node %s", m.TransportIP, n.Name)
			}
		}
	}
	seenIP := map[netip.Addr]*Pod{}
	for _, p := range st.Pods {
		obj := "Pod " + p.Key()
		if _, ok := st.Namespaces[p.Namespace]; !ok {
			st.Namespaces[p.Namespace] = withNameLabel(p.Namespace, nil) // implied by the Pod
		}
		n := st.Node(p.Node)
		if n == nil {
			b.fail(obj, "is on Node %q, which is not in the cluster state", p.Node)
			continue
		}
		if p.HostNetwork {
			continue
		}
		for _, ip := range p.IPs {
			if q := seenIP[ip]; q != nil {
				b.fail(obj, "IP %s is also the IP of Pod %s", ip, q.Key())
			}
			seenIP[ip] = p
			in := false
			for _, c := range n.PodCIDRs {
				in = in || c.Contains(ip)
			}
			// An address from the Pod's IPPool is AntreaIPAM's: the
			// model decides (with the bridging mode) how to trace it.
			if !in && (p.IPPool == nil || !p.IPPool.Contains(ip)) {
				b.warn(obj, "IP %s is outside the podCIDRs of its Node %s; traffic to it is routed as if external", ip, n.Name)
			}
		}
	}
	for _, s := range st.Services {
		obj := "Service " + s.Key()
		if !s.Headless && len(s.ClusterIPs) == 0 {
			b.warn(obj, "has no clusterIP")
		}
		if len(s.Selector) > 0 && !s.HasSlices {
			b.warn(obj, "has a selector but no EndpointSlice in the cluster state; it has no endpoints")
		}
	}
	for _, e := range st.Egresses {
		obj := "Egress " + e.Name
		if _, node, ok := EgressAssignment(e); ok {
			switch {
			case st.Node(node) != nil:
			case b.addressless[node]:
				// A Node not ready yet: like an IP that no Node holds.
				b.warn(obj, "status.egressNode %q has no InternalIP address; traced as an Egress without IP", node)
				e.Status.EgressNode = ""
			default:
				b.fail(obj, "status.egressNode %q is not a Node in the cluster state", node)
			}
			continue // assigned: none of the warnings below applies
		}
		switch {
		case e.Status.EgressIP != "" && e.Status.EgressNode == "":
			b.warn(obj, "egress IP %s is held by no Node (status.egressNode is empty); traced as an Egress without IP", e.Status.EgressIP)
		case e.Spec.EgressIP != "":
			b.warn(obj, "egress IP %s is held by no Node (no status.egressIP/egressNode); traced as an Egress without IP", e.Spec.EgressIP)
		case e.Spec.ExternalIPPool != "":
			b.warn(obj, "no IP allocated from ExternalIPPool %s (no status.egressIP/egressNode); traced as an Egress without IP", e.Spec.ExternalIPPool)
		}
	}
	// Two Egresses may share an IP, but then they must agree on its Node.
	holder := map[netip.Addr]string{}
	for _, e := range st.Egresses {
		ip, node, ok := EgressAssignment(e)
		if !ok {
			continue
		}
		if h, dup := holder[ip]; dup && h != node {
			b.fail("Egress "+e.Name, "egress IP %s is on Node %s but another Egress puts it on Node %s", ip, node, h)
		}
		holder[ip] = node
	}
}

// poolNames splits an ipam.antrea.io/ippools value (comma-separated,
// one pool per IP family).
func poolNames(v string) []string {
	var out []string
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func (b *builder) ipPool(o Object, ip *crd.IPPool) {
	obj := o.Describe()
	gw, err := netip.ParseAddr(ip.Spec.SubnetInfo.Gateway)
	if err != nil {
		b.fail(obj, "subnetInfo.gateway %q is not an IP address", ip.Spec.SubnetInfo.Gateway)
		return
	}
	subnet, err := gw.Prefix(int(ip.Spec.SubnetInfo.PrefixLength))
	if err != nil || ip.Spec.SubnetInfo.PrefixLength <= 0 {
		b.fail(obj, "subnetInfo.prefixLength %d does not fit gateway %s", ip.Spec.SubnetInfo.PrefixLength, gw)
		return
	}
	if ip.Spec.SubnetInfo.VLAN > 4094 {
		b.fail(obj, "subnetInfo.vlan %d is not in 0..4094", ip.Spec.SubnetInfo.VLAN)
		return
	}
	pool := &IPPool{Name: ip.Name, Subnet: subnet, Gateway: gw, VLAN: ip.Spec.SubnetInfo.VLAN}
	for i, r := range ip.Spec.IPRanges {
		var first, last netip.Addr
		if r.CIDR != "" {
			c, err := netip.ParsePrefix(r.CIDR)
			if err != nil {
				b.fail(obj, "ipRanges[%d].cidr %q is not a CIDR", i, r.CIDR)
				return
			}
			c = c.Masked()
			first, last = c.Addr(), lastAddr(c)
		} else {
			f, err1 := netip.ParseAddr(r.Start)
			l, err2 := netip.ParseAddr(r.End)
			if err1 != nil || err2 != nil || f.BitLen() != l.BitLen() || l.Less(f) {
				b.fail(obj, "ipRanges[%d] %q-%q is not an address range", i, r.Start, r.End)
				return
			}
			first, last = f, l
		}
		if !subnet.Contains(first) || !subnet.Contains(last) {
			b.fail(obj, "ipRanges[%d] %s-%s is outside the subnet %s", i, first, last, subnet)
			return
		}
		pool.Ranges = append(pool.Ranges, IPRange{First: first, Last: last})
	}
	b.st.IPPools[pool.Name] = pool
}

// lastAddr is the highest address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().AsSlice()
	for i := p.Bits(); i < len(a)*8; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	out, _ := netip.AddrFromSlice(a)
	return out
}

// podPools resolves each Pod's IPPool as the reference's IPAM driver
// chooses it: the Pod's annotation, else its Namespace's; the pool must
// be known and hold the Pod's address, else the Pod is warned about and
// treated as a per-Node IPAM Pod.
func (b *builder) podPools() {
	for _, p := range b.st.Pods {
		names := p.poolNames
		if len(names) == 0 {
			names = b.st.NamespacePools[p.Namespace]
		}
		if len(names) == 0 || p.HostNetwork {
			continue
		}
		obj := "Pod " + p.Key()
		for _, ip := range p.IPs {
			for _, n := range names {
				pool := b.st.IPPools[n]
				if pool == nil {
					continue
				}
				if pool.Contains(ip) && p.IPPool == nil && ip.Is4() {
					p.IPPool = pool
				}
			}
		}
		if p.IPPool == nil {
			var known []string
			for _, n := range names {
				if b.st.IPPools[n] != nil {
					known = append(known, n)
				}
			}
			if len(known) == 0 {
				b.warn(obj, "allocates from IPPool %s, which is not in the cluster state; traced as a per-Node IPAM Pod", strings.Join(names, ","))
			} else {
				b.warn(obj, "no IPv4 address of it is in IPPool %s; traced as a per-Node IPAM Pod", strings.Join(known, ","))
			}
		}
	}
}
