package enrich

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// KubeAccess is one permission a Kube needs: a verb on a resource of the
// core API group at cluster scope.
type KubeAccess struct {
	Verb, Resource string
}

func (a KubeAccess) String() string {
	return a.Verb + " " + a.Resource
}

// KubeNeeds lists what a Kube needs: get, list and watch on pods, nodes and
// services in all namespaces.
func KubeNeeds() []KubeAccess {
	var out []KubeAccess
	for _, r := range []string{"pods", "nodes", "services"} {
		for _, v := range []string{"get", "list", "watch"} {
			out = append(out, KubeAccess{Verb: v, Resource: r})
		}
	}
	return out
}

// MissingKubeAccessError names the permissions the API server denied.
type MissingKubeAccessError struct {
	// User is who the API server says the credentials belong to, when it
	// said ("" otherwise).
	User    string
	Missing []KubeAccess
}

func (e *MissingKubeAccessError) Error() string {
	miss := make([]string, len(e.Missing))
	for i, m := range e.Missing {
		miss[i] = fmt.Sprintf("%q on %q", m.Verb, m.Resource)
	}
	who := "these credentials"
	if e.User != "" {
		who = e.User
	}
	return fmt.Sprintf("kubernetes: %s may not %s (core API group, all namespaces); "+
		"grant get, list and watch on pods, nodes and services in a ClusterRole bound to it (see docs/kubernetes.md#permissions-rbac)",
		who, strings.Join(miss, ", "))
}

// CheckKubeAccess asks the API server, with SelfSubjectAccessReviews (which
// every authenticated user may create), whether the client's credentials
// hold every permission of KubeNeeds. Denied permissions are returned as a
// *MissingKubeAccessError, so that a missing grant stops the start-up with
// its name rather than showing up later as endless watch retries. A review
// that cannot be made (API server unreachable) is logged and not an error:
// the informers retry, as when the API server is down at start-up.
func CheckKubeAccess(ctx context.Context, client kubernetes.Interface, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	var missing []KubeAccess
	for _, need := range KubeNeeds() {
		r, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: need.Verb, Resource: need.Resource, Version: "v1"}},
		}, metav1.CreateOptions{})
		if err != nil {
			log.WarnContext(ctx, "kubernetes: cannot check permissions; starting anyway", "error", err)
			return nil
		}
		if !r.Status.Allowed {
			missing = append(missing, need)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	e := &MissingKubeAccessError{Missing: missing}
	if rv, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{}); err == nil {
		e.User = rv.Status.UserInfo.Username
	}
	return e
}
