// Package modelrun is the one way Sluice turns a cluster state into a
// traced Traceflow: the agents' settings that the model needs, the model
// built from the state's objects, and the trace. `sluice traceflow` and
// the aggregator's Traceflow controller (package traceflow/controller)
// both go through it, so that the same objects and settings give the same
// status.
package modelrun

import (
	"context"
	"fmt"
	"net/netip"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/pipeline"
	"sluice/traceflow/tracer"
)

// Settings are the Antrea agents' settings the model depends on, as text
// (command-line flags or configuration keys).
type Settings struct {
	// TrafficMode is encap, noEncap, hybrid or networkPolicyOnly.
	TrafficMode string
	// TunnelType is geneve or vxlan (encap and hybrid modes).
	TunnelType string
	// ServiceCIDRs are the cluster's Service CIDRs.
	ServiceCIDRs []string
	// EgressExceptCIDRs are the agents' egress.exceptCIDRs.
	EgressExceptCIDRs []string
	// ProxyAll is the agents' antreaProxy.proxyAll.
	ProxyAll bool
	// TrafficEncryptionMode is the agents' trafficEncryptionMode: none
	// (or empty) or wireGuard (encap mode only).
	TrafficEncryptionMode string
	// Multicast is the agents' multicast.enable.
	Multicast bool
	// EnableBridgingMode is the agents' enableBridgingMode (FlexibleIPAM;
	// noEncap mode only).
	EnableBridgingMode bool
}

// DefaultSettings are encap over Geneve with kubeadm's Service CIDR, as
// pipeline.DefaultConfig.
func DefaultSettings() Settings {
	return Settings{TrafficMode: "encap", TunnelType: "geneve", ServiceCIDRs: []string{crd.ServiceCIDRDefault},
		TrafficEncryptionMode: string(pipeline.EncryptionNone)}
}

// SettingError is a setting that cannot be used; Field names it as the
// Settings field does (TrafficMode, ServiceCIDRs, ...), so that callers
// can name their own flag or key.
type SettingError struct {
	Field string
	Err   error
}

func (e *SettingError) Error() string { return e.Field + ": " + e.Err.Error() }

func (e *SettingError) Unwrap() error { return e.Err }

// Config turns s into a pipeline configuration with Traceflow tag tag.
func (s Settings) Config(tag uint8) (pipeline.Config, error) {
	cfg := pipeline.DefaultConfig()
	var err error
	if cfg.TrafficMode, err = pipeline.ParseTrafficMode(s.TrafficMode); err != nil {
		return cfg, &SettingError{"TrafficMode", err}
	}
	if cfg.TunnelType, err = pipeline.ParseTunnelType(s.TunnelType); err != nil {
		return cfg, &SettingError{"TunnelType", err}
	}
	if cfg.Encryption, err = pipeline.ParseEncryptionMode(s.TrafficEncryptionMode); err != nil {
		return cfg, &SettingError{"TrafficEncryptionMode", err}
	}
	if cfg.Encryption == pipeline.WireGuard && cfg.TrafficMode != pipeline.Encap {
		// As the reference's agent, which refuses to start.
		return cfg, &SettingError{"TrafficEncryptionMode", fmt.Errorf("WireGuard is not applicable to the %s mode (only to encap)", cfg.TrafficMode)}
	}
	if s.EnableBridgingMode && cfg.TrafficMode != pipeline.NoEncap {
		// As the reference's agent, which refuses to start.
		return cfg, &SettingError{"EnableBridgingMode", fmt.Errorf("bridging mode requires the noEncap traffic mode, not %s", cfg.TrafficMode)}
	}
	parse := func(field string, in []string) ([]netip.Prefix, error) {
		var out []netip.Prefix
		for _, v := range in {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return nil, &SettingError{field, fmt.Errorf("%q is not a CIDR", v)}
			}
			out = append(out, p.Masked())
		}
		return out, nil
	}
	if cfg.ServiceCIDRs, err = parse("ServiceCIDRs", s.ServiceCIDRs); err != nil {
		return cfg, err
	}
	if cfg.EgressExceptCIDRs, err = parse("EgressExceptCIDRs", s.EgressExceptCIDRs); err != nil {
		return cfg, err
	}
	cfg.Tag, cfg.ProxyAll, cfg.Multicast, cfg.BridgingMode = tag, s.ProxyAll, s.Multicast, s.EnableBridgingMode
	return cfg, nil
}

// Model checks the objects and builds the datapath model. An error among
// the state's findings is an error; the warnings (of the state and of the
// model) are returned.
func Model(ctx context.Context, objs []cluster.Object, cfg pipeline.Config) (*pipeline.Model, cluster.Problems, error) {
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		return nil, nil, err
	}
	m, more, err := pipeline.Build(ctx, st, cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("building the datapath model: %w", err)
	}
	return m, append(probs, more...), nil
}

// Trace builds the model of objs with the first Traceflow tag and traces
// tf over it (tf is not modified). Errors are those of Model and of
// tracer.Run: a *tracer.AdmissionError is a request the reference refuses,
// a *tracer.UntraceableError one it accepts but cannot trace.
func Trace(ctx context.Context, objs []cluster.Object, s Settings, tf *crd.Traceflow, opts tracer.Options) (*tracer.Trace, cluster.Problems, error) {
	cfg, err := s.Config(crd.FirstTraceflowTag)
	if err != nil {
		return nil, nil, err
	}
	m, probs, err := Model(ctx, objs, cfg)
	if err != nil {
		return nil, nil, err
	}
	tr, err := tracer.Run(ctx, m, tf, opts)
	return tr, probs, err
}

// NewTraceflow builds the Traceflow antctl would create for a source Pod
// (ns/pod or pod), a destination (ns/pod, ns/service, pod, service or an
// IP) and a packet description (flowspec syntax, empty for an ICMP echo
// request) in the state st: `sluice traceflow -S -D -f` and the web UI's
// Traceflow page both make their object here. An error in the packet
// description wraps a *FlowError.
func NewTraceflow(st *cluster.State, src, dst, flow string) (*crd.Traceflow, error) {
	s, d, err := tracer.Endpoints(st, src, dst)
	if err != nil {
		return nil, err
	}
	pkt, err := flowspec.Parse(flow)
	if err != nil {
		return nil, &FlowError{Err: err}
	}
	tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d, Packet: pkt, Timeout: crd.DefaultTraceflowTimeout}}
	tf.APIVersion, tf.Kind, tf.Name = crd.GroupVersion, crd.KindTraceflow, tracer.Name(s, d)
	return tf, nil
}

// FlowError is a packet description NewTraceflow cannot parse.
type FlowError struct{ Err error }

func (e *FlowError) Error() string { return e.Err.Error() }

func (e *FlowError) Unwrap() error { return e.Err }
