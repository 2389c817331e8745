package aggregator

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/kubernetes"

	"sluice/enrich"
)

// kubeAccessTimeout bounds the permission check at start-up.
const kubeAccessTimeout = 30 * time.Second

// checkKubeAccess stops the start-up when the API server denies a
// permission the Pod metadata needs, naming it.
func checkKubeAccess(client kubernetes.Interface, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), kubeAccessTimeout)
	defer cancel()
	return enrich.CheckKubeAccess(ctx, client, log)
}
