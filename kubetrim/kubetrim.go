// Package kubetrim trims the Kubernetes objects informer caches keep to
// what Sluice reads. It holds the trimming the caches of Pod metadata
// (enrich) and of the attribution model (traceflow/cluster/kube) share.
package kubetrim

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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

// Node keeps of a Node what both caches read: its Pod CIDRs and its
// InternalIP addresses (not the heartbeat status that changes every few
// seconds).
func Node(o *corev1.Node) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: Trim(&o.ObjectMeta),
		Spec:       corev1.NodeSpec{PodCIDR: o.Spec.PodCIDR, PodCIDRs: o.Spec.PodCIDRs},
	}
	for _, a := range o.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			n.Status.Addresses = append(n.Status.Addresses, a)
		}
	}
	return n
}
