package pipeline

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/datapath"
)

// portMatch is one protocol/port of a rule; a zero port mask is any port.
// A named port has name set and no port: it is resolved per Pod.
type portMatch struct {
	proto uint8
	port  datapath.Masked
	name  string
	// An ICMP match (proto ICMP) stands for ICMPv6 in IPv6 too, as
	// upstream's does; a zero mask is any type or code.
	icmpType, icmpCode datapath.Masked
}

// namedMatch is a named port resolved for one Pod: traffic to ip on
// proto/port.
type namedMatch struct {
	pod   *cluster.Pod
	ip    netip.Addr
	proto uint8
	port  uint16
}

// compiledRule is one policy rule resolved against the cluster: which
// Pods it applies to, which addresses it matches, and where its flows go.
type compiledRule struct {
	id        uint32
	ingress   bool
	table     string
	priority  int
	action    string
	appliedTo []*cluster.Pod
	anyPeer   bool
	peers     []netip.Prefix
	anyPort   bool
	ports     []portMatch
	// named holds the rule's named ports resolved, per destination Pod
	// address: for an ingress rule the Pods it applies to, for an egress
	// rule the Pods its peers select (every Pod if it has no peers).
	named []namedMatch
}

type compiledPolicies struct {
	rules           []*compiledRule
	isolatedIngress map[*cluster.Pod]bool
	isolatedEgress  map[*cluster.Pod]bool
	// isolation names, per isolated Pod and direction, the first (in name
	// order) Kubernetes NetworkPolicy that isolates it.
	isolation map[isolationKey]RuleRef
}

type isolationKey struct {
	pod     *cluster.Pod
	ingress bool
}

