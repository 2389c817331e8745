package demo

import (
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	"sluice/flow"
)

// recentKept is how many recent correlated records the view shows.
const recentKept = 6

// stats is what the demo's collector received from the aggregator.
type stats struct {
	mu sync.Mutex
	// aggregate: the records are Aggregate mode's, and the recent ones
	// shown are the correlated ones.
	aggregate     bool
	start         time.Time
	out           uint64
	bothPods      uint64
	correlated    uint64
	passedThrough uint64
	talkers       map[[2]string]uint64
	recent        []string
	// denied counts the records of denied connections; recentDenied are
	// the latest; egress the records that left through each Egress.
	denied       uint64
	recentDenied []string
	egress       map[string]*EgressFigures
}

// EgressFigures are the records that name one Egress.
type EgressFigures struct {
	Name, IP, Node string
	Records        uint64
}

func newStats(start time.Time, aggregate bool) *stats {
	return &stats{start: start, aggregate: aggregate, talkers: map[[2]string]uint64{}, egress: map[string]*EgressFigures{}}
}

// add counts one record; bothNodes says both Nodes reported it.
func (s *stats) add(f *flow.Flow, bothNodes bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.out++
	if len(f.Unknown) > 0 {
		s.passedThrough++
	}
	src := endpoint(f.SourcePodNamespace, f.SourcePodName, f.SourceIP)
	dst := endpoint(f.DestinationPodNamespace, f.DestinationPodName, f.DestinationIP)
	s.talkers[[2]string{src, dst}] += f.Stats.OctetDeltaCount + f.ReverseStats.OctetDeltaCount
	if f.EgressName != "" {
		e := s.egress[f.EgressName]
		if e == nil {
			e = &EgressFigures{Name: f.EgressName, Node: f.EgressNodeName}
			if f.EgressIP.IsValid() {
				e.IP = f.EgressIP.String()
			}
			s.egress[f.EgressName] = e
		}
		e.Records++
	}
	if by, ok := deniedBy(f); ok {
		s.denied++
		line := fmt.Sprintf("%s %s → %s %s: %s", f.EndTime.Local().Format("15:04:05"), src, dst, protoPort(f), by)
		s.recentDenied = keepRecent(s.recentDenied, line)
		return
	}
	if f.SourcePodName == "" || f.DestinationPodName == "" {
		return
	}
	s.bothPods++
	if f.FlowType != flow.FlowTypeInterNode {
		return
	}
	if s.aggregate {
		if !bothNodes {
			return
		}
		s.correlated++
	}
	line := fmt.Sprintf("%s %s (%s) → %s (%s) %s",
		f.EndTime.Local().Format("15:04:05"), src, f.SourceNodeName, dst, f.DestinationNodeName, protoPort(f))
	if f.DestinationServicePortName != "" {
		line += " via " + f.DestinationServicePortName
	}
	if f.EgressName != "" {
		line += " via Egress " + f.EgressName
	}
	s.recent = keepRecent(s.recent, line)
}

func keepRecent(lines []string, line string) []string {
	if len(lines) == recentKept {
		copy(lines, lines[1:])
		lines = lines[:recentKept-1]
	}
	return append(lines, line)
}

// deniedBy says which policy rule denied a record's connection, if one
// did: "Drop by K8sNetworkPolicy default/db-deny-all (ingress)".
func deniedBy(f *flow.Flow) (string, bool) {
	for _, d := range []struct {
		p   *flow.Policy
		dir string
	}{{&f.Egress, "egress"}, {&f.Ingress, "ingress"}} {
		var action string
		switch d.p.RuleAction {
		case flow.ActionDrop:
			action = "Drop"
		case flow.ActionReject:
			action = "Reject"
		default:
			continue
		}
		name := d.p.Name
		if d.p.Namespace != "" {
			name = d.p.Namespace + "/" + name
		}
		if d.p.RuleName != "" {
			name += " rule " + d.p.RuleName
		}
		return fmt.Sprintf("%s by %s (%s)", action, name, d.dir), true
	}
	return "", false
}

func endpoint(ns, pod string, ip netip.Addr) string {
	if pod != "" {
		return ns + "/" + pod
	}
	return ip.String()
}

func protoPort(f *flow.Flow) string {
	p := fmt.Sprintf("proto %d", f.Protocol)
	switch f.Protocol {
	case 6:
		p = "tcp"
	case 17:
		p = "udp"
	}
	return fmt.Sprintf("%s/%d", p, f.DestinationPort)
}

// statsView is a copy of the figures, for one frame of the view.
type statsView struct {
	out, bothPods, correlated, passedThrough uint64
	top                                      []Talker
	recent                                   []string
	denied                                   uint64
	recentDenied                             []string
	egress                                   []EgressFigures
}

func (s *stats) view(now time.Time, topN int) statsView {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := statsView{out: s.out, bothPods: s.bothPods, correlated: s.correlated, passedThrough: s.passedThrough,
		recent: append([]string(nil), s.recent...), denied: s.denied, recentDenied: append([]string(nil), s.recentDenied...)}
	for _, e := range s.egress {
		v.egress = append(v.egress, *e)
	}
	sort.Slice(v.egress, func(i, j int) bool { return v.egress[i].Name < v.egress[j].Name })
	secs := max(now.Sub(s.start).Seconds(), 1)
	for k, octets := range s.talkers {
		if octets > 0 {
			v.top = append(v.top, Talker{From: k[0], To: k[1], Octets: octets, BitsPerSecond: float64(octets) * 8 / secs})
		}
	}
	sort.Slice(v.top, func(i, j int) bool {
		if v.top[i].Octets != v.top[j].Octets {
			return v.top[i].Octets > v.top[j].Octets
		}
		return v.top[i].From+v.top[i].To < v.top[j].From+v.top[j].To
	})
	if len(v.top) > topN {
		v.top = v.top[:topN]
	}
	return v
}
