// Package kube reads a traceflow cluster state from a live cluster, read
// only: it lists Nodes, Namespaces, Pods, Services, EndpointSlices and
// NetworkPolicies through the typed clientset, and Antrea's Egresses,
// NetworkPolicies, ClusterNetworkPolicies, ClusterGroups and Groups
// through the dynamic client,
// and turns them into the same []cluster.Object the file loader produces,
// so that cluster.Build treats both sources alike.
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
)

// DefaultPageSize is how many objects one list request asks for, as
// kubectl's --chunk-size.
const DefaultPageSize = 500

// Options tunes Load. The zero value gives the defaults.
type Options struct {
	// PageSize is the Limit of each list request; DefaultPageSize if zero
	// or negative.
	PageSize int64
}

// antreaGroupVersion is where the Antrea CRDs the model reads are served.
var antreaGroupVersion = schema.GroupVersion{Group: "crd.antrea.io", Version: "v1beta1"}

// antreaResource is one Antrea CRD the model reads.
type antreaResource struct {
	resource string // plural, as served
	kind     string
	// quiet: a missing CRD is no warning. Groups matter only to policies
	// that name one, and the state check warns about those.
	quiet bool
}

func antreaResources() []antreaResource {
	return []antreaResource{
		{"egresses", crd.KindEgress, false},
		{"networkpolicies", crd.KindAntreaNetworkPolicy, false},
		{"clusternetworkpolicies", crd.KindAntreaClusterPolicy, false},
		{"clustergroups", crd.KindClusterGroup, true},
		{"groups", crd.KindGroup, true},
		// IPPools matter only with FlexibleIPAM (enableBridgingMode), which
		// is rarely enabled: a missing CRD is no warning.
		{"ippools", crd.KindIPPool, true},
	}
}

// Load lists the cluster's objects. A missing Antrea CRD (the resource is
// not served) is a warning in the returned problems; any other failure,
// a forbidden list among them, is an error naming the resource. ctx bounds
// the whole read.
func Load(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, opts Options) ([]cluster.Object, cluster.Problems, error) {
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	l := loader{pageSize: opts.PageSize, source: "live"}
	var out []cluster.Object
	typed := []func(context.Context) ([]cluster.Object, error){
		func(ctx context.Context) ([]cluster.Object, error) {
			return listTyped(ctx, l, "namespaces", "v1", "Namespace",
				func(ctx context.Context, o metav1.ListOptions) ([]corev1.Namespace, string, error) {
					r, err := client.CoreV1().Namespaces().List(ctx, o)
					if err != nil {
						return nil, "", err
					}
					return r.Items, r.Continue, nil
				}, func(n *corev1.Namespace) *metav1.ObjectMeta { return &n.ObjectMeta })
		},
		func(ctx context.Context) ([]cluster.Object, error) {
			return listTyped(ctx, l, "nodes", "v1", "Node",
				func(ctx context.Context, o metav1.ListOptions) ([]corev1.Node, string, error) {
					r, err := client.CoreV1().Nodes().List(ctx, o)
					if err != nil {
						return nil, "", err
					}
					return r.Items, r.Continue, nil
				}, func(n *corev1.Node) *metav1.ObjectMeta { return &n.ObjectMeta })
		},
		func(ctx context.Context) ([]cluster.Object, error) {
			return listTyped(ctx, l, "pods", "v1", "Pod",
				func(ctx context.Context, o metav1.ListOptions) ([]corev1.Pod, string, error) {
					// Finished Pods hold no interface and the model drops
					// them; leave them on the server.
					o.FieldSelector = "status.phase!=Succeeded,status.phase!=Failed"
					r, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
					if err != nil {
						return nil, "", err
					}
					return r.Items, r.Continue, nil
				}, func(p *corev1.Pod) *metav1.ObjectMeta { return &p.ObjectMeta })
		},
		func(ctx context.Context) ([]cluster.Object, error) {
			return listTyped(ctx, l, "services", "v1", "Service",
				func(ctx context.Context, o metav1.ListOptions) ([]corev1.Service, string, error) {
					r, err := client.CoreV1().Services(metav1.NamespaceAll).List(ctx, o)
					if err != nil {
						return nil, "", err
					}
					return r.Items, r.Continue, nil
				}, func(s *corev1.Service) *metav1.ObjectMeta { return &s.ObjectMeta })
		},
		func(ctx context.Context) ([]cluster.Object, error) {
			return listTyped(ctx, l, "endpointslices.discovery.k8s.io", "discovery.k8s.io/v1", "EndpointSlice",
				func(ctx context.Context, o metav1.ListOptions) ([]discoveryv1.EndpointSlice, string, error) {
					r, err := client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, o)
					if err != nil {
						return nil, "", err
					}
					return r.Items, r.Continue, nil
				}, func(s *discoveryv1.EndpointSlice) *metav1.ObjectMeta { return &s.ObjectMeta })
		},
		func(ctx context.Context) ([]cluster.Object, error) {
			return listTyped(ctx, l, "networkpolicies.networking.k8s.io", "networking.k8s.io/v1", "NetworkPolicy",
				func(ctx context.Context, o metav1.ListOptions) ([]networkingv1.NetworkPolicy, string, error) {
					r, err := client.NetworkingV1().NetworkPolicies(metav1.NamespaceAll).List(ctx, o)
					if err != nil {
						return nil, "", err
					}
					return r.Items, r.Continue, nil
				}, func(p *networkingv1.NetworkPolicy) *metav1.ObjectMeta { return &p.ObjectMeta })
		},
	}
	for _, list := range typed {
		objs, err := list(ctx)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, objs...)
	}

	served, err := servedAntrea(ctx, client)
	if err != nil {
		return nil, nil, err
	}
	var probs cluster.Problems
	for _, r := range antreaResources() {
		name := r.resource + "." + antreaGroupVersion.Group
		missing := served != nil && !served[r.resource]
		var objs []cluster.Object
		var err error
		if !missing {
			objs, err = l.listDynamic(ctx, dyn, r)
			missing = apierrors.IsNotFound(err)
		}
		if missing {
			if !r.quiet {
				probs = append(probs, missingCRD(name, r.kind))
			}
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		out = append(out, objs...)
	}
	return out, probs, nil
}