// compilePolicies resolves every policy rule and numbers it with a
// conjunction ID recorded in refs.
func compilePolicies(st *cluster.State, refs map[uint32]RuleRef) (*compiledPolicies, error) {
	pc := &policyCompiler{st: st, refs: refs, next: 1,
		out: &compiledPolicies{isolatedIngress: map[*cluster.Pod]bool{}, isolatedEgress: map[*cluster.Pod]bool{},
			isolation: map[isolationKey]RuleRef{}}}
	// Antrea-native rules first: their IDs follow their precedence.
	rules, err := antreaRulesInOrder(st)
	if err != nil {
		return nil, err
	}
	// Baseline rules sort last; they are numbered among themselves, since
	// they have a priority range of their own (see antreaRule).
	baseline := 0
	for pos, r := range rules {
		if r.tier == baselineTier {
			pos, baseline = baseline, baseline+1
		}
		if err := pc.antreaRule(r, pos); err != nil {
			return nil, err
		}
	}
	for _, np := range st.NetworkPolicies {
		if err := pc.k8sPolicy(np); err != nil {
			return nil, fmt.Errorf("NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
	}
	return pc.out, nil
}

// policyCompiler numbers rules as it resolves them.
type policyCompiler struct {
	st   *cluster.State
	refs map[uint32]RuleRef
	next uint32
	out  *compiledPolicies
}

func (pc *policyCompiler) newID(r RuleRef) uint32 {
	id := pc.next
	pc.next++
	pc.refs[id] = r
	return id
}

// apRule is one rule of an Antrea-native policy with what orders it.
type apRule struct {
	pol   *crd.AntreaPolicy
	rule  crd.AntreaPolicyRule
	index int
	in    bool
	tier  int
}

// baselineTier is the Baseline tier's priority (cluster.TierPriority).
const baselineTier = 253

// maxBaselineRules is how many Baseline-tier rules the model can order:
// they take flow priorities 199 down to 1 in the DefaultRule tables,
// below the K8s isolation drops (200) and above the tables' default (0).
const maxBaselineRules = 199

// antreaRulesInOrder lists every Antrea-native rule by tier, policy
// priority and rule position: that order is their precedence.
func antreaRulesInOrder(st *cluster.State) ([]apRule, error) {
	var ap []apRule
	baseline := 0
	for _, p := range st.AntreaPolicies {
		// cluster.Build refuses unknown tiers; a state built otherwise
		// must not have its rules silently put first.
		tier, ok := cluster.TierPriority(p.Spec.Tier)
		if !ok {
			return nil, fmt.Errorf("%s %s: tier %q is not one of Antrea's static tiers", p.Kind, p.Name, p.Spec.Tier)
		}
		if tier == baselineTier {
			baseline += len(p.Spec.Ingress) + len(p.Spec.Egress)
		}
		for i, r := range p.Spec.Ingress {
			ap = append(ap, apRule{p, r, i, true, tier})
		}
		for i, r := range p.Spec.Egress {
			ap = append(ap, apRule{p, r, i, false, tier})
		}
	}
	sort.SliceStable(ap, func(i, j int) bool {
		a, b := ap[i], ap[j]
		if a.tier != b.tier {
			return a.tier < b.tier
		}
		if a.pol.Spec.Priority != b.pol.Spec.Priority {
			return a.pol.Spec.Priority < b.pol.Spec.Priority
		}
		return a.index < b.index
	})
	if baseline > maxBaselineRules {
		return nil, fmt.Errorf("%d Baseline-tier rules: the model orders at most %d", baseline, maxBaselineRules)
	}
	return ap, nil
}

// antreaRule compiles the Antrea-native rule at precedence position pos:
// its place among the rules of the non-baseline tiers, or, for a
// Baseline-tier rule, among the Baseline-tier rules.
func (pc *policyCompiler) antreaRule(r apRule, pos int) error {
	typ := crd.AntreaNetworkPolicyType
	if r.pol.Kind == crd.KindAntreaClusterPolicy {
		typ = crd.AntreaClusterPolicyType
	}
	dir := "egress"
	if r.in {
		dir = "ingress"
	}
	name := r.rule.Name
	if name == "" {
		// Upstream generates a name for unnamed rules; ours is readable.
		name = fmt.Sprintf("%s-%s-%d", dir, strings.ToLower(r.rule.Action), r.index)
	}
	cr := &compiledRule{ingress: r.in, action: r.rule.Action}
	ref := RuleRef{PolicyType: typ, Namespace: r.pol.Namespace, Name: r.pol.Name, Rule: name, Action: r.rule.Action}
	switch {
	case r.tier == baselineTier && r.in: // baseline: after K8s policy, in the DefaultRule tables
		cr.table, cr.priority = TIngressDefaultRule, maxBaselineRules-pos
	case r.tier == baselineTier:
		cr.table, cr.priority = TEgressDefaultRule, maxBaselineRules-pos
	case r.in:
		cr.table, cr.priority = TAntreaPolicyIngressRule, 60000-pos
	default:
		cr.table, cr.priority = TAntreaPolicyEgressRule, 60000-pos
	}
	applied := r.rule.AppliedTo
	if len(applied) == 0 {
		applied = r.pol.Spec.AppliedTo
	}
	ns := r.pol.Namespace
	var err error
	if cr.appliedTo, err = antreaPods(pc.st, applied, ns, ""); err != nil {
		return fmt.Errorf("%s %s: appliedTo: %w", typ, r.pol.Name, err)
	}
	peers := r.rule.To
	if r.in {
		peers = r.rule.From
	}
	cr.anyPort, cr.ports = portMatches(antreaToK8sPorts(r.rule.Ports))
	if len(r.rule.Protocols) > 0 {
		// The protocols join the ports as alternatives. IGMP entries
		// match nothing here: upstream's Traceflow cannot send IGMP. An
		// entry of neither kind is no match at all, as upstream.
		for _, p := range r.rule.Protocols {
			if p.ICMP != nil || p.IGMP != nil {
				cr.anyPort = false
			}
		}
		cr.ports = append(cr.ports, icmpMatches(r.rule.Protocols)...)
	}
	main, labelled := splitPeers(r.pol, peers)
	emit := func(one compiledRule, peers []crd.PolicyPeer, self string) error {
		one.id = pc.newID(ref)
		var err error
		if one.anyPeer, one.peers, err = antreaPeers(pc.st, peers, ns, self); err != nil {
			return fmt.Errorf("%s %s: %w", typ, r.pol.Name, err)
		}
		if hasNamed(one.ports) {
			dst := one.appliedTo
			if !r.in {
				if dst, err = antreaPods(pc.st, peers, ns, self); err != nil {
					return fmt.Errorf("%s %s: %w", typ, r.pol.Name, err)
				}
				if one.anyPeer {
					dst = pc.st.Pods
				}
			}
			one.named = resolveNamed(one.ports, dst)
		}
		pc.out.rules = append(pc.out.rules, &one)
		return nil
	}
	// Upstream compiles a rule whose peers all select by sameLabels into
	// those peers' rules only; otherwise the other peers form one rule
	// (all addresses if there are none).
	if len(main) > 0 || len(labelled) == 0 {
		// A peer with namespaces.match Self selects in each applied-to
		// Pod's own namespace: one rule per namespace, each with its own ID.
		byNS := map[string][]*cluster.Pod{"": cr.appliedTo}
		if hasSelf(main) {
			byNS = map[string][]*cluster.Pod{}
			for _, p := range cr.appliedTo {
				byNS[p.Namespace] = append(byNS[p.Namespace], p)
			}
		}
		for _, self := range sortedMapKeys(byNS) {
			one := *cr
			one.appliedTo = byNS[self]
			if err := emit(one, main, self); err != nil {
				return err
			}
		}
	}
	if len(labelled) == 0 {
		return nil
	}
	groups, err := sameLabelsGroups(pc.st, applied, labelled)
	if err != nil {
		return fmt.Errorf("%s %s: appliedTo: %w", typ, r.pol.Name, err)
	}
	for _, g := range groups {
		one := *cr
		one.appliedTo = g.appliedTo
		if err := emit(one, []crd.PolicyPeer{g.peer}, ""); err != nil {
			return err
		}
	}
	return nil
}

// sortedMapKeys lists a map's keys in order, for reproducible rule IDs.
func sortedMapKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// splitPeers separates a rule's peers that select namespaces by
// sameLabels (of a ClusterNetworkPolicy) from the others. A namespaced
// policy has no namespaces field upstream (the API server prunes it), so
// there such a peer selects by its podSelector in the policy's namespace,
// as Self does. A cluster policy's peer with namespaces but neither Self
// nor any sameLabels key is left out of the rule, as upstream does.
func splitPeers(pol *crd.AntreaPolicy, peers []crd.PolicyPeer) (main, labelled []crd.PolicyPeer) {
	for _, p := range peers {
		switch {
		case p.Namespaces == nil || p.IsSelf():
			main = append(main, p)
		case pol.Kind != crd.KindAntreaClusterPolicy:
			p.Namespaces = &crd.PeerNamespaces{Match: crd.NamespaceMatchSelf}
			main = append(main, p)
		case p.IsSameLabels():
			labelled = append(labelled, p)
		}
	}
	return main, labelled
}

// labelGroup is one rule compiled from a sameLabels peer: the applied-to
// Pods of the namespaces sharing one set of values for the peer's keys,
// and the peer rewritten to select the Pods of every namespace with those
// values.
type labelGroup struct {
	appliedTo []*cluster.Pod
	peer      crd.PolicyPeer
}

// sameLabelsGroups compiles sameLabels peers as upstream does. It takes
// the namespaces of the appliedTo entries one after another, each list
// replacing the previous one, so only the last entry counts; an entry
// naming a group stands for every Pod of the group's namespaces. The
// namespaces are grouped by their values for the peer's label keys; a
// namespace missing any key is in no group, so the peer never applies to
// its Pods. Each group's Pods may reach (or be reached by) the Pods the
// peer's podSelector selects in every namespace with the same values.
func sameLabelsGroups(st *cluster.State, applied []crd.PolicyPeer, labelled []crd.PolicyPeer) ([]labelGroup, error) {
	if len(applied) == 0 {
		return nil, nil
	}
	byNS, err := perNamespaceAppliedTo(st, applied[len(applied)-1])
	if err != nil {
		return nil, err
	}
	var out []labelGroup
	for _, p := range labelled {
		keys := p.Namespaces.SameLabels
		groups := map[string][]string{}
		values := map[string]map[string]string{}
		for ns := range byNS {
			nsLabels := st.Namespaces[ns]
			vals := map[string]string{}
			var key strings.Builder
			for _, k := range keys {
				v, ok := nsLabels[k]
				if !ok {
					vals = nil
					break
				}
				vals[k] = v
				key.WriteString(k + "=" + v + "\x00")
			}
			if vals == nil {
				continue
			}
			groups[key.String()] = append(groups[key.String()], ns)
			values[key.String()] = vals
		}
		for _, k := range sortedMapKeys(groups) {
			var pods []*cluster.Pod
			sort.Strings(groups[k])
			for _, ns := range groups[k] {
				pods = append(pods, byNS[ns]...)
			}
			peer := crd.PolicyPeer{PodSelector: p.PodSelector, NamespaceSelector: &metav1.LabelSelector{MatchLabels: values[k]}}
			out = append(out, labelGroup{appliedTo: pods, peer: peer})
		}
	}
	return out, nil
}

// perNamespaceAppliedTo lists, per namespace the appliedTo entry at
// covers, the Pods upstream applies a per-namespace rule to: those its
// podSelector selects there or, for an entry naming a group, every Pod.
// The namespaces are those of its namespaceSelector (all without one);
// for a group, those of the group's namespaceSelector when it selects
// Pods by label, else all.
func perNamespaceAppliedTo(st *cluster.State, at crd.PolicyPeer) (map[string][]*cluster.Pod, error) {
	nsSel, podSel := at.NamespaceSelector, at.PodSelector
	if at.Group != "" {
		podSel = nil
		if g := st.Groups["/"+at.Group]; g != nil && (g.Spec.NamespaceSelector != nil || g.Spec.PodSelector != nil) {
			nsSel = g.Spec.NamespaceSelector
		} else if g == nil {
			return nil, nil // a missing group was warned about; it covers nothing
		}
	}
	sel := labels.Everything()
	if nsSel != nil {
		var err error
		if sel, err = metav1.LabelSelectorAsSelector(nsSel); err != nil {
			return nil, fmt.Errorf("namespace selector: %w", err)
		}
	}
	out := map[string][]*cluster.Pod{}
	for ns, nsLabels := range st.Namespaces {
		if !sel.Matches(labels.Set(nsLabels)) {
			continue
		}
		pods, err := st.SelectPods(podSel, nil, ns)
		if err != nil {
			return nil, err
		}
		out[ns] = pods
	}
	return out, nil
}

// icmpMatches turns a rule's ICMP protocols into matches on ICMP (ICMPv6
// for IPv6 traffic, with the same numbers) and its type and code when
// given.
func icmpMatches(protocols []crd.PolicyProtocol) []portMatch {
	var out []portMatch
	for _, p := range protocols {
		if p.ICMP == nil {
			continue
		}
		m := portMatch{proto: datapath.ProtoICMP}
		if p.ICMP.ICMPType != nil {
			m.icmpType = datapath.Masked{Value: uint32(*p.ICMP.ICMPType), Mask: 0xff}
		}
		if p.ICMP.ICMPCode != nil {
			m.icmpCode = datapath.Masked{Value: uint32(*p.ICMP.ICMPCode), Mask: 0xff}
		}
		out = append(out, m)
	}
	return out
}

func hasSelf(peers []crd.PolicyPeer) bool {
	for i := range peers {
		if peers[i].IsSelf() {
			return true
		}
	}
	return false
}

// k8sPolicy isolates the Pods a Kubernetes NetworkPolicy selects, in the
// directions it covers, and compiles its allow rules.
func (pc *policyCompiler) k8sPolicy(np *networkingv1.NetworkPolicy) error {
	applied, err := pc.st.SelectPods(&np.Spec.PodSelector, nil, np.Namespace)
	if err != nil {
		return err
	}
	in, eg := policyTypes(np)
	ref := RuleRef{PolicyType: crd.K8sNetworkPolicyType, Namespace: np.Namespace, Name: np.Name, Action: crd.RuleActionAllow}
	add := func(ingress bool, table string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) error {
		cr := &compiledRule{id: pc.newID(ref), ingress: ingress, table: table, priority: 200, action: crd.RuleActionAllow, appliedTo: applied}
		var err error
		var peerPods []*cluster.Pod
		if cr.anyPeer, cr.peers, peerPods, err = k8sPeers(pc.st, peers, np.Namespace); err != nil {
			return err
		}
		cr.anyPort, cr.ports = portMatches(ports)
		if hasNamed(cr.ports) {
			dst := applied
			if !ingress {
				dst = peerPods
				if cr.anyPeer {
					dst = pc.st.Pods
				}
			}
			cr.named = resolveNamed(cr.ports, dst)
		}
		pc.out.rules = append(pc.out.rules, cr)
		return nil
	}
	if in {
		for _, p := range applied {
			pc.out.isolatedIngress[p] = true
			pc.isolate(p, true, ref)
		}
		for _, r := range np.Spec.Ingress {
			if err := add(true, TIngressRule, r.From, r.Ports); err != nil {
				return err
			}
		}
	}
	if eg {
		for _, p := range applied {
			pc.out.isolatedEgress[p] = true
			pc.isolate(p, false, ref)
		}
		for _, r := range np.Spec.Egress {
			if err := add(false, TEgressRule, r.To, r.Ports); err != nil {
				return err
			}
		}
	}
	return nil
}

// isolate records the first policy isolating p in a direction.
func (pc *policyCompiler) isolate(p *cluster.Pod, ingress bool, ref RuleRef) {
	k := isolationKey{p, ingress}
	if _, ok := pc.out.isolation[k]; !ok {
		ref.Action = crd.RuleActionDrop
		pc.out.isolation[k] = ref
	}
}

func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

func podPrefixes(pods []*cluster.Pod) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range pods {
		for _, ip := range p.IPs {
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return out
}

// k8sPeers returns whether a rule's peers are any peer, else their
// addresses and, of those, the Pods its selectors select.
func k8sPeers(st *cluster.State, peers []networkingv1.NetworkPolicyPeer, ns string) (bool, []netip.Prefix, []*cluster.Pod, error) {
	if len(peers) == 0 {
		return true, nil, nil, nil
	}
	var out []netip.Prefix
	var selected []*cluster.Pod
	seen := map[*cluster.Pod]bool{}
	for _, p := range peers {
		if p.IPBlock != nil {
			cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
			if err != nil {
				return false, nil, nil, fmt.Errorf("ipBlock %q: %w", p.IPBlock.CIDR, err)
			}
			var except []netip.Prefix
			for _, e := range p.IPBlock.Except {
				ep, err := netip.ParsePrefix(e)
				if err != nil {
					return false, nil, nil, fmt.Errorf("ipBlock except %q: %w", e, err)
				}
				except = append(except, ep.Masked())
			}
			out = append(out, subtract(cidr.Masked(), except)...)
			continue
		}
		if p.PodSelector == nil && p.NamespaceSelector == nil {
			continue
		}
		sel := p.PodSelector
		if sel == nil {
			sel = &metav1.LabelSelector{}
		}
		pods, err := st.SelectPods(sel, p.NamespaceSelector, ns)
		if err != nil {
			return false, nil, nil, err
		}
		out = append(out, podPrefixes(pods)...)
		for _, q := range pods {
			if !seen[q] {
				seen[q] = true
				selected = append(selected, q)
			}
		}
	}
	return false, out, selected, nil
}

// antreaPods selects the Pods of peers in namespace ns (cluster-wide for
// ""); self is the namespace a namespaces.match Self peer selects in.
func antreaPods(st *cluster.State, peers []crd.PolicyPeer, ns, self string) ([]*cluster.Pod, error) {
	var out []*cluster.Pod
	seen := map[*cluster.Pod]bool{}
	for _, p := range peers {
		in := ns
		var pods []*cluster.Pod
		var err error
		switch {
		case p.Group != "":
			// A missing or looping group was warned about; it selects nothing.
			pods, _, _ = st.GroupMembers(ns, p.Group)
		case p.IsSelf() && self != "":
			in = self
			fallthrough
		case p.Namespaces == nil && (p.PodSelector != nil || p.NamespaceSelector != nil):
			if pods, err = st.SelectPods(p.PodSelector, p.NamespaceSelector, in); err != nil {
				return nil, err
			}
		}
		for _, q := range pods {
			if !seen[q] {
				seen[q] = true
				out = append(out, q)
			}
		}
	}
	return out, nil
}

func antreaPeers(st *cluster.State, peers []crd.PolicyPeer, ns, self string) (bool, []netip.Prefix, error) {
	if len(peers) == 0 {
		return true, nil, nil
	}
	var out []netip.Prefix
	for _, p := range peers {
		if p.IPBlock != nil {
			cidr, err := netip.ParsePrefix(p.IPBlock.CIDR)
			if err != nil {
				return false, nil, fmt.Errorf("ipBlock %q: %w", p.IPBlock.CIDR, err)
			}
			out = append(out, cidr.Masked())
		}
		if p.Group != "" {
			_, blocks, _ := st.GroupMembers(ns, p.Group)
			out = append(out, blocks...)
		}
	}
	pods, err := antreaPods(st, peers, ns, self)
	if err != nil {
		return false, nil, err
	}
	return false, append(out, podPrefixes(pods)...), nil
}

func protoNumber(p string) (uint8, bool) {
	switch corev1.Protocol(strings.ToUpper(p)) {
	case "", corev1.ProtocolTCP:
		return datapath.ProtoTCP, true
	case corev1.ProtocolUDP:
		return datapath.ProtoUDP, true
	case corev1.ProtocolSCTP:
		return datapath.ProtoSCTP, true
	}
	return 0, false // other protocols are not modelled: they match nothing
}

func rangeMatches(proto uint8, lo, hi int32) []portMatch {
	if lo < 1 || lo > 65535 {
		return nil
	}
	if hi < lo {
		hi = lo
	}
	if hi > 65535 {
		hi = 65535
	}
	var out []portMatch
	for _, m := range datapath.PortRange(uint16(lo), uint16(hi)) {
		out = append(out, portMatch{proto: proto, port: m})
	}
	return out
}

// portMatches turns a rule's ports (Kubernetes or, converted,
// Antrea-native) into matches; no ports is any port. Named ports are
// kept by name for resolveNamed; unmodelled protocols match nothing.
func portMatches(ports []networkingv1.NetworkPolicyPort) (bool, []portMatch) {
	if len(ports) == 0 {
		return true, nil
	}
	var out []portMatch
	for _, p := range ports {
		proto := ""
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		n, ok := protoNumber(proto)
		if !ok {
			continue
		}
		switch {
		case p.Port == nil:
			out = append(out, portMatch{proto: n})
		case p.Port.Type == intstr.String:
			if p.Port.StrVal != "" {
				out = append(out, portMatch{proto: n, name: p.Port.StrVal})
			}
		case p.Port.Type == 0:
			hi := p.Port.IntVal
			if p.EndPort != nil {
				hi = *p.EndPort
			}
			out = append(out, rangeMatches(n, p.Port.IntVal, hi)...)
		}
	}
	return false, out
}

func hasNamed(ports []portMatch) bool {
	for _, pm := range ports {
		if pm.name != "" {
			return true
		}
	}
	return false
}

// resolveNamed resolves the named ports among ports against each Pod in
// dst: a Pod whose container declares the name for the protocol is
// matched on that port at each of its addresses; other Pods are not.
func resolveNamed(ports []portMatch, dst []*cluster.Pod) []namedMatch {
	var out []namedMatch
	seen := map[namedMatch]bool{}
	for _, pm := range ports {
		if pm.name == "" {
			continue
		}
		for _, p := range dst {
			port, ok := p.NamedPort(pm.name, protoName(pm.proto))
			if !ok {
				continue
			}
			for _, ip := range p.IPs {
				m := namedMatch{pod: p, ip: ip, proto: pm.proto, port: port}
				if !seen[m] {
					seen[m] = true
					out = append(out, m)
				}
			}
		}
	}
	return out
}

func protoName(n uint8) corev1.Protocol {
	switch n {
	case datapath.ProtoUDP:
		return corev1.ProtocolUDP
	case datapath.ProtoSCTP:
		return corev1.ProtocolSCTP
	}
	return corev1.ProtocolTCP
}

// antreaToK8sPorts converts Antrea-native rule ports, which have the same
// fields as Kubernetes ones.
func antreaToK8sPorts(ports []crd.PolicyPort) []networkingv1.NetworkPolicyPort {
	out := make([]networkingv1.NetworkPolicyPort, len(ports))
	for i, p := range ports {
		out[i] = networkingv1.NetworkPolicyPort{Port: p.Port, EndPort: p.EndPort}
		if p.Protocol != nil {
			proto := corev1.Protocol(*p.Protocol)
			out[i].Protocol = &proto
		}
	}
	return out
}

// subtract returns the prefixes covering p minus every prefix in except.
func subtract(p netip.Prefix, except []netip.Prefix) []netip.Prefix {
	for _, e := range except {
		if !p.Overlaps(e) {
			continue
		}
		if e.Bits() <= p.Bits() {
			return nil // the exception covers all of p
		}
		// Split p in halves and subtract from each.
		lo, hi := halves(p)
		return append(subtract(lo, except), subtract(hi, except)...)
	}
	return []netip.Prefix{p}
}

func halves(p netip.Prefix) (netip.Prefix, netip.Prefix) {
	bits := p.Bits() + 1
	lo := netip.PrefixFrom(p.Addr(), bits).Masked()
	b := lo.Addr().AsSlice()
	idx := (bits - 1) / 8
	b[idx] |= 0x80 >> ((bits - 1) % 8)
	a, _ := netip.AddrFromSlice(b)
	return lo, netip.PrefixFrom(a, bits)
}
