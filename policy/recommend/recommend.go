// Package recommend turns observed connections into Kubernetes
// NetworkPolicies that allow exactly them: one policy per workload (Pods
// grouped by owner, selected by the labels that tell the workload apart),
// peers named by namespace and workload labels, outside addresses
// aggregated into CIDRs, ports as observed (by name where the Pods name
// them), and a default deny per namespace or per workload in the chosen
// isolation. Connections the cluster's current policies deny are never
// made allowed. Each rule keeps the connections that justify it.
package recommend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sluice/policy/observed"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// Isolation values.
const (
	IsolationIngress = "ingress"
	IsolationEgress  = "egress"
	IsolationBoth    = "both"
)

// Default-deny scopes.
const (
	DenyNamespace = "namespace"
	DenyWorkload  = "workload"
)

// Defaults of Options.
const (
	DefaultPrefixV4 = 24
	DefaultPrefixV6 = 64
)

// ManagedBy is the app.kubernetes.io/managed-by label of every object.
const ManagedBy = "sluice-policy-recommend"

// Options configures a recommendation.
type Options struct {
	// Isolation is ingress, egress or both.
	Isolation string
	// DefaultDeny is namespace (a deny-all policy per namespace) or
	// workload (each workload's own policy isolates it; workloads without
	// observed traffic get one with no rules).
	DefaultDeny string
	// PrefixV4 and PrefixV6 aggregate outside addresses into CIDRs.
	PrefixV4, PrefixV6 int
	// Namespaces limits the policies to these namespaces; empty: every
	// namespace with an observed Pod.
	Namespaces []string
	// IncludeDenied makes connections that records or the current
	// policies deny allowed too.
	IncludeDenied bool
	// Format is k8s (Kubernetes NetworkPolicies, the default) or antrea
	// (Antrea-native policies with tiers; Object.Antrea).
	Format string
}

func (o *Options) defaults() error {
	switch o.Isolation {
	case "":
		o.Isolation = IsolationBoth
	case IsolationIngress, IsolationEgress, IsolationBoth:
	default:
		return fmt.Errorf("isolation %q: want ingress, egress or both", o.Isolation)
	}
	switch o.DefaultDeny {
	case "":
		o.DefaultDeny = DenyNamespace
	case DenyNamespace, DenyWorkload:
	default:
		return fmt.Errorf("default deny %q: want namespace or workload", o.DefaultDeny)
	}
	switch o.Format {
	case "":
		o.Format = FormatK8s
	case FormatK8s, FormatAntrea:
	default:
		return fmt.Errorf("format %q: want k8s or antrea", o.Format)
	}
	if o.PrefixV4 == 0 {
		o.PrefixV4 = DefaultPrefixV4
	}
	if o.PrefixV6 == 0 {
		o.PrefixV6 = DefaultPrefixV6
	}
	if o.PrefixV4 < 0 || o.PrefixV4 > 32 {
		return fmt.Errorf("IPv4 CIDR prefix %d: want 0 to 32", o.PrefixV4)
	}
	if o.PrefixV6 < 0 || o.PrefixV6 > 128 {
		return fmt.Errorf("IPv6 CIDR prefix %d: want 0 to 128", o.PrefixV6)
	}
	return nil
}

// Object is one recommended NetworkPolicy.
type Object struct {
	// Policy is the Kubernetes NetworkPolicy; with the antrea format it
	// is what Antrea is the rendering of.
	Policy *networkingv1.NetworkPolicy
	// Antrea is the Antrea-native policy of the antrea format, else nil.
	Antrea *crd.AntreaPolicy
	// Workload is the workload the policy is for; nil for a namespace's
	// default deny.
	Workload *Workload
	// Rules justify the policy's rules, in their order: Ingress[i] is
	// spec.ingress[i].
	Ingress, Egress []*Rule
}

// Rule is one rule and the observed connections it carries.
type Rule struct {
	// Peer names the peer: "Kind namespace/name" or a CIDR.
	Peer string
	// Ports as written: "TCP/8080", "TCP/http(8080)"; empty: every port
	// and protocol (a protocol NetworkPolicy cannot name was observed).
	Ports []string
	Conns []*observed.Conn
	// Records, First and Last sum up the connections' records.
	Records     uint64
	First, Last time.Time
}

