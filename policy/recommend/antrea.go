package recommend

import (
	"fmt"
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/traceflow/crd"
)

// Formats of the output.
const (
	FormatK8s    = "k8s"
	FormatAntrea = "antrea"
)

// antreaPriority is the priority of the recommended policies in their
// tiers (lower is evaluated first; Antrea's default is 5).
const antreaPriority = 5

// toAntrea writes o as Antrea-native policy: a workload's policy becomes
// an Antrea NetworkPolicy of the application tier whose rules Allow the
// same peers and ports; with a per-workload default deny, a last rule
// per isolated direction drops the rest. A namespace's default deny
// becomes a ClusterNetworkPolicy of the baseline tier (the only tier
// after Kubernetes NetworkPolicies, and one that only cluster policies
// may use) that drops what nothing before it allowed.
func toAntrea(o *Object, opts Options) {
	np := o.Policy
	ingress, egress := false, false
	for _, t := range np.Spec.PolicyTypes {
		ingress = ingress || t == "Ingress"
		egress = egress || t == "Egress"
	}
	ap := &crd.AntreaPolicy{Spec: crd.AntreaPolicySpec{Priority: antreaPriority}}
	ap.APIVersion = crd.GroupVersion
	ap.Labels = np.Labels
	if o.Workload == nil {
		ap.Kind, ap.Name = crd.KindAntreaClusterPolicy, fmt.Sprintf("%s-%s", np.Name, np.Namespace)
		ap.Spec.Tier = "baseline"
		ap.Spec.AppliedTo = []crd.PolicyPeer{{NamespaceSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"kubernetes.io/metadata.name": np.Namespace}}}}
		if ingress {
			ap.Spec.Ingress = []crd.AntreaPolicyRule{{Action: crd.RuleActionDrop, Name: "default-deny-ingress"}}
		}
		if egress {
			ap.Spec.Egress = []crd.AntreaPolicyRule{{Action: crd.RuleActionDrop, Name: "default-deny-egress"}}
		}
		o.Antrea = ap
		return
	}
	ap.Kind, ap.Namespace, ap.Name = crd.KindAntreaNetworkPolicy, np.Namespace, np.Name
	ap.Spec.Tier = crd.DefaultTierName
	sel := np.Spec.PodSelector
	ap.Spec.AppliedTo = []crd.PolicyPeer{{PodSelector: &sel}}
	for i, r := range np.Spec.Ingress {
		ap.Spec.Ingress = append(ap.Spec.Ingress, crd.AntreaPolicyRule{Action: crd.RuleActionAllow,
			Name: fmt.Sprintf("ingress-%d", i), From: antreaPeers(r.From), Ports: antreaPorts(r.Ports)})
	}
	for i, r := range np.Spec.Egress {
		ap.Spec.Egress = append(ap.Spec.Egress, crd.AntreaPolicyRule{Action: crd.RuleActionAllow,
			Name: fmt.Sprintf("egress-%d", i), To: antreaPeers(r.To), Ports: antreaPorts(r.Ports)})
	}
	if opts.DefaultDeny == DenyWorkload {
		if ingress {
			ap.Spec.Ingress = append(ap.Spec.Ingress, crd.AntreaPolicyRule{Action: crd.RuleActionDrop, Name: "default-deny-ingress"})
		}
		if egress {
			ap.Spec.Egress = append(ap.Spec.Egress, crd.AntreaPolicyRule{Action: crd.RuleActionDrop, Name: "default-deny-egress"})
		}
	}
	o.Antrea = ap
}

func antreaPeers(ps []networkingv1.NetworkPolicyPeer) []crd.PolicyPeer {
	var out []crd.PolicyPeer
	for _, p := range ps {
		q := crd.PolicyPeer{PodSelector: p.PodSelector, NamespaceSelector: p.NamespaceSelector}
		if p.IPBlock != nil {
			// Antrea-native ipBlocks have no except: the CIDR is
			// written as the blocks that cover it without them.
			for _, c := range without(p.IPBlock.CIDR, p.IPBlock.Except) {
				out = append(out, crd.PolicyPeer{IPBlock: &crd.IPBlock{CIDR: c}})
			}
			continue
		}
		out = append(out, q)
	}
	return out
}

func antreaPorts(ps []networkingv1.NetworkPolicyPort) []crd.PolicyPort {
	var out []crd.PolicyPort
	for _, p := range ps {
		q := crd.PolicyPort{Port: p.Port, EndPort: p.EndPort}
		if p.Protocol != nil {
			s := string(*p.Protocol)
			q.Protocol = &s
		}
		out = append(out, q)
	}
	return out
}

// without is cidr less the except prefixes (all within it), as the
// fewest CIDRs that cover the rest.
func without(cidr string, except []string) []string {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || len(except) == 0 {
		return []string{cidr}
	}
	var ex []netip.Prefix
	for _, e := range except {
		if q, err := netip.ParsePrefix(e); err == nil {
			ex = append(ex, q.Masked())
		}
	}
	var out []string
	var split func(p netip.Prefix)
	split = func(p netip.Prefix) {
		overlaps := false
		for _, q := range ex {
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				return // p lies inside an except
			}
			overlaps = overlaps || p.Contains(q.Addr())
		}
		if !overlaps {
			out = append(out, p.String())
			return
		}
		lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
		hi := lo.Addr()
		// The upper half starts at the lower half's address with the
		// new bit set.
		b := hi.AsSlice()
		b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
		hiAddr, _ := netip.AddrFromSlice(b)
		split(lo)
		split(netip.PrefixFrom(hiAddr, p.Bits()+1))
	}
	split(p.Masked())
	return out
}
