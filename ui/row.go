package ui

import (
	"encoding/json"
	"net/netip"
	"strings"
	"time"

	"sluice/flow"
)

// Row is one flow record as the Flows page shows it: the columns of its
// table, named for the page. Every value is taken from the record;
// nothing is guessed except Workload (see workload).
type Row struct {
	Seq      uint64 `json:"seq"`
	Time     int64  `json:"t"` // end time, Unix milliseconds
	Start    int64  `json:"start"`
	SrcNS    string `json:"srcNs,omitempty"`
	SrcPod   string `json:"srcPod,omitempty"`
	SrcWL    string `json:"srcWl,omitempty"`
	SrcNode  string `json:"srcNode,omitempty"`
	SrcIP    string `json:"srcIp"`
	SrcPort  uint16 `json:"srcPort"`
	DstNS    string `json:"dstNs,omitempty"`
	DstPod   string `json:"dstPod,omitempty"`
	DstWL    string `json:"dstWl,omitempty"`
	DstNode  string `json:"dstNode,omitempty"`
	DstIP    string `json:"dstIp"`
	DstPort  uint16 `json:"dstPort"`
	Service  string `json:"svc,omitempty"`
	Proto    string `json:"proto"`
	Bytes    uint64 `json:"bytes"`
	Delta    uint64 `json:"delta"`
	BPS      uint64 `json:"bps"` // bits per second over the record's life
	Policy   string `json:"policy,omitempty"`
	Action   string `json:"action,omitempty"`
	Egress   string `json:"egress,omitempty"`
	EgressIP string `json:"egressIp,omitempty"`
	EgressN  string `json:"egressNode,omitempty"`
	FlowType string `json:"type,omitempty"`
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

// workloads caches workload names by Pod and labels: the same Pods come
// back record after record, and reading their labels is the costly part
// of a row. Bounded: emptied when full.
type workloads map[string]string

const maxWorkloads = 4096

func (w workloads) of(pod, labels string) string {
	if w == nil {
		return workload(pod, labels)
	}
	k := pod + "\x00" + labels
	if v, ok := w[k]; ok {
		return v
	}
	if len(w) >= maxWorkloads {
		clear(w)
	}
	v := workload(pod, labels)
	w[k] = v
	return v
}

// newRow makes the page's row of f (wl may be nil).
func newRow(seq uint64, f *flow.Flow, wl workloads) Row {
	r := Row{
		Seq: seq, Time: unixMilli(f.EndTime), Start: unixMilli(f.StartTime),
		SrcNS: f.SourcePodNamespace, SrcPod: f.SourcePodName, SrcNode: f.SourceNodeName,
		SrcIP: addrString(f.SourceIP), SrcPort: f.SourcePort,
		DstNS: f.DestinationPodNamespace, DstPod: f.DestinationPodName, DstNode: f.DestinationNodeName,
		DstIP: addrString(f.DestinationIP), DstPort: f.DestinationPort,
		Service: f.DestinationServicePortName, Proto: flow.ProtocolName(f.Protocol),
		Bytes:  f.Stats.OctetTotalCount + f.ReverseStats.OctetTotalCount,
		Delta:  f.Stats.OctetDeltaCount + f.ReverseStats.OctetDeltaCount,
		Egress: f.EgressName, EgressIP: addrString(f.EgressIP), EgressN: f.EgressNodeName,
		FlowType: flow.FlowTypeName(f.FlowType),
	}
	if r.SrcPod != "" {
		r.SrcWL = wl.of(r.SrcPod, f.SourcePodLabels)
	}
	if r.DstPod != "" {
		r.DstWL = wl.of(r.DstPod, f.DestinationPodLabels)
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
		r.Policy, r.Action = policyText(in), flow.ActionName(in.RuleAction)
	case out.RuleAction >= 2:
		r.Policy, r.Action = policyText(out), flow.ActionName(out.RuleAction)
	case in.Name != "":
		r.Policy, r.Action = policyText(in), flow.ActionName(in.RuleAction)
	case out.Name != "":
		r.Policy, r.Action = policyText(out), flow.ActionName(out.RuleAction)
	default:
		r.Action = flow.ActionName(max(in.RuleAction, out.RuleAction))
	}
	return r
}

// denied reports whether the row's connection was dropped or rejected.
func (r *Row) denied() bool { return r.Action == "Drop" || r.Action == "Reject" }

// workload names the Pod's workload: its app.kubernetes.io/name or app
// label when it has one, else its name without the suffixes a
// ReplicaSet or StatefulSet adds (the part after the last dash when it
// is a number or a hash-like token).
func workload(pod, labels string) string {
	if labels != "" && labels != "{}" {
		var m map[string]string
		if json.Unmarshal([]byte(labels), &m) == nil {
			for _, k := range []string{"app.kubernetes.io/name", "app"} {
				if v := m[k]; v != "" {
					return v
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
