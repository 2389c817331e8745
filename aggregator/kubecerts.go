package aggregator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

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
// publishes the result for the exporters (see package kubecerts), owned by
// the ConfigMap FA_CONFIG_MAP_NAME names (the chart's) so that uninstalling
// the release deletes them. Outside a cluster both do nothing.
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
	var owner *metav1.OwnerReference
	if name := os.Getenv(kubecerts.OwnerConfigMapEnv); name != "" {
		// Before anything is generated: a missing grant stops the start.
		if owner, err = kubecerts.Owner(ctx, client, ns, name); err != nil {
			return none, fmt.Errorf("%s: %w", kubecerts.OwnerConfigMapEnv, err)
		}
	} else {
		a.log.Warn("certificate objects get no owner: "+kubecerts.OwnerConfigMapEnv+" is not set, so uninstalling leaves them behind",
			"namespace", ns)
	}
	found, err := kubecerts.Restore(ctx, client, ns, dir)
	if err != nil {
		return none, err
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), clusterCertsTimeout)
		defer cancel()
		if err := kubecerts.Publish(ctx, client, ns, dir, found, owner); err != nil {
			return err
		}
		a.log.Info("TLS certificates published for the exporters", "namespace", ns,
			"configMap", kubecerts.CAConfigMap, "secret", kubecerts.ClientSecret)
		return nil
	}, nil
}

// inClusterNamespaceFile is where a Pod's service account namespace is.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// kubeAccess is sink.Env.Kube: a client of the cluster the aggregator
// reads metadata from (sluice.kubeconfig, or the Pod's service account)
// and the namespace it runs in: POD_NAMESPACE (the chart sets it), else
// the kubeconfig context's namespace ("default" when it names none), else
// the service account's.
func (a *Aggregator) kubeAccess() (kubernetes.Interface, string, error) {
	kc := a.cfg.Sluice.Kubeconfig
	if kc == "" && !enrich.InClusterEnv() {
		return nil, "", errors.New("neither sluice.kubeconfig nor a Pod's service account")
	}
	rc, err := enrich.KubeConfig(kc)
	if err != nil {
		return nil, "", err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client: %w", err)
	}
	ns := os.Getenv("POD_NAMESPACE")
	switch {
	case ns != "":
	case kc != "":
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: kc}, &clientcmd.ConfigOverrides{})
		if ns, _, err = cc.Namespace(); err != nil {
			return nil, "", fmt.Errorf("kubeconfig %s: namespace: %w", kc, err)
		}
	default:
		b, err := os.ReadFile(inClusterNamespaceFile)
		if err != nil {
			return nil, "", fmt.Errorf("the Pod's namespace (set POD_NAMESPACE): %w", err)
		}
		ns = strings.TrimSpace(string(b))
	}
	return client, ns, nil
}
