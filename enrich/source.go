package enrich

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"

	"sluice/kubeinformers"
)

// A Source is a Store kept current by Run: an Inventory or a Kube.
type Source interface {
	Store
	// Run follows the source until ctx ends.
	Run(ctx context.Context) error
	// Ready is closed once the first view is loaded (or its wait timed
	// out): look-ups made before may miss everything.
	Ready() <-chan struct{}
}

// SourceOptions say where Kubernetes metadata comes from.
type SourceOptions struct {
	// Inventory is a file of Pods, Nodes and Services (see Inventory).
	Inventory string
	// Kubeconfig is a kubeconfig file for the live cluster (see Kube).
	Kubeconfig string
	// InCluster follows the cluster through the service account of the
	// Pod Sluice runs in when neither file is given. OpenSource's callers
	// set it when KUBERNETES_SERVICE_HOST is set (InClusterEnv).
	InCluster bool
	// CheckAccess asks the API server, before following the cluster,
	// whether the credentials may get, list and watch Pods, Nodes and
	// Services (CheckKubeAccess), so that a missing grant stops the
	// start-up with its name.
	CheckAccess bool
	// ShareInformers gives a Kube a kubeinformers.Shared of its own
	// client (Kube.Informers), for the process's other informers to join.
	ShareInformers bool
	Logger         *slog.Logger
}

// kubeAccessTimeout bounds OpenSource's permission check.
const kubeAccessTimeout = 30 * time.Second

// InClusterEnv reports whether this process runs in a Kubernetes Pod.
func InClusterEnv() bool { return os.Getenv("KUBERNETES_SERVICE_HOST") != "" }

// ErrBothSources is OpenSource's error when both files are given.
var ErrBothSources = errors.New("give one metadata source (an inventory file or a kubeconfig), not both")

// OpenSource returns the metadata source o asks for: the inventory file,
// else the cluster of the kubeconfig or (InCluster) of the Pod; nil, and no
// error, when o names none. Errors name the file at fault.
func OpenSource(o SourceOptions) (Source, error) {
	switch {
	case o.Inventory != "" && o.Kubeconfig != "":
		return nil, ErrBothSources
	case o.Inventory != "":
		inv, err := NewInventory(o.Inventory, InventoryOptions{Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		return inv, nil
	case o.Kubeconfig != "" || o.InCluster:
		rc, err := KubeConfig(o.Kubeconfig)
		if err != nil {
			return nil, err
		}
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		if o.CheckAccess {
			ctx, cancel := context.WithTimeout(context.Background(), kubeAccessTimeout)
			err := CheckKubeAccess(ctx, client, o.Logger)
			cancel()
			if err != nil {
				return nil, err
			}
		}
		ko := KubeOptions{Logger: o.Logger}
		if o.ShareInformers {
			ko.Informers = kubeinformers.New(client)
		}
		return NewKube(client, ko), nil
	}
	return nil, nil
}
