package kubecerts

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestWithOwner(t *testing.T) {
	owner := &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "fa-configmap", UID: "new"}
	other := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "fa", UID: "d"}
	stale := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "fa-configmap", UID: "old"}
	for _, c := range []struct {
		name    string
		in      []metav1.OwnerReference
		owner   *metav1.OwnerReference
		want    []metav1.OwnerReference
		changed bool
	}{
		{"no owner given", []metav1.OwnerReference{other}, nil, []metav1.OwnerReference{other}, false},
		{"adopted", nil, owner, []metav1.OwnerReference{*owner}, true},
		{"already owned", []metav1.OwnerReference{other, *owner}, owner, []metav1.OwnerReference{other, *owner}, false},
		{"other owners kept", []metav1.OwnerReference{other}, owner, []metav1.OwnerReference{other, *owner}, true},
		// The ConfigMap was deleted and created again (a reinstall): the
		// reference to the old one would keep nothing alive.
		{"stale reference replaced", []metav1.OwnerReference{stale, other}, owner, []metav1.OwnerReference{other, *owner}, true},
	} {
		got, changed := withOwner(c.in, c.owner)
		if !reflect.DeepEqual(got, c.want) || changed != c.changed {
			t.Errorf("%s: withOwner = %+v, %v; want %+v, %v", c.name, got, changed, c.want, c.changed)
		}
	}
}
