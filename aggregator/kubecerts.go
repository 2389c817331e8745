package aggregator

import (
	"context"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"

	"sluice/certs/kubecerts"
	"sluice/enrich"
)

// clusterCertsTimeout bounds each exchange with the API server about the
// certificates at start-up.
const clusterCertsTimeout = 30 * time.Second

// restoreClusterCerts, when the aggregator runs in a cluster (Pod
// metadata from the API server, and POD_NAMESPACE set as the chart does),
// copies the CA kept in that namespace into the certificate directory
// before certificates are generated there, and returns the function that
// publishes the result for the exporters (see package kubecerts). Outside
// a cluster both do nothing.
func (a *Aggregator) restoreClusterCerts(dir string) (publish func() error, err error) {
	none := func() error { return nil }
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" || (a.cfg.Sluice.Kubeconfig == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "") {
		return none, nil
	}
	rc, err := enrich.KubeConfig(a.cfg.Sluice.Kubeconfig)
	if err != nil {
		return none, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return none, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterCertsTimeout)
	defer cancel()
	found, err := kubecerts.Restore(ctx, client, ns, dir)
	if err != nil {
		return none, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), clusterCertsTimeout)
		defer cancel()
		if err := kubecerts.Publish(ctx, client, ns, dir, found); err != nil {
			return err
		}
		a.log.Info("TLS certificates published for the exporters", "namespace", ns,
			"configMap", kubecerts.CAConfigMap, "secret", kubecerts.ClientSecret)
		return nil
	}, nil
}
