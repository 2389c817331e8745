package recommend

import (
	"fmt"

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
			q.IPBlock = &crd.IPBlock{CIDR: p.IPBlock.CIDR}
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
