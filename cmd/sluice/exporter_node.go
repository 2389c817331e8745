package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"

	"sluice/enrich"
	"sluice/exporter/nodecidr"
)

// nodeLookupTimeout bounds the wait for the Node's Pod CIDRs at start-up.
const nodeLookupTimeout = 2 * time.Minute

// inClusterPodCIDRs reads Node node's Pod CIDRs from the API server when
// the exporter runs in a Pod (the DaemonSet of the chart), with the Pod's
// service account; outside a Pod it returns none.
func inClusterPodCIDRs(ctx context.Context, node string, log *slog.Logger) ([]netip.Prefix, error) {
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, nil
	}
	rc, err := enrich.KubeConfig("")
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr not given: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr not given: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, nodeLookupTimeout)
	defer cancel()
	p, err := nodecidr.Lookup(ctx, client, node, log)
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr not given, and the Node object does not tell: %w", err)
	}
	log.Info("Pod CIDRs from the Node object", "node", node, "pod_cidrs", p)
	return p, nil
}
