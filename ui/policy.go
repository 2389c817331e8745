package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sort"
	"time"

	"sluice/policy/flowsrc"
	"sluice/policy/observed"
	"sluice/policy/recommend"
	"sluice/policy/verify"
	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
)

// PolicyRequest is POST /api/policy/recommend and /api/policy/verify: the
// Policies page's namespace, time window and, to verify, the edited
// policies.
type PolicyRequest struct {
	// Namespace limits the recommendation (and the verified connections)
	// to one namespace; "" is every namespace.
	Namespace string `json:"namespace"`
	// Window is how far back records are read (a Go duration, "1h"); ""
	// reads every record the UI holds.
	Window string `json:"window"`
	// Isolation is ingress, egress or both (recommend only).
	Isolation string `json:"isolation,omitempty"`
	// YAML is the candidate policies (verify only).
	YAML string `json:"yaml,omitempty"`
}

// PolicyResult is the answer: the policies (recommended, or as sent) and
// their verification against the same records.
type PolicyResult struct {
	YAML    string         `json:"yaml"`
	Report  *verify.Report `json:"report"`
	Records uint64         `json:"records"`
	// Carried is how many connections the recommendation allows (recommend
	// only).
	Carried int `json:"carried,omitempty"`
}

// policyFlows folds the records the history holds that ended within
// window (all of them when 0) and touch namespace ns ("" any).
func (s *Server) policyFlows(window time.Duration, ns string) *observed.Set {
	set := observed.NewSet(0)
	var since time.Time
	if window > 0 {
		since = time.Now().Add(-window)
	}
	var r flowsrc.Record
	h := s.hist
	h.mu.Lock()
	defer h.mu.Unlock()
	for seq := h.oldest(); seq < h.next; seq++ {
		f := h.items[seq%uint64(len(h.items))].f
		if f == nil || (!since.IsZero() && f.EndTime.Before(since)) {
			continue
		}
		if ns != "" && f.SourcePodNamespace != ns && f.DestinationPodNamespace != ns {
			continue
		}
		flowsrc.FromFlow(f, &r)
		set.Add(&r)
	}
	return set
}

// Policies recommends (req.YAML empty) or takes req.YAML, and verifies
// the policies against set over objs, as `sluice policy recommend` and
// `sluice policy verify` do. An error wrapping ErrInvalid is the
// request's fault.
func Policies(ctx context.Context, objs []cluster.Object, settings modelrun.Settings, set *observed.Set, req PolicyRequest) (*PolicyResult, error) {
	cfg, err := settings.Config(crd.FirstTraceflowTag)
	if err != nil {
		return nil, err
	}
	before, _, err := modelrun.Model(ctx, objs, cfg)
	if err != nil {
		return nil, invalid(err)
	}
	conns := set.Conns()
	res := &PolicyResult{Records: set.Records}
	if req.YAML == "" {
		o := recommend.Options{Isolation: req.Isolation}
		if req.Namespace != "" {
			o.Namespaces = []string{req.Namespace}
		}
		rec, err := recommend.Recommend(ctx, before, objs, conns, o)
		if err != nil {
			return nil, invalid(err)
		}
		var b bytes.Buffer
		if err := rec.WriteYAML(&b); err != nil {
			return nil, err
		}
		res.YAML, res.Carried = b.String(), rec.Carried
	} else {
		res.YAML = req.YAML
	}
	cands, err := cluster.ParseObjects([]byte(res.YAML), "policies")
	if err != nil {
		return nil, invalid(err)
	}
	cands = cluster.Overlay(nil, cands)
	after, _, err := modelrun.Model(ctx, cluster.Overlay(objs, cands), cfg)
	if err != nil {
		return nil, invalid(fmt.Errorf("with the policies: %w", err))
	}
	if res.Report, err = verify.Verify(ctx, before, after, cands, conns, verify.Options{}); err != nil {
		return nil, err
	}
	return res, nil
}

func (s *Server) policyRecommend(w http.ResponseWriter, r *http.Request) { s.policy(w, r, false) }

func (s *Server) policyVerify(w http.ResponseWriter, r *http.Request) { s.policy(w, r, true) }

func (s *Server) policy(w http.ResponseWriter, r *http.Request, verifyOnly bool) {
	if s.o.Cluster == nil {
		writeError(w, http.StatusServiceUnavailable, "no cluster state to model policies on: the aggregator has no Kubernetes access (sluice.kubeconfig) here")
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send the request as application/json")
		return
	}
	var req PolicyRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxTraceBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "request: "+err.Error())
		return
	}
	var window time.Duration
	if req.Window != "" {
		d, err := time.ParseDuration(req.Window)
		if err != nil || d < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("window %q: not a duration", req.Window))
			return
		}
		window = d
	}
	if verifyOnly && req.YAML == "" {
		writeError(w, http.StatusBadRequest, "no policies to verify")
		return
	}
	if !verifyOnly {
		req.YAML = ""
	}
	// Like a trace, this builds models of the whole cluster: it shares the
	// traces' limit.
	select {
	case s.traces <- struct{}{}:
		defer func() { <-s.traces }()
	default:
		writeError(w, http.StatusTooManyRequests, "two traces or verifications are running already; try again")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), traceTimeout)
	defer cancel()
	objs, err := s.o.Cluster(ctx)
	if err != nil {
		writeError(w, http.StatusBadGateway, "reading the cluster state: "+err.Error())
		return
	}
	res, err := Policies(ctx, objs, s.o.Settings, s.policyFlows(window, req.Namespace), req)
	switch {
	case errors.Is(err, ErrInvalid):
		writeError(w, http.StatusUnprocessableEntity, err.Error())
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

// policyNamespaces lists the cluster's namespaces for the page's choice.
func (s *Server) policyNamespaces(w http.ResponseWriter, r *http.Request) {
	out := []string{}
	if s.o.Cluster != nil {
		ctx, cancel := context.WithTimeout(r.Context(), traceTimeout)
		defer cancel()
		objs, err := s.o.Cluster(ctx)
		if err != nil {
			writeError(w, http.StatusBadGateway, "reading the cluster state: "+err.Error())
			return
		}
		st, _ := cluster.Build(objs)
		if st != nil {
			for ns := range st.Namespaces {
				out = append(out, ns)
			}
		}
	}
	sort.Strings(out)
	writeJSON(w, http.StatusOK, out)
}
