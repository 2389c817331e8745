package aggregator

import (
	"context"
	"net"
	"net/netip"
	"time"

	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/flowjson"
	"sluice/ring"
	"sluice/sink"
	"sluice/traceflow/cluster"
	"sluice/traceflow/modelrun"
	"sluice/ui"
)

// Options are what an aggregator may be given beside its configuration.
type Options struct {
	// Cluster reads the cluster's objects for the web UI's Traceflow page
	// (the demo passes its example cluster). When nil, the page traces on
	// the live cluster when sluice.traceflow.enable gives the aggregator
	// Kubernetes access, and is off otherwise.
	Cluster func(context.Context) ([]cluster.Object, error)
}

// uiSamplePerSecond is how many records a second the UI is given of
// what Proxy mode's fast path forwards (its pages take at most 1,000).
const uiSamplePerSecond = 1000

// fastPathNotice is the UI's notice when it sees a sample of the records
// (Proxy mode's fast path).
const fastPathNotice = "Proxy mode's fast path is on: records reach the sink already encoded, and the Flows and Map pages show a sample of them, at most 1,000 a second. Set sluice.proxy.fastPath: false to see every record."

// aggregateFastPathNotice is fastPathNotice for Aggregate mode's.
const aggregateFastPathNotice = "Aggregate mode's fast path is on: exported records are encoded for the sink as they are built, and the Flows and Map pages show a sample of them, at most 1,000 a second. Set sluice.aggregate.fastPath: false to see every record."

// setupUI prepares the web UI when sluice.ui.address is set, binding its
// address.
func (a *Aggregator) setupUI(o Options) error {
	addr := a.cfg.Sluice.UIListenAddress()
	if addr == "" {
		return nil
	}
	uo := ui.Options{Buffer: a.buf, Gatherer: a.reg, Registerer: a.reg, Mode: a.cfg.Mode, Log: a.log,
		Cluster: o.Cluster, Settings: a.traceSettings(),
		Address: addr, AllowedHosts: a.cfg.Sluice.UI.AllowedHosts}
	for _, s := range a.sinks {
		uo.Sinks = append(uo.Sinks, s.key)
	}
	if uo.Cluster == nil && a.liveObjects != nil {
		uo.Cluster = a.liveObjects
	}
	if a.meta != nil {
		uo.PodWorkload = podWorkload(a.meta)
	}
	if a.encoded != nil {
		// Records forwarded as octets never pass a.buf: the UI reads a
		// sample of them from a buffer of its own.
		sampled := ring.New[*flow.Flow](8192)
		a.sample = a.encoded.Sample(sampled, uiSamplePerSecond)
		uo.Buffer = sampled
		uo.Notice = fastPathNotice
		if _, ok := a.mode.(aggregateMode); ok {
			uo.Notice = aggregateFastPathNotice
		}
	}
	// One renderer, used under the UI's lock: the fields of the
	// flow-record API.
	if ex, err := sink.NewExporter(a.cfg, a.table); err == nil {
		r := flowjson.New(ex)
		uo.Render = func(f *flow.Flow) ([]byte, error) { return r.AppendObject(nil, f) }
	}
	srv, err := ui.New(uo)
	if err != nil {
		return a.cfg.KeyError("sluice.traceflow", err)
	}
	if a.uiLn, err = net.Listen("tcp", addr); err != nil {
		return a.cfg.KeyError("sluice.ui.address", err)
	}
	a.ui = srv
	return nil
}

// podWorkload names a Pod's workload from its controller as the metadata
// source knows it: the Pod that held ip when the flow started, if it is
// the Pod the record names.
func podWorkload(meta enrich.Store) ui.PodWorkload {
	return func(ns, pod string, ip netip.Addr, at time.Time) (string, string, bool) {
		p, ok := meta.PodByIP(ip, at)
		if !ok || p.Namespace != ns || p.Name != pod || !p.Workload.Known() {
			return "", "", false
		}
		return p.Workload.Kind, p.Workload.Name, true
	}
}

// runUI serves the UI and runs its tap until ctx ends; the returned
// function waits for both.
func (a *Aggregator) runUI(ctx context.Context) (wait func()) {
	if a.ui == nil {
		return func() {}
	}
	done := make(chan struct{}, 2)
	go func() { a.ui.Run(ctx); done <- struct{}{} }()
	go func() {
		if err := a.ui.Serve(ctx, a.uiLn); err != nil {
			a.log.Error("the web UI stopped", "err", err)
		}
		done <- struct{}{}
	}()
	a.log.Info("web UI", "url", ui.URL(a.uiLn.Addr().String()))
	return func() { <-done; <-done }
}

// UIURL is the web UI's address to open, or "" when it is off.
func (a *Aggregator) UIURL() string {
	if a.uiLn == nil {
		return ""
	}
	return ui.URL(a.uiLn.Addr().String())
}

// traceSettings are the model settings of sluice.traceflow, which the
// UI's traces use as the controller's do.
func (a *Aggregator) traceSettings() modelrun.Settings {
	tc := a.cfg.Sluice.Traceflow
	return modelrun.Settings{TrafficMode: tc.TrafficMode, TunnelType: tc.TunnelType,
		ServiceCIDRs: tc.ServiceCIDRs, EgressExceptCIDRs: tc.EgressExceptCIDRs, ProxyAll: tc.ProxyAll,
		TrafficEncryptionMode: tc.TrafficEncryptionMode, Multicast: tc.Multicast,
		EnableBridgingMode: tc.EnableBridgingMode}
}
