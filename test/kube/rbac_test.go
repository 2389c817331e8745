package kube_test

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// canI asks the API server whether rc's credentials may verb resource
// (core group, all namespaces).
func canI(ctx context.Context, rc *rest.Config, verb, resource string) (bool, error) {
	return canINamed(ctx, rc, verb, resource, "", "")
}

// canINamed asks about one object, name in namespace ns.
func canINamed(ctx context.Context, rc *rest.Config, verb, resource, ns, name string) (bool, error) {
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return false, err
	}
	r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verb, Resource: resource, Version: "v1", Namespace: ns, Name: name}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("access review %s %s: %w", verb, resource, err)
	}
	return r.Status.Allowed, nil
}
