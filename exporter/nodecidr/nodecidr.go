// Package nodecidr finds a Node's Pod CIDRs in its Node object, for an
// exporter started without --pod-cidr. It needs only "get" on nodes.
package nodecidr

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// RetryInterval is how long Lookup waits before it reads the Node again
// when it has no Pod CIDR yet or the read failed.
const RetryInterval = 2 * time.Second

// Lookup returns the Pod CIDRs of Node name: spec.podCIDRs, or
// spec.podCIDR on API servers that fill only that. A Node without one yet
// (the controller manager allocates them after the Node registers) and
// failed reads are retried until ctx ends; a denied or missing Node is
// returned at once, since waiting does not fix it.
func Lookup(ctx context.Context, client kubernetes.Interface, name string, log *slog.Logger) ([]netip.Prefix, error) {
	if log == nil {
		log = slog.Default()
	}
	var last error
	for {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case err != nil && permanent(err):
			return nil, fmt.Errorf("node %q: %w", name, err)
		case err != nil:
			last = err
			log.WarnContext(ctx, "reading the Node for its Pod CIDRs; retrying", "node", name, "error", err)
		default:
			p, err := podCIDRs(n)
			if err != nil {
				return nil, err
			}
			if len(p) > 0 {
				return p, nil
			}
			last = fmt.Errorf("node %q has no Pod CIDR yet", name)
			log.InfoContext(ctx, "the Node has no Pod CIDR yet; waiting", "node", name)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pod CIDRs of node %q: %w (last: %v)", name, ctx.Err(), last)
		case <-time.After(RetryInterval):
		}
	}
}

func podCIDRs(n *corev1.Node) ([]netip.Prefix, error) {
	vals := n.Spec.PodCIDRs
	if len(vals) == 0 && n.Spec.PodCIDR != "" {
		vals = []string{n.Spec.PodCIDR}
	}
	out := make([]netip.Prefix, 0, len(vals))
	for _, v := range vals {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return nil, fmt.Errorf("node %q: pod CIDR %q: %w", n.Name, v, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// permanent reports whether a read error will not go away by retrying.
func permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsUnauthorized(err)
}