// Skipped counts observed connections left out, by reason.
type Skipped struct {
	// Denied: the records or the current policies deny them.
	Denied int
	// NotModelled: neither end is a Pod of the cluster state.
	NotModelled int
	// OutOfScope: no end is a Pod of a chosen namespace.
	OutOfScope int
	// Errors: the model could not replay them.
	Errors int
	// ServiceAddress: the destination is a Service's address, not an
	// endpoint (a record taken before DNAT): the endpoint's port is
	// unknown, so no rule is written for it.
	ServiceAddress int
}

// Result is a recommendation.
type Result struct {
	Objects []*Object
	Skipped Skipped
	// Carried is the number of observed connections the policies allow.
	Carried int
	// Denied are the connections left out because the records or the
	// current policies deny them: the ones the policies must not allow
	// (see sluice policy recommend's check).
	Denied  []*observed.Conn
	Options Options
}

type peer struct {
	wl   *Workload
	cidr netip.Prefix
}

func (p peer) key() string {
	if p.wl != nil {
		return "w:" + p.wl.ID()
	}
	return "c:" + p.cidr.String()
}

type portKey struct {
	proto uint8
	port  uint16
}

type ruleAcc struct {
	peer  peer
	ports map[portKey]bool
	conns []*observed.Conn
	// except are addresses of a CIDR peer left out: observed denied
	// connections the aggregated CIDR would otherwise allow.
	except map[netip.Addr]bool
}

// allowsPort says the rule's ports admit c's protocol and port (a rule
// with a protocol NetworkPolicy cannot name has no ports: it admits all).
func (r *ruleAcc) allowsPort(c *observed.Conn) bool {
	for k := range r.ports {
		if protoName(k.proto) == "" {
			return true
		}
	}
	return r.ports[portKey{c.Proto, c.DstPort}]
}

// carries says a connection of the rule has peer address a (its
// destination for egress, its source for ingress).
func (r *ruleAcc) carries(a netip.Addr, egress bool) bool {
	for _, c := range r.conns {
		if (egress && c.Dst == a) || (!egress && c.Src == a) {
			return true
		}
	}
	return false
}

// exceptDenied keeps observed denied connections denied where a CIDR
// peer aggregates their address with allowed ones: NetworkPolicies add
// up, so a /24 written for one allowed address would allow a neighbour
// the cluster's own policies deny. The neighbour's address becomes an
// ipBlock except of the rule of the workload that would send (egress) or
// receive (ingress) it, on the rule's ports. An address the rule also
// carries cannot be excepted; verify reports such a connection as newly
// allowed.
func exceptDenied(ingress, egress map[*Workload]side, denied []*observed.Conn, wlOf func(netip.Addr) *Workload) {
	for _, d := range denied {
		for _, dir := range []struct {
			m      map[*Workload]side
			self   netip.Addr
			peer   netip.Addr
			egress bool
		}{{egress, d.Src, d.Dst, true}, {ingress, d.Dst, d.Src, false}} {
			w := wlOf(dir.self)
			if w == nil {
				continue
			}
			for _, r := range dir.m[w] {
				if r.peer.wl != nil || !r.peer.cidr.Contains(dir.peer) || !r.allowsPort(d) || r.carries(dir.peer, dir.egress) {
					continue
				}
				if r.except == nil {
					r.except = map[netip.Addr]bool{}
				}
				r.except[dir.peer] = true
			}
		}
	}
}

type side map[string]*ruleAcc

func (s side) add(p peer, c *observed.Conn) {
	r := s[p.key()]
	if r == nil {
		r = &ruleAcc{peer: p, ports: map[portKey]bool{}}
		s[p.key()] = r
	}
	r.ports[portKey{c.Proto, c.DstPort}] = true
	r.conns = append(r.conns, c)
}

