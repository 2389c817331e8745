// Package kubetrim trims the Kubernetes objects informer caches keep to
// what Sluice reads. It holds the trimming the caches of Pod metadata
// (enrich) and of the attribution model (traceflow/cluster/kube) share.
package kubetrim

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
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

// Object is the transform of an informer factory shared by the Pod
// metadata cache (enrich) and the cluster-state watch
// (traceflow/cluster/kube): it keeps what either reads, so that one cache
// serves both. Of a Pod: its identity and labels, its controller (its
// workload, for the web UI), the ipam.antrea.io/ippools annotation, its
// Node, hostNetwork, named container ports, phase and IPs. Of a Namespace
// its identity, labels and that annotation; of a Service its spec and
// load-balancer addresses; a Node as Node does; an EndpointSlice and a
// NetworkPolicy whole but for their metadata. Idempotent; other values
// (tombstones) pass.
func Object(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		m := withIPPools(&o.ObjectMeta)
		if c := metav1.GetControllerOfNoCopy(o); c != nil {
			m.OwnerReferences = []metav1.OwnerReference{{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name,
				UID: c.UID, Controller: c.Controller}}
		}
		return &corev1.Pod{
			ObjectMeta: m,
			Spec: corev1.PodSpec{NodeName: o.Spec.NodeName, HostNetwork: o.Spec.HostNetwork,
				Containers: NamedPorts(o.Spec.Containers)},
			Status: corev1.PodStatus{Phase: o.Status.Phase, PodIP: o.Status.PodIP, PodIPs: o.Status.PodIPs},
		}, nil
	case *corev1.Node:
		return Node(o), nil
	case *corev1.Namespace:
		return &corev1.Namespace{ObjectMeta: withIPPools(&o.ObjectMeta)}, nil
	case *corev1.Service:
		return &corev1.Service{ObjectMeta: Trim(&o.ObjectMeta), Spec: o.Spec,
			Status: corev1.ServiceStatus{LoadBalancer: o.Status.LoadBalancer}}, nil
	case *discoveryv1.EndpointSlice:
		c := *o
		c.ObjectMeta = Trim(&o.ObjectMeta)
		return &c, nil
	case *networkingv1.NetworkPolicy:
		return &networkingv1.NetworkPolicy{ObjectMeta: Trim(&o.ObjectMeta), Spec: o.Spec}, nil
	}
	return obj, nil
}

// AnnotationIPPools is Antrea's annotation naming the IPPools of a Pod or
// a Namespace (FlexibleIPAM).
const AnnotationIPPools = "ipam.antrea.io/ippools"

// withIPPools is Trim keeping the AnnotationIPPools annotation.
func withIPPools(m *metav1.ObjectMeta) metav1.ObjectMeta {
	t := Trim(m)
	if v, ok := m.Annotations[AnnotationIPPools]; ok {
		t.Annotations = map[string]string{AnnotationIPPools: v}
	}
	return t
}

// NamedPorts keeps of a Pod's containers only their named ports, which
// policy rules can name; nil when none has one.
func NamedPorts(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		var ports []corev1.ContainerPort
		for _, p := range c.Ports {
			if p.Name != "" {
				ports = append(ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
			}
		}
		if len(ports) > 0 {
			out = append(out, corev1.Container{Name: c.Name, Ports: ports})
		}
	}
	return out
}
