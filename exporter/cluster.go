package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sluice/certs/kubecerts"
	"sluice/enrich"
	"sluice/exporter/nodecidr"
)

// exporterAPIConfig is how the exporter reaches the API server for its
// own Node and its certificates: the Pod's service account in a cluster,
// else the kubeconfig file in $KUBECONFIG; nil when there is neither.
// (--kubeconfig is another thing: a full Pod metadata source.)
func exporterAPIConfig() (*rest.Config, error) {
	switch {
	case os.Getenv("KUBERNETES_SERVICE_HOST") != "":
		return enrich.KubeConfig("")
	case os.Getenv("KUBECONFIG") != "":
		return enrich.KubeConfig(os.Getenv("KUBECONFIG"))
	}
	return nil, nil
}

func exporterAPIClient() (kubernetes.Interface, error) {
	rc, err := exporterAPIConfig()
	if rc == nil || err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

// syntheticLookupTimeout bounds the Node look-up for the synthetic source,
// which has a Pod CIDR of its own to fall back on.
const syntheticLookupTimeout = 10 * time.Second

// inClusterPodCIDRs reads Node node's Pod CIDRs from the API server when
// the exporter runs in a Pod (the DaemonSet of the chart), or $KUBECONFIG
// is set; otherwise it returns none. A Node without one yet is waited for
// until ctx ends (/readyz says so meanwhile: a restart would not help).
// With optional (the synthetic source), a failed look-up is a warning and
// returns none.
func inClusterPodCIDRs(ctx context.Context, node string, optional bool, log *slog.Logger) ([]netip.Prefix, error) {
	client, err := exporterAPIClient()
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr not given: %w", err)
	}
	if client == nil {
		return nil, nil
	}
	if optional {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, syntheticLookupTimeout)
		defer cancel()
	}
	p, err := nodecidr.Lookup(ctx, client, node, log)
	if err != nil && optional {
		log.Warn("no Pod CIDR from the Node object", "node", node, "error", err)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr not given, and the Node object does not tell: %w", err)
	}
	log.Info("Pod CIDRs from the Node object", "node", node, "pod_cidrs", p)
	return p, nil
}

// waitPodCIDRs waits until the live cluster's Node node has Pod CIDRs in
// store (its informer follows the Node), or ctx ends.
func waitPodCIDRs(ctx context.Context, store enrich.Store, node string, log *slog.Logger) ([]netip.Prefix, error) {
	t := time.NewTicker(nodecidr.RetryInterval)
	defer t.Stop()
	for logged := false; ; logged = true {
		if n, ok := store.NodeByName(node); ok && len(n.PodCIDRs) > 0 {
			log.Info("Pod CIDRs from the Node object", "node", node, "pod_cidrs", n.PodCIDRs)
			return n.PodCIDRs, nil
		}
		if !logged {
			log.Info("the Node has no Pod CIDR yet; waiting (give --pod-cidr where the cluster does not allocate them)", "node", node)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("--pod-cidr not given, and Node %q has no Pod CIDR: %w", node, ctx.Err())
		case <-t.C:
		}
	}
}

// clusterCertDir fetches the aggregator's CA and the exporters' client
// certificate from namespace ns through the API (see package kubecerts)
// into a new private directory, and returns it for --tls-cert-dir. The
// aggregator publishes them when it starts, so they are waited for, until
// ctx ends (/readyz says so meanwhile).
func clusterCertDir(ctx context.Context, ns string, log *slog.Logger) (string, error) {
	client, err := exporterAPIClient()
	if err != nil {
		return "", fmt.Errorf("--tls-from-namespace: %w", err)
	}
	if client == nil {
		return "", fmt.Errorf("--tls-from-namespace: not in a Pod, and $KUBECONFIG is not set")
	}
	dir, err := os.MkdirTemp("", "sluice-exporter-tls-")
	if err != nil {
		return "", fmt.Errorf("--tls-from-namespace: %w", err)
	}
	for {
		err := kubecerts.Fetch(ctx, client, ns, dir)
		if err == nil {
			log.Info("client certificate from the cluster", "namespace", ns, "dir", dir)
			return dir, nil
		}
		log.Warn("waiting for the aggregator's certificates", "namespace", ns, "error", err)
		select {
		case <-ctx.Done():
			os.RemoveAll(dir)
			return "", fmt.Errorf("--tls-from-namespace %s: %w", ns, err)
		case <-time.After(2 * time.Second):
		}
	}
}