func missingCRD(resource, kind string) cluster.Problem {
	return cluster.Problem{Severity: cluster.Warning, Object: "resource " + resource,
		Message: fmt.Sprintf("is not served by the cluster (the Antrea CRD is not installed); traced without any %s", kind)}
}

// servedAntrea asks discovery which Antrea resources the server serves:
// an empty set when the group version is not served at all, and nil
// (list them and see) when discovery itself fails for another reason,
// such as a server that forbids discovery.
func servedAntrea(ctx context.Context, client kubernetes.Interface) (map[string]bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("discovering %s: %w", antreaGroupVersion, err)
	}
	d := discovery.ToDiscoveryInterfaceWithContext(client.Discovery())
	list, err := d.ServerResourcesForGroupVersionWithContext(ctx, antreaGroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		return map[string]bool{}, nil
	case err != nil && ctx.Err() != nil:
		return nil, fmt.Errorf("discovering %s: %w", antreaGroupVersion, err)
	case err != nil:
		return nil, nil // the lists will tell
	}
	served := map[string]bool{}
	for _, r := range list.APIResources {
		served[r.Name] = true
	}
	return served, nil
}

type loader struct {
	pageSize int64
	source   string // the prefix of each Object's Source
}

// pages runs list until the server has no continuation, restarting once
// from the beginning when the continuation expires (the server compacted
// the snapshot away mid-read), so the result is one consistent list.
func pages(ctx context.Context, resource string, pageSize int64, list func(ctx context.Context, opts metav1.ListOptions) (cont string, err error), reset func()) error {
	for attempt := 0; ; attempt++ {
		opts := metav1.ListOptions{Limit: pageSize}
		seen := map[string]bool{}
		var err error
		for {
			if err = ctx.Err(); err != nil {
				return fmt.Errorf("listing %s: %w", resource, err)
			}
			var cont string
			cont, err = list(ctx, opts)
			if err != nil || cont == "" {
				break
			}
			if seen[cont] {
				return fmt.Errorf("listing %s: the server repeated continue token %q", resource, cont)
			}
			seen[cont] = true
			opts.Continue = cont
		}
		switch {
		case err == nil:
			return nil
		case apierrors.IsResourceExpired(err) && opts.Continue != "" && attempt == 0:
			reset()
			continue
		case apierrors.IsForbidden(err):
			return fmt.Errorf("listing %s: %w (sluice traceflow needs get and list on %s)", resource, err, resource)
		case ctx.Err() != nil:
			return fmt.Errorf("listing %s: %w (%w)", resource, ctx.Err(), err)
		default:
			return fmt.Errorf("listing %s: %w", resource, err)
		}
	}
}

