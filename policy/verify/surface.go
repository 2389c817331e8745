package verify

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"sluice/policy/observed"
	"sluice/traceflow/cluster"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// surface lists, for each candidate Kubernetes NetworkPolicy rule, the
// Pod-to-Pod connections (and ipBlock peers) it allows that were not
// observed. A concrete port is checked with the model (another policy, an
// Antrea-native drop in an earlier tier say, may still deny it); a rule
// without ports, a port range and an ipBlock are listed as written.
func surface(ctx context.Context, m *pipeline.Model, candidates []cluster.Object, seen map[observed.Key]bool, o Options, r *Report) error {
	st := m.State
	seenPair := map[[2]netip.Addr]bool{}
	for k := range seen {
		seenPair[[2]netip.Addr{k.Src, k.Dst}] = true
	}
	checks := 0
	var skipped []string
	add := func(s Surface) {
		r.SurfaceTotal++
		if len(r.Surface) < o.MaxSurface {
			r.Surface = append(r.Surface, s)
		}
	}
	for _, obj := range candidates {
		if obj.Kind != "NetworkPolicy" || !strings.HasPrefix(obj.APIVersion, "networking.k8s.io/") {
			skipped = append(skipped, obj.Describe())
			continue
		}
		var np networkingv1.NetworkPolicy
		if err := json.Unmarshal(obj.Raw, &np); err != nil {
			return fmt.Errorf("%s: %w", obj.Describe(), err)
		}
		name := np.Namespace + "/" + np.Name
		targets, err := st.SelectPods(&np.Spec.PodSelector, nil, np.Namespace)
		if err != nil {
			return fmt.Errorf("%s: %w", obj.Describe(), err)
		}
		type ruleSpec struct {
			dir   string
			peers []networkingv1.NetworkPolicyPeer
			ports []networkingv1.NetworkPolicyPort
		}
		var rules []ruleSpec
		for _, in := range np.Spec.Ingress {
			rules = append(rules, ruleSpec{"ingress", in.From, in.Ports})
		}
		for _, out := range np.Spec.Egress {
			rules = append(rules, ruleSpec{"egress", out.To, out.Ports})
		}
		idx := map[string]int{}
		for _, rs := range rules {
			i := idx[rs.dir]
			idx[rs.dir]++
			if err := ctx.Err(); err != nil {
				return err
			}
			var peerPods []*cluster.Pod
			var blocks []block
			if len(rs.peers) == 0 {
				blocks = append(blocks, block{text: "any"})
			}
			for _, p := range rs.peers {
				if p.IPBlock != nil {
					b := block{text: p.IPBlock.CIDR}
					if len(p.IPBlock.Except) > 0 {
						b.text += " except " + strings.Join(p.IPBlock.Except, ",")
					} else if pf, err := netip.ParsePrefix(p.IPBlock.CIDR); err == nil && pf.IsSingleIP() {
						b.single = pf.Addr()
					}
					blocks = append(blocks, b)
					continue
				}
				ns := np.Namespace
				if p.NamespaceSelector != nil {
					ns = ""
				}
				pods, err := st.SelectPods(p.PodSelector, p.NamespaceSelector, ns)
				if err != nil {
					return fmt.Errorf("%s: %w", obj.Describe(), err)
				}
				peerPods = append(peerPods, pods...)
			}
			for _, t := range targets {
				for _, b := range blocks {
					for j, pt := range portTexts(rs.ports) {
						if b.observed(seen, firstIP(t), rs.dir == "egress", rs.ports, j) {
							continue
						}
						s := Surface{Policy: name, Direction: rs.dir, Rule: i, Source: b.text, Destination: t.Key(), Port: pt}
						if rs.dir == "egress" {
							s.Source, s.Destination = t.Key(), b.text
						}
						add(s)
					}
				}
				for _, p := range peerPods {
					if p == t {
						continue
					}
					src, dst := p, t
					if rs.dir == "egress" {
						src, dst = t, p
					}
					sip, dip := firstIP(src), firstIP(dst)
					if !sip.IsValid() || !dip.IsValid() {
						continue
					}
					if len(rs.ports) == 0 {
						if !seenPair[[2]netip.Addr{sip, dip}] {
							add(Surface{Policy: name, Direction: rs.dir, Rule: i, Source: src.Key(), Destination: dst.Key(), Port: "any"})
						}
						continue
					}
					for _, pp := range rs.ports {
						proto := corev1.ProtocolTCP
						if pp.Protocol != nil {
							proto = *pp.Protocol
						}
						port, ok := concretePort(pp, dst, proto)
						if !ok {
							for _, pt := range portTexts([]networkingv1.NetworkPolicyPort{pp}) {
								add(Surface{Policy: name, Direction: rs.dir, Rule: i, Source: src.Key(), Destination: dst.Key(), Port: pt})
							}
							continue
						}
						if port == 0 {
							continue // a named port this Pod does not have
						}
						pn := protoNumber(proto)
						if seen[observed.Key{Src: sip, Dst: dip, Proto: pn, DstPort: port}] {
							continue
						}
						if checks >= maxSurfaceChecks {
							r.SurfaceNote = fmt.Sprintf("stopped after %d model runs: the surface is larger than listed", maxSurfaceChecks)
							return nil
						}
						checks++
						v, err := tracer.Decide(ctx, m, tracer.Connection{Src: sip, Dst: dip, Proto: pn, SrcPort: 40000, DstPort: port})
						if err != nil || v.Denied {
							continue
						}
						add(Surface{Policy: name, Direction: rs.dir, Rule: i, Source: src.Key(), Destination: dst.Key(),
							Port: fmt.Sprintf("%s/%d", proto, port)})
					}
				}
			}
		}
	}
	if len(skipped) > 0 {
		r.SurfaceNote = "the surface covers Kubernetes NetworkPolicies only, not " + strings.Join(skipped, ", ")
	}
	return nil
}

