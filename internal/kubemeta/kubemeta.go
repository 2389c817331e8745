// Package kubemeta holds what the informer caches of Pod metadata (enrich)
// and of the attribution model (traceflow/cluster/kube) share.
package kubemeta

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Trim keeps of an object's metadata its identity, labels (an
// EndpointSlice names its Service by label, selectors read Pods') and what
// the informers use (resourceVersion tells updates from resyncs); managed
// fields, annotations and owner references go, which is most of a cached
// object's size.
func Trim(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         m.Namespace,
		UID:               m.UID,
		ResourceVersion:   m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp,
		DeletionTimestamp: m.DeletionTimestamp,
		Labels:            m.Labels,
	}
}