// Recommend builds the policies. m is the cluster as it is (built with a
// Traceflow tag), objs its objects (for the Pods' owners), conns the
// observed connections.
func Recommend(ctx context.Context, m *pipeline.Model, objs []cluster.Object, conns []*observed.Conn, o Options) (*Result, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	st := m.State
	wls := Workloads(st, objs)
	podWL := map[*cluster.Pod]*Workload{}
	for _, w := range wls {
		for _, p := range w.Pods {
			podWL[p] = w
		}
	}
	scope := map[string]bool{}
	for _, ns := range o.Namespaces {
		scope[ns] = true
	}
	inScope := func(w *Workload) bool { return w != nil && (len(o.Namespaces) == 0 || scope[w.Namespace]) }
	ingress, egress := map[*Workload]side{}, map[*Workload]side{}
	res := &Result{Options: o}
	svcIPs := map[netip.Addr]bool{}
	for _, sv := range st.Services {
		for _, ips := range [][]netip.Addr{sv.ClusterIPs, sv.ExternalIPs, sv.LoadBalancerIPs} {
			for _, ip := range ips {
				svcIPs[ip] = true
			}
		}
	}
	observedNS := map[string]bool{}
	var denied []*observed.Conn
	for _, c := range conns {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		src, dst := podWL[st.PodByIP(c.Src)], podWL[st.PodByIP(c.Dst)]
		if dst == nil && svcIPs[c.Dst] {
			res.Skipped.ServiceAddress++
			continue
		}
		if !inScope(src) && !inScope(dst) {
			if src == nil && dst == nil {
				res.Skipped.NotModelled++
			} else {
				res.Skipped.OutOfScope++
			}
			continue
		}
		if !o.IncludeDenied {
			if c.Allowed == 0 {
				res.Skipped.Denied++
				denied = append(denied, c)
				continue
			}
			v, err := tracer.Decide(ctx, m, tracer.Connection{Src: c.Src, Dst: c.Dst, Proto: c.Proto, SrcPort: c.SrcPort, DstPort: c.DstPort})
			switch {
			case errors.Is(err, tracer.ErrNotModelled):
				res.Skipped.NotModelled++
				continue
			case err != nil:
				res.Skipped.Errors++
				continue
			case v.Denied:
				res.Skipped.Denied++
				denied = append(denied, c)
				continue
			}
		}
		res.Carried++
		if o.Isolation != IsolationEgress && inScope(dst) {
			observedNS[dst.Namespace] = true
			sideOf(ingress, dst).add(peerOf(src, c.Src, o), c)
		}
		if o.Isolation != IsolationIngress && inScope(src) {
			observedNS[src.Namespace] = true
			sideOf(egress, src).add(peerOf(dst, c.Dst, o), c)
		}
		if inScope(src) {
			observedNS[src.Namespace] = true
		}
		if inScope(dst) {
			observedNS[dst.Namespace] = true
		}
	}
	exceptDenied(ingress, egress, denied, func(a netip.Addr) *Workload { return podWL[st.PodByIP(a)] })
	res.Denied = denied
	names := map[string]bool{}
	for _, w := range wls {
		if !inScope(w) || !observedNS[w.Namespace] {
			continue
		}
		if ingress[w] == nil && egress[w] == nil && o.DefaultDeny == DenyNamespace {
			continue // the namespace's default deny isolates it
		}
		res.Objects = append(res.Objects, workloadPolicy(w, ingress[w], egress[w], names, o))
	}
	if o.DefaultDeny == DenyNamespace {
		for _, ns := range slices.Sorted(func(yield func(string) bool) {
			for ns := range observedNS {
				if !yield(ns) {
					return
				}
			}
		}) {
			res.Objects = append(res.Objects, defaultDeny(ns, o))
		}
	}
	if o.Format == FormatAntrea {
		for _, obj := range res.Objects {
			toAntrea(obj, o)
		}
	}
	sort.SliceStable(res.Objects, func(i, j int) bool {
		a, b := res.Objects[i].Policy, res.Objects[j].Policy
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	return res, nil
}

func sideOf(m map[*Workload]side, w *Workload) side {
	if m[w] == nil {
		m[w] = side{}
	}
	return m[w]
}

func peerOf(w *Workload, ip netip.Addr, o Options) peer {
	if w != nil {
		return peer{wl: w}
	}
	bits := o.PrefixV4
	if ip.Is6() {
		bits = o.PrefixV6
	}
	p, _ := ip.Prefix(bits)
	return peer{cidr: p}
}

func policyTypes(o Options) []networkingv1.PolicyType {
	switch o.Isolation {
	case IsolationIngress:
		return []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	case IsolationEgress:
		return []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	}
	return []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
}

func newPolicy(ns, name string, o Options) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{"app.kubernetes.io/managed-by": ManagedBy}},
	}
	np.Spec.PolicyTypes = policyTypes(o)
	return np
}

func defaultDeny(ns string, o Options) *Object {
	np := newPolicy(ns, "sluice-default-deny", o)
	np.Spec.PodSelector = metav1.LabelSelector{}
	return &Object{Policy: np}
}

