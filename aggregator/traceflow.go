package aggregator

import (
	"context"
	"errors"

	"sluice/traceflow/cluster"
	"sluice/traceflow/cluster/kube"
	"sluice/traceflow/controller"
	"sluice/traceflow/modelrun"
)

// traceflowSettingKeys names each model setting's configuration key.
var traceflowSettingKeys = map[string]string{
	"TrafficMode": "sluice.traceflow.trafficMode", "TunnelType": "sluice.traceflow.tunnelType",
	"ServiceCIDRs": "sluice.traceflow.serviceCIDRs", "EgressExceptCIDRs": "sluice.traceflow.egressExceptCIDRs",
	"TrafficEncryptionMode": "sluice.traceflow.trafficEncryptionMode",
	"EnableBridgingMode":    "sluice.traceflow.enableBridgingMode",
}

// setupTraceflow prepares the Traceflow controller when
// sluice.traceflow.enable is set: it needs Kubernetes (sluice.kubeconfig
// or the Pod's service account), the traceflows.sluice.io CRD, and the
// permission to list Traceflows, all checked here so that start-up fails
// with the key to fix. Run watches the cluster's objects for the traces.
func (a *Aggregator) setupTraceflow() error {
	s := a.cfg.Sluice
	tc := s.Traceflow
	if !tc.Enable {
		return nil
	}
	const key = "sluice.traceflow.enable"
	if s.Kubeconfig == "" && !kube.InCluster() {
		return a.cfg.KeyError(key, errors.New("the Traceflow controller needs Kubernetes: set sluice.kubeconfig, or run in a Pod"))
	}
	rc, err := kube.RESTConfig(s.Kubeconfig)
	if err != nil {
		return a.cfg.KeyError("sluice.kubeconfig", err)
	}
	client, dyn, err := kube.Clients(rc)
	if err != nil {
		return a.cfg.KeyError("sluice.kubeconfig", err)
	}
	// One watch of the cluster serves every trace, the controller's and
	// the UI's: a trace reads the caches instead of listing the whole
	// cluster. IPPools too, for the bridging mode.
	w := kube.NewWatcher(client, dyn, kube.WatchOptions{Logger: a.log, IPPools: true, Informers: a.informers})
	ctl, err := controller.New(client, dyn, controller.Options{
		Objects:     w.WaitObjects,
		Settings:    a.traceSettings(),
		DeleteAfter: tc.DeleteAfter.Duration,
		Registerer:  a.reg,
		Log:         a.log,
	})
	var se *modelrun.SettingError
	if errors.As(err, &se) {
		return a.cfg.KeyError(traceflowSettingKeys[se.Field], se.Err)
	}
	if err != nil {
		return a.cfg.KeyError(key, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterCertsTimeout)
	defer cancel()
	switch err := ctl.Check(ctx); {
	case errors.Is(err, controller.ErrNotServed) || errors.Is(err, controller.ErrForbidden):
		return a.cfg.KeyError(key, err)
	case err != nil:
		a.log.Warn("traceflow controller: the API server cannot be asked now; retrying in the background", "err", err)
	}
	a.traceflow, a.clusterWatch = ctl, w
	// The UI's trace waits for the watch's first lists within its own
	// timeout, as the controller's do.
	a.liveObjects = func(ctx context.Context) ([]cluster.Object, error) {
		objs, _, err := w.WaitObjects(ctx)
		return objs, err
	}
	return nil
}
