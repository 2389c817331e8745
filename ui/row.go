package ui

import (
	"encoding/json"
	"net/netip"
	"strings"
	"time"

	"sluice/flow"
)

// Row is one flow record as the Flows page shows it: the columns of its
// table, named for the page. Every value is taken from the record, but
// the workloads: from the Pods' controllers when the cluster's metadata
// knows them (the Kind fields say which), else guessed (see workload).
type Row struct {
	Seq    uint64 `json:"seq"`
	Time   int64  `json:"t"` // end time, Unix milliseconds
	Start  int64  `json:"start"`
	SrcNS  string `json:"srcNs,omitempty"`
	SrcPod string `json:"srcPod,omitempty"`
	SrcWL  string `json:"srcWl,omitempty"`
	// SrcWLKind is the kind of the source Pod's controller (Deployment,
	// StatefulSet, DaemonSet, Job...); "" when SrcWL is a guess.
	SrcWLKind string `json:"srcWlKind,omitempty"`
	SrcNode   string `json:"srcNode,omitempty"`
	SrcIP     string `json:"srcIp"`
	SrcPort   uint16 `json:"srcPort"`
	DstNS     string `json:"dstNs,omitempty"`
	DstPod    string `json:"dstPod,omitempty"`
	DstWL     string `json:"dstWl,omitempty"`
	// DstWLKind is SrcWLKind of the destination Pod.
	DstWLKind string `json:"dstWlKind,omitempty"`
	DstNode   string `json:"dstNode,omitempty"`
	DstIP     string `json:"dstIp"`
	DstPort   uint16 `json:"dstPort"`
	Service   string `json:"svc,omitempty"`
	Proto     string `json:"proto"`
	Bytes     uint64 `json:"bytes"`
	Delta     uint64 `json:"delta"`
	BPS       uint64 `json:"bps"` // bits per second over the record's life
	Policy    string `json:"policy,omitempty"`
	Action    string `json:"action,omitempty"`
	Egress    string `json:"egress,omitempty"`
	EgressIP  string `json:"egressIp,omitempty"`
	EgressN   string `json:"egressNode,omitempty"`
	FlowType  string `json:"type,omitempty"`
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// policyText names a rule: "ns/name rule" (cluster policies have no
// namespace).
func policyText(p flow.Policy) string {
	if p.Name == "" {
		return ""
	}
	s := p.Name
	if p.Namespace != "" {
		s = p.Namespace + "/" + s
	}
	if p.RuleName != "" {
		s += " " + p.RuleName
	}
	return s
}

// PodWorkload names the workload of the Pod ns/pod that held ip at time
// at: its controller's kind and name (a Deployment for a Deployment's
// ReplicaSet); ok is false when that is not known.
type PodWorkload func(ns, pod string, ip netip.Addr, at time.Time) (kind, name string, ok bool)

// workloads names the Pods' workloads: from known (the cluster's Pod
// metadata) when it knows them, else guessed from labels and names,
// guesses cached by Pod and labels (the same Pods come back record after
// record, and reading their labels is the costly part of a row; the
// cache is bounded: emptied when full). Known ones are not cached: the
// Pod's metadata may arrive after its first records.
type workloads struct {
	known   PodWorkload
	guessed map[podLabels]string
	// texts are the tap's other strings of rows, made once: the same
	// addresses and rules recur record after record (bounded alike).
	addrs    map[netip.Addr]string
	policies map[flow.Policy]string
}

// podLabels keys a guess: no string is built to look one up.
type podLabels struct{ pod, labels string }

const maxWorkloads = 4096

// addr is addrString(a), made once while cached.
func (w *workloads) addr(a netip.Addr) string {
	if w == nil || !a.IsValid() {
		return addrString(a)
	}
	if s, ok := w.addrs[a]; ok {
		return s
	}
	if w.addrs == nil || len(w.addrs) >= maxWorkloads {
		w.addrs = map[netip.Addr]string{}
	}
	s := addrString(a)
	w.addrs[a] = s
	return s
}

// policy is policyText(p), made once while cached.
func (w *workloads) policy(p flow.Policy) string {
	if w == nil || p.Name == "" {
		return policyText(p)
	}
	p.Type, p.RuleAction, p.UID = 0, 0, flow.UID{} // not in the text
	if s, ok := w.policies[p]; ok {
		return s
	}
	if w.policies == nil || len(w.policies) >= maxWorkloads {
		w.policies = map[flow.Policy]string{}
	}
	s := policyText(p)
	w.policies[p] = s
	return s
}

func (w *workloads) of(ns, pod, labels string, ip netip.Addr, at time.Time) (kind, name string) {
	if w == nil {
		return "", workload(pod, labels)
	}
	if w.known != nil {
		if kind, name, ok := w.known(ns, pod, ip, at); ok {
			return kind, name
		}
	}
	if w.guessed == nil {
		w.guessed = map[podLabels]string{}
	}
	k := podLabels{pod, labels}
	if v, ok := w.guessed[k]; ok {
		return "", v
	}
	if len(w.guessed) >= maxWorkloads {
		clear(w.guessed)
	}
	v := workload(pod, labels)
	w.guessed[k] = v
	return "", v
}

// newRow makes the page's row of f (wl may be nil).
func newRow(seq uint64, f *flow.Flow, wl *workloads) Row {
	r := Row{
		Seq: seq, Time: unixMilli(f.EndTime), Start: unixMilli(f.StartTime),
		SrcNS: f.SourcePodNamespace, SrcPod: f.SourcePodName, SrcNode: f.SourceNodeName,
		SrcIP: wl.addr(f.SourceIP), SrcPort: f.SourcePort,
		DstNS: f.DestinationPodNamespace, DstPod: f.DestinationPodName, DstNode: f.DestinationNodeName,
		DstIP: wl.addr(f.DestinationIP), DstPort: f.DestinationPort,
		Service: f.DestinationServicePortName, Proto: flow.ProtocolName(f.Protocol),
		Bytes:  f.Stats.OctetTotalCount + f.ReverseStats.OctetTotalCount,
		Delta:  f.Stats.OctetDeltaCount + f.ReverseStats.OctetDeltaCount,
		Egress: f.EgressName, EgressIP: wl.addr(f.EgressIP), EgressN: f.EgressNodeName,
		FlowType: flow.FlowTypeName(f.FlowType),
	}
	if r.SrcPod != "" {
		r.SrcWLKind, r.SrcWL = wl.of(r.SrcNS, r.SrcPod, f.SourcePodLabels, f.SourceIP, f.StartTime)
	}
	if r.DstPod != "" {
		r.DstWLKind, r.DstWL = wl.of(r.DstNS, r.DstPod, f.DestinationPodLabels, f.DestinationIP, f.StartTime)
	}
	if d := f.EndTime.Sub(f.StartTime); d >= time.Second {
		r.BPS = uint64(float64(r.Bytes*8) / d.Seconds())
	} else if r.Bytes > 0 {
		r.BPS = r.Bytes * 8
	}
	// The rule that decided: a drop or reject wins over an allow, the
	// destination's ingress rule over the source's egress rule.
	in, out := f.Ingress, f.Egress
	switch {
	case in.RuleAction >= 2:
		r.Policy, r.Action = wl.policy(in), flow.ActionName(in.RuleAction)
	case out.RuleAction >= 2:
		r.Policy, r.Action = wl.policy(out), flow.ActionName(out.RuleAction)
	case in.Name != "":
		r.Policy, r.Action = wl.policy(in), flow.ActionName(in.RuleAction)
	case out.Name != "":
		r.Policy, r.Action = wl.policy(out), flow.ActionName(out.RuleAction)
	default:
		r.Action = flow.ActionName(max(in.RuleAction, out.RuleAction))
	}
	return r
}

// denied reports whether the row's connection was dropped or rejected.
func (r *Row) denied() bool { return r.Action == "Drop" || r.Action == "Reject" }

// workload guesses the Pod's workload when its controller is not known:
// its app.kubernetes.io/name or app label when it has one; else, with a
// pod-template-hash label (a Deployment's Pod), its name up to
// "-<hash>-"; else its name without the suffixes a ReplicaSet or
// StatefulSet adds (the part after the last dash when it is a number or a
// hash-like token: a guess, which misses random suffixes without a digit).
func workload(pod, labels string) string {
	if labels != "" && labels != "{}" {
		var m map[string]string
		if json.Unmarshal([]byte(labels), &m) == nil {
			for _, k := range []string{"app.kubernetes.io/name", "app"} {
				if v := m[k]; v != "" {
					return v
				}
			}
			if h := m["pod-template-hash"]; h != "" {
				if i := strings.LastIndex(pod, "-"+h+"-"); i > 0 {
					return pod[:i]
				}
			}
		}
	}
	name := pod
	for range 2 {
		i := strings.LastIndexByte(name, '-')
		if i <= 0 || !generated(name[i+1:]) {
			break
		}
		name = name[:i]
	}
	return name
}

// generated reports whether s looks like a suffix a controller adds: all
// digits, or 5 to 10 lower-case letters and digits with a digit in them.
func generated(s string) bool {
	if s == "" {
		return false
	}
	digits, other := 0, 0
	for _, c := range s {
		switch {
		case c >= '0' && c <= '9':
			digits++
		case c >= 'a' && c <= 'z':
			other++
		default:
			return false
		}
	}
	if other == 0 {
		return true
	}
	return digits > 0 && len(s) >= 5 && len(s) <= 10
}