func workloadPolicy(w *Workload, in, out side, names map[string]bool, o Options) *Object {
	name := objectName("sluice-" + w.Name)
	if names[w.Namespace+"/"+name] {
		name = objectName("sluice-" + strings.ToLower(w.Kind) + "-" + w.Name)
	}
	for i := 2; names[w.Namespace+"/"+name]; i++ {
		name = objectName(fmt.Sprintf("sluice-%s-%s-%d", strings.ToLower(w.Kind), w.Name, i))
	}
	names[w.Namespace+"/"+name] = true
	np := newPolicy(w.Namespace, name, o)
	np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: w.Selector}
	obj := &Object{Policy: np, Workload: w}
	targets := append(slices.Clone(w.Pods), w.Extra...)
	for _, r := range sortedRules(in) {
		rule, just := buildRule(w, r, targets)
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: rule.peers, Ports: rule.ports})
		obj.Ingress = append(obj.Ingress, just)
	}
	for _, r := range sortedRules(out) {
		var peerPods []*cluster.Pod
		if r.peer.wl != nil {
			peerPods = append(slices.Clone(r.peer.wl.Pods), r.peer.wl.Extra...)
		}
		rule, just := buildRule(w, r, peerPods)
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: rule.peers, Ports: rule.ports})
		obj.Egress = append(obj.Egress, just)
	}
	return obj
}

func sortedRules(s side) []*ruleAcc {
	out := make([]*ruleAcc, 0, len(s))
	for _, r := range s {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *ruleAcc) int { return cmp.Compare(a.peer.key(), b.peer.key()) })
	return out
}

type builtRule struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

// buildRule writes one rule for one peer; portPods are the Pods that
// serve the ports (the policy's own for ingress, the peer's for egress),
// whose container port names are used when they all agree.
func buildRule(w *Workload, r *ruleAcc, portPods []*cluster.Pod) (builtRule, *Rule) {
	var b builtRule
	just := &Rule{Conns: r.conns}
	if r.peer.wl != nil {
		pw := r.peer.wl
		p := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: pw.Selector}}
		if pw.Namespace != w.Namespace {
			p.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": pw.Namespace}}
		}
		b.peers = append(b.peers, p)
		just.Peer = pw.Describe()
	} else {
		blk := &networkingv1.IPBlock{CIDR: r.peer.cidr.String()}
		for _, a := range slices.SortedFunc(maps.Keys(r.except), netip.Addr.Compare) {
			blk.Except = append(blk.Except, netip.PrefixFrom(a, a.BitLen()).String())
		}
		b.peers = append(b.peers, networkingv1.NetworkPolicyPeer{IPBlock: blk})
		just.Peer = r.peer.cidr.String()
		if len(blk.Except) > 0 {
			just.Peer += " except " + strings.Join(blk.Except, ", ") + " (observed denied)"
		}
	}
	keys := make([]portKey, 0, len(r.ports))
	anyProto := false
	for k := range r.ports {
		keys = append(keys, k)
		if protoName(k.proto) == "" {
			anyProto = true
		}
	}
	slices.SortFunc(keys, func(a, b portKey) int {
		if c := cmp.Compare(a.proto, b.proto); c != 0 {
			return c
		}
		return cmp.Compare(a.port, b.port)
	})
	if !anyProto {
		for _, k := range keys {
			proto := corev1.Protocol(protoName(k.proto))
			port := intstr.FromInt32(int32(k.port))
			text := fmt.Sprintf("%s/%d", proto, k.port)
			if name := portName(portPods, proto, k.port); name != "" {
				port = intstr.FromString(name)
				text = fmt.Sprintf("%s/%s(%d)", proto, name, k.port)
			}
			b.ports = append(b.ports, networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port})
			just.Ports = append(just.Ports, text)
		}
	}
	for _, c := range r.conns {
		just.Records += c.Records()
		if !c.First.IsZero() && (just.First.IsZero() || c.First.Before(just.First)) {
			just.First = c.First
		}
		if c.Last.After(just.Last) {
			just.Last = c.Last
		}
	}
	return b, just
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return ""
}

// portName is the name every one of pods gives port, or "".
func portName(pods []*cluster.Pod, proto corev1.Protocol, port uint16) string {
	name := ""
	for _, p := range pods {
		n := ""
		for _, np := range p.Ports {
			if np.Port == port && np.Protocol == proto {
				n = np.Name
				break
			}
		}
		if n == "" || (name != "" && n != name) {
			return ""
		}
		name = n
	}
	return name
}

// objectName makes s a valid object name (a DNS-1123 subdomain): the
// name of a workload of Pods without an owner comes from a label value,
// which may hold capitals and underscores ("app: Shop_UI").
func objectName(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			b[i] = '-'
		}
	}
	const max = 253
	if len(b) > max {
		b = b[:max]
	}
	return strings.TrimRight(string(b), "-")
}
