package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"sort"
	"time"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/modelrun"
	"sluice/traceflow/render"
	"sluice/traceflow/tracer"
)

// TraceRequest is POST /api/traceflow: what `sluice traceflow -S -D -f
// --with` takes.
type TraceRequest struct {
	// Source is ns/pod or pod (-S).
	Source string `json:"source"`
	// Destination is ns/pod, ns/service, pod, service or an IP (-D).
	Destination string `json:"destination"`
	// Flow describes the packet (-f), e.g. "tcp,tcp_dst=80"; empty is an
	// ICMP echo request.
	Flow string `json:"flow"`
	// With is a what-if manifest (YAML or JSON objects) overlaid on the
	// cluster's state before tracing (--with).
	With string `json:"with,omitempty"`
}

// TraceResult is the answer: antctl's summary (as `sluice traceflow -o
// json` prints it) and, in YAML, exactly what `sluice traceflow` prints.
type TraceResult struct {
	Summary render.Summary `json:"summary"`
	YAML    string         `json:"yaml"`
	// Warnings are the cluster state's problems that did not stop the
	// trace (the command prints them on stderr).
	Warnings []string `json:"warnings,omitempty"`
}

// maxTraceBody bounds a request (the manifest is most of it).
const maxTraceBody = 1 << 20

// traceTimeout bounds one trace, reading the state included.
const traceTimeout = time.Minute

// Trace runs req against objs with settings, as `sluice traceflow` does:
// the manifest overlaid, the model built with the first Traceflow tag,
// the Traceflow antctl would create, the trace, and the summary rendered
// in YAML. An error wrapping ErrInvalid is the request's fault.
func Trace(ctx context.Context, objs []cluster.Object, settings modelrun.Settings, req TraceRequest) (*TraceResult, error) {
	if req.Source == "" || req.Destination == "" {
		return nil, invalid(errors.New("please provide a source Pod and a destination"))
	}
	if req.With != "" {
		top, err := cluster.ParseObjects([]byte(req.With), "what-if manifest")
		if err != nil {
			return nil, invalid(err)
		}
		objs = cluster.Overlay(objs, cluster.Overlay(nil, top))
	}
	cfg, err := settings.Config(crd.FirstTraceflowTag)
	if err != nil {
		return nil, err
	}
	m, probs, err := modelrun.Model(ctx, objs, cfg)
	if err != nil {
		return nil, invalid(err)
	}
	tf, err := modelrun.NewTraceflow(m.State, req.Source, req.Destination, req.Flow)
	if err != nil {
		return nil, invalid(err)
	}
	tr, err := tracer.Run(ctx, m, tf, tracer.Options{})
	var ae *tracer.AdmissionError
	var ue *tracer.UntraceableError
	if errors.As(err, &ae) || errors.As(err, &ue) {
		return nil, invalid(err)
	}
	if err != nil {
		return nil, err
	}
	res := &TraceResult{Summary: render.Summarize(tr.Traceflow)}
	var buf bytes.Buffer
	if err := render.YAML(&buf, res.Summary); err != nil {
		return nil, err
	}
	res.YAML = buf.String()
	for _, p := range probs {
		res.Warnings = append(res.Warnings, p.String())
	}
	return res, nil
}

// ErrInvalid marks a request that cannot be traced as it is.
var ErrInvalid = errors.New("invalid request")

type invalidError struct{ err error }

func (e invalidError) Error() string { return e.err.Error() }
func (e invalidError) Unwrap() []error {
	return []error{e.err, ErrInvalid}
}

func invalid(err error) error { return invalidError{err} }

func (s *Server) traceflow(w http.ResponseWriter, r *http.Request) {
	if s.o.Cluster == nil {
		s.m.Traces.WithLabelValues("unavailable").Inc()
		writeError(w, http.StatusServiceUnavailable, "no cluster state to trace on: the aggregator has no Kubernetes access (sluice.kubeconfig) here")
		return
	}
	// JSON only: a form another site posts (text/plain, no preflight)
	// cannot start traces.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		s.m.Traces.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusUnsupportedMediaType, "send the request as application/json")
		return
	}
	var req TraceRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxTraceBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.m.Traces.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusBadRequest, "request: "+err.Error())
		return
	}
	// A trace builds a model of the whole cluster: two at a time at most.
	select {
	case s.traces <- struct{}{}:
		defer func() { <-s.traces }()
	default:
		s.m.Traces.WithLabelValues("busy").Inc()
		writeError(w, http.StatusTooManyRequests, "two traces are running already; try again")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), traceTimeout)
	defer cancel()
	objs, err := s.o.Cluster(ctx)
	if err != nil {
		s.m.Traces.WithLabelValues("error").Inc()
		writeError(w, http.StatusBadGateway, "reading the cluster state: "+err.Error())
		return
	}
	res, err := Trace(ctx, objs, s.o.Settings, req)
	switch {
	case errors.Is(err, ErrInvalid):
		s.m.Traces.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusUnprocessableEntity, err.Error())
	case err != nil:
		s.m.Traces.WithLabelValues("error").Inc()
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		s.m.Traces.WithLabelValues("ok").Inc()
		writeJSON(w, http.StatusOK, res)
	}
}

// TraceEndpoints are the form's choices: the Pods and Services.
type TraceEndpoints struct {
	Pods     []string `json:"pods"`
	Services []string `json:"services"`
}

func (s *Server) traceEndpoints(w http.ResponseWriter, r *http.Request) {
	if s.o.Cluster == nil {
		writeJSON(w, http.StatusOK, TraceEndpoints{Pods: []string{}, Services: []string{}})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), traceTimeout)
	defer cancel()
	objs, err := s.o.Cluster(ctx)
	if err != nil {
		writeError(w, http.StatusBadGateway, "reading the cluster state: "+err.Error())
		return
	}
	st, _ := cluster.Build(objs)
	out := TraceEndpoints{Pods: []string{}, Services: []string{}}
	for _, p := range st.Pods {
		if !p.HostNetwork {
			out.Pods = append(out.Pods, p.Key())
		}
	}
	for _, sv := range st.Services {
		out.Services = append(out.Services, sv.Key())
	}
	sort.Strings(out.Pods)
	sort.Strings(out.Services)
	writeJSON(w, http.StatusOK, out)
}
