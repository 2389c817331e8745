package kube

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/kubetrim"
	"sluice/traceflow/crd"
)

// TestSharedTransformKeepsWhatTheWatchReads: the shared informers'
// transform (kubetrim.Object) keeps everything this package's own
// transform keeps, so that a Watcher on shared informers sees what it
// would see on its own: trimming the shared cache's object gives what
// trimming the original does.
func TestSharedTransformKeepsWhatTheWatchReads(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "o", Namespace: "ns", UID: "u-1", ResourceVersion: "7", Labels: map[string]string{"app": "web"},
		Annotations:     map[string]string{crd.AnnotationIPPools: "pool-a", "big": "x"},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		OwnerReferences: []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-1", Controller: new(true)}}}
	port := int32(80)
	objs := []any{
		&corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true, Containers: []corev1.Container{
			{Name: "c", Image: "img", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {ContainerPort: 9}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}}},
		&corev1.Node{ObjectMeta: meta, Spec: corev1.NodeSpec{PodCIDR: "10.0.0.0/24", PodCIDRs: []string{"10.0.0.0/24"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"},
				{Type: corev1.NodeHostName, Address: "n1"}}}},
		&corev1.Namespace{ObjectMeta: meta},
		&corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
			Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "1.2.3.4"}}}}},
		&discoveryv1.EndpointSlice{ObjectMeta: meta, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.5"}}},
			Ports: []discoveryv1.EndpointPort{{Port: &port}}},
		&networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
	}
	for _, ippools := range []bool{true, false} {
		own := trimTyped(ippools)
		for _, o := range objs {
			want, err := own(o)
			if err != nil {
				t.Fatal(err)
			}
			sharedObj, err := kubetrim.Object(o)
			if err != nil {
				t.Fatal(err)
			}
			got, err := own(sharedObj)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("ippools=%v, %T: the shared cache loses (-own +shared):\n%s", ippools, o, d)
			}
		}
	}
}