// listTyped lists one typed resource and converts each item. Items of a
// typed list carry no apiVersion and kind, so they are set here.
func listTyped[T any](ctx context.Context, l loader, resource, apiVersion, kind string,
	list func(context.Context, metav1.ListOptions) ([]T, string, error), meta func(*T) *metav1.ObjectMeta) ([]cluster.Object, error) {
	var items []T
	err := pages(ctx, resource, l.pageSize, func(ctx context.Context, opts metav1.ListOptions) (string, error) {
		page, cont, err := list(ctx, opts)
		items = append(items, page...)
		return cont, err
	}, func() { items = nil })
	if err != nil {
		return nil, err
	}
	out := make([]cluster.Object, 0, len(items))
	for i := range items {
		m := meta(&items[i])
		// Set apiVersion and kind in the document, as the file format
		// has them, whatever the item's TypeMeta says.
		raw, err := json.Marshal(items[i])
		if err != nil {
			return nil, fmt.Errorf("listing %s: encoding %s: %w", resource, describe(kind, m.Namespace, m.Name), err)
		}
		raw, err = withTypeMeta(raw, apiVersion, kind)
		if err != nil {
			return nil, fmt.Errorf("listing %s: encoding %s: %w", resource, describe(kind, m.Namespace, m.Name), err)
		}
		out = append(out, cluster.Object{
			APIVersion: apiVersion, Kind: kind, Namespace: m.Namespace, Name: m.Name,
			Source: l.source + " " + resource, Raw: raw,
		})
	}
	return out, nil
}

// withTypeMeta sets apiVersion and kind in a JSON object.
func withTypeMeta(raw []byte, apiVersion, kind string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	m["apiVersion"], _ = json.Marshal(apiVersion)
	m["kind"], _ = json.Marshal(kind)
	return json.Marshal(m)
}

func describe(kind, ns, name string) string {
	if ns == "" {
		return kind + " " + name
	}
	return kind + " " + ns + "/" + name
}

// listDynamic lists one Antrea resource, in all namespaces.
func (l loader) listDynamic(ctx context.Context, dyn dynamic.Interface, r antreaResource) ([]cluster.Object, error) {
	name := r.resource + "." + antreaGroupVersion.Group
	var out []cluster.Object
	client := dyn.Resource(antreaGroupVersion.WithResource(r.resource))
	err := pages(ctx, name, l.pageSize, func(ctx context.Context, opts metav1.ListOptions) (string, error) {
		list, err := client.List(ctx, opts)
		if err != nil {
			return "", err
		}
		for i := range list.Items {
			it := &list.Items[i]
			// The server sets both on each item; a missing one would make
			// Build skip the object, so fill them in rather than trust.
			if it.GetAPIVersion() == "" {
				it.SetAPIVersion(antreaGroupVersion.String())
			}
			if it.GetKind() == "" {
				it.SetKind(r.kind)
			}
			if it.GetKind() != r.kind {
				return "", fmt.Errorf("%s %q has kind %q, want %s", name, it.GetName(), it.GetKind(), r.kind)
			}
			raw, err := it.MarshalJSON()
			if err != nil {
				return "", fmt.Errorf("encoding %s: %w", describe(r.kind, it.GetNamespace(), it.GetName()), err)
			}
			out = append(out, cluster.Object{
				APIVersion: it.GetAPIVersion(), Kind: r.kind, Namespace: it.GetNamespace(), Name: it.GetName(),
				Source: l.source + " " + name, Raw: raw,
			})
		}
		return list.GetContinue(), nil
	}, func() { out = nil })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Clients builds the typed and dynamic clients for cfg.
func Clients(cfg *rest.Config) (kubernetes.Interface, dynamic.Interface, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return client, dyn, nil
}

// InCluster reports whether the process runs in a Pod (the API server's
// address is in the environment), where RESTConfig("") can work.
func InCluster() bool {
	return os.Getenv("KUBERNETES_SERVICE_HOST") != ""
}

// RESTConfig returns the client configuration: the current context of the
// kubeconfig file at path, or the in-cluster configuration (the Pod's
// service account) when path is empty. Typed requests ask for protobuf,
// which is faster than JSON on big lists; the dynamic client uses JSON
// whatever this says.
func RESTConfig(path string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path != "" {
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	} else {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration: %w", err)
		}
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	if cfg.UserAgent == "" {
		cfg.UserAgent = "sluice-traceflow"
	}
	// A big cluster takes many pages; client-go's default of 5 requests a
	// second would make reading it slower than tracing.
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	return cfg, nil
}
