package enrich

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/kubetrim"
)

// TestSharedTransformKeepsWhatEnrichReads: the shared informers'
// transform (kubetrim.Object) keeps everything trimObject keeps, so that a
// Kube on shared informers reads what it would read on its own.
func TestSharedTransformKeepsWhatEnrichReads(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "o", Namespace: "ns", UID: "u-1", ResourceVersion: "7", Labels: map[string]string{"app": "web"},
		Annotations:     map[string]string{"big": "x"},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubelet"}},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-1", UID: "rs-1", Controller: new(true)}, {Kind: "Other", Name: "x"}}}
	for _, o := range []any{
		&corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "img"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", PodIPs: []corev1.PodIP{{IP: "10.0.0.5"}, {IP: "fd00::5"}}}},
		&corev1.Node{ObjectMeta: meta, Spec: corev1.NodeSpec{PodCIDR: "10.0.0.0/24", PodCIDRs: []string{"10.0.0.0/24"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"}}}},
		&corev1.Service{ObjectMeta: meta, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
	} {
		want, err := trimObject(o)
		if err != nil {
			t.Fatal(err)
		}
		sharedObj, err := kubetrim.Object(o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := trimObject(sharedObj)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("%T: the shared cache loses (-own +shared):\n%s", o, d)
		}
	}
}