func firstIP(p *cluster.Pod) netip.Addr {
	if len(p.IPs) == 0 {
		return netip.Addr{}
	}
	return p.IPs[0]
}

// concretePort resolves a rule port to one number on the serving Pod dst:
// ok is false for a whole protocol or a range; the port is 0 for a name
// dst does not have.
func concretePort(pp networkingv1.NetworkPolicyPort, dst *cluster.Pod, proto corev1.Protocol) (uint16, bool) {
	if pp.Port == nil || (pp.EndPort != nil && *pp.EndPort != pp.Port.IntVal) {
		return 0, false
	}
	if pp.Port.StrVal != "" {
		n, _ := dst.NamedPort(pp.Port.StrVal, proto)
		return n, true
	}
	return uint16(pp.Port.IntVal), true
}

func portTexts(ports []networkingv1.NetworkPolicyPort) []string {
	if len(ports) == 0 {
		return []string{"any"}
	}
	var out []string
	for _, pp := range ports {
		proto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			proto = *pp.Protocol
		}
		switch {
		case pp.Port == nil:
			out = append(out, string(proto)+"/any")
		case pp.EndPort != nil:
			out = append(out, fmt.Sprintf("%s/%s-%d", proto, pp.Port.String(), *pp.EndPort))
		default:
			out = append(out, fmt.Sprintf("%s/%s", proto, pp.Port.String()))
		}
	}
	return out
}

func protoNumber(p corev1.Protocol) uint8 {
	switch p {
	case corev1.ProtocolUDP:
		return 17
	case corev1.ProtocolSCTP:
		return 132
	}
	return 6
}

// block is an ipBlock peer (or "any"); single is its address when it
// holds exactly one.
type block struct {
	text   string
	single netip.Addr
}

// observed says the connection between the rule's Pod self and the
// block's one address on ports[j] (a number) was observed allowed: it is
// no surface.
func (b block) observed(seen map[observed.Key]bool, self netip.Addr, egress bool, ports []networkingv1.NetworkPolicyPort, j int) bool {
	if !b.single.IsValid() || !self.IsValid() || j >= len(ports) {
		return false
	}
	pp := ports[j]
	if pp.Port == nil || pp.Port.StrVal != "" || (pp.EndPort != nil && *pp.EndPort != pp.Port.IntVal) {
		return false
	}
	proto := corev1.ProtocolTCP
	if pp.Protocol != nil {
		proto = *pp.Protocol
	}
	k := observed.Key{Src: b.single, Dst: self, Proto: protoNumber(proto), DstPort: uint16(pp.Port.IntVal)}
	if egress {
		k.Src, k.Dst = self, b.single
	}
	return seen[k]
}
