// Package verify proves candidate policies against observed traffic: it
// replays each distinct observed connection's first packet through the
// datapath model twice, with the cluster as it is and with the candidates
// overlaid (the machinery of `sluice traceflow --with`), and reports the
// connections whose verdict changes, with the rule that decides the new
// one, and the allowed surface that the candidates open beyond what was
// observed.
package verify

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"time"

	"sluice/flow"
	"sluice/policy/observed"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// DefaultMaxSurface bounds the surface entries a report lists.
const DefaultMaxSurface = 1000

// maxSurfaceChecks bounds the model runs spent on the surface, so that a
// broad candidate in a large cluster cannot stall a verification.
const maxSurfaceChecks = 200_000

// Options configures a verification.
type Options struct {
	// Workers replay connections in parallel; GOMAXPROCS if 0.
	Workers int
	// MaxSurface bounds Report.Surface; DefaultMaxSurface if 0.
	MaxSurface int
}

// Flow is one observed connection in a report.
type Flow struct {
	Source      string    `json:"source"`
	Destination string    `json:"destination"`
	Protocol    string    `json:"protocol"`
	Port        uint16    `json:"port,omitempty"`
	Service     string    `json:"service,omitempty"`
	Records     uint64    `json:"records"`
	FirstSeen   time.Time `json:"firstSeen,omitzero"`
	LastSeen    time.Time `json:"lastSeen,omitzero"`
	// Rule is the rule that decides the new verdict: for a newly blocked
	// flow the one that blocks it, for a newly allowed one the one that
	// allows it (empty when no policy applies any more).
	Rule string `json:"rule,omitempty"`

	key observed.Key
}

// Key is the connection's verdict-deciding fields.
func (f *Flow) Key() observed.Key { return f.key }

// Surface is an allowed connection the candidates open that was never
// observed.
type Surface struct {
	Policy    string `json:"policy"`
	Direction string `json:"direction"`
	Rule      int    `json:"rule"`
	// Source and Destination are Pods (ns/name), or a CIDR for an ipBlock
	// peer.
	Source      string `json:"source"`
	Destination string `json:"destination"`
	// Port is "TCP/8080", or "any" for a rule without ports.
	Port string `json:"port"`
}

// Report is the verification's result.
type Report struct {
	// Connections is the number of distinct observed connections, Records
	// the records they came from.
	Connections int    `json:"connections"`
	Records     uint64 `json:"records"`
	// NewlyBlocked are observed allowed connections the candidates block.
	NewlyBlocked []Flow `json:"newlyBlocked"`
	// NewlyAllowed are connections denied now that the candidates allow.
	NewlyAllowed []Flow `json:"newlyAllowed"`
	// Unchanged counts connections whose verdict stays the same.
	Unchanged int `json:"unchanged"`
	// NotModelled counts connections neither of whose ends is a Pod of
	// the state; Errors those the model failed to replay.
	NotModelled int `json:"notModelled"`
	Errors      int `json:"errors"`
	// Surface is the allowed surface never observed; SurfaceTotal counts
	// all of it when Surface was cut short.
	Surface      []Surface `json:"unobservedSurface"`
	SurfaceTotal int       `json:"unobservedSurfaceTotal"`
	// SurfaceNote says what the surface leaves out, if anything.
	SurfaceNote string `json:"unobservedSurfaceNote,omitempty"`
}

// Blocks says an observed allowed connection would be blocked.
func (r *Report) Blocks() bool { return len(r.NewlyBlocked) > 0 }

type outcome struct {
	before, after *tracer.Verdict
	err           error
}

// Verify replays conns through before (the cluster as it is) and after
// (with the candidates overlaid); both must carry a Traceflow tag.
// candidates are the overlaid objects, for the surface.
func Verify(ctx context.Context, before, after *pipeline.Model, candidates []cluster.Object, conns []*observed.Conn, o Options) (*Report, error) {
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.MaxSurface <= 0 {
		o.MaxSurface = DefaultMaxSurface
	}
	out := make([]outcome, len(conns))
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range o.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(conns) || ctx.Err() != nil {
					return
				}
				c := conns[i]
				tc := tracer.Connection{Src: c.Src, Dst: c.Dst, Proto: c.Proto, SrcPort: c.SrcPort, DstPort: c.DstPort}
				b, err := tracer.Decide(ctx, before, tc)
				if err != nil {
					out[i].err = err
					continue
				}
				a, err := tracer.Decide(ctx, after, tc)
				out[i] = outcome{before: b, after: a, err: err}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &Report{Connections: len(conns), NewlyBlocked: []Flow{}, NewlyAllowed: []Flow{}, Surface: []Surface{}}
	seen := map[observed.Key]bool{}
	for i, c := range conns {
		r.Records += c.Records()
		oc := out[i]
		switch {
		case errors.Is(oc.err, tracer.ErrNotModelled):
			r.NotModelled++
			continue
		case oc.err != nil:
			r.Errors++
			continue
		}
		if !oc.after.Denied {
			seen[c.Key] = true
		}
		switch {
		case !oc.before.Denied && oc.after.Denied && c.Allowed > 0:
			f := flowOf(c)
			f.Rule = deciding(oc.after, true)
			r.NewlyBlocked = append(r.NewlyBlocked, f)
		case oc.before.Denied && !oc.after.Denied:
			f := flowOf(c)
			f.Rule = deciding(oc.after, false)
			r.NewlyAllowed = append(r.NewlyAllowed, f)
		default:
			r.Unchanged++
		}
	}
	if err := surface(ctx, after, candidates, seen, o, r); err != nil {
		return nil, err
	}
	return r, nil
}

func flowOf(c *observed.Conn) Flow {
	f := Flow{Source: end(c.SrcNamespace, c.SrcPod, c.Src), Destination: end(c.DstNamespace, c.DstPod, c.Dst),
		Protocol: flow.ProtocolName(c.Proto), Port: c.DstPort, Service: c.ServicePortName, Records: c.Records(),
		FirstSeen: c.First, LastSeen: c.Last, key: c.Key}
	return f
}

func end(ns, pod string, ip netip.Addr) string {
	if pod == "" {
		return ip.String()
	}
	return ns + "/" + pod
}

// deciding names the rule that decided v: the denying one when denied,
// else the allowing ones.
func deciding(v *tracer.Verdict, denied bool) string {
	var s string
	for _, d := range []struct {
		dir string
		d   *tracer.Decision
	}{{"egress", v.Egress}, {"ingress", v.Ingress}} {
		if d.d == nil {
			continue
		}
		deny := d.d.Isolation || d.d.Rule.Action == crd.RuleActionDrop || d.d.Rule.Action == crd.RuleActionReject
		if deny != denied {
			continue
		}
		if s != "" {
			s += "; "
		}
		s += d.dir + " " + RuleText(d.d)
	}
	return s
}

// RuleText names a decision's rule as a person reads it.
func RuleText(d *tracer.Decision) string {
	r := d.Rule
	switch {
	case d.Isolation && r.Name != "":
		return fmt.Sprintf("%s: isolated, no rule allows it (on %s)", r.PolicyString(), d.Node)
	case d.Isolation:
		return fmt.Sprintf("isolated by a NetworkPolicy, no rule allows it (on %s)", d.Node)
	case r.Name == "":
		return fmt.Sprintf("%s (on %s)", r.Action, d.Node)
	case r.Rule == "":
		return fmt.Sprintf("%s: %s (on %s)", r.PolicyString(), r.Action, d.Node)
	}
	return fmt.Sprintf("%s rule %q: %s (on %s)", r.PolicyString(), r.Rule, r.Action, d.Node)
}
