// Package clusterid finds the identity of the cluster the aggregator
// reads: the UUID Antrea keeps in the ConfigMap
// kube-system/antrea-cluster-identity (key "uuid"), which the reference
// Flow Aggregator exports as clusterId and derives its observation domain
// from; in a cluster without Antrea, the UID of the kube-system Namespace,
// which lives as long as the cluster does.
package clusterid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sluice/flow"
)

// Where an identity comes from.
const (
	Namespace = "kube-system"
	// ConfigMap is the name of Antrea's ConfigMap in Namespace; its Key
	// holds the UUID.
	ConfigMap = "antrea-cluster-identity"
	Key       = "uuid"

	SourceAntrea    = "configmap kube-system/antrea-cluster-identity"
	SourceNamespace = "namespace kube-system"
)

// Defaults of Options: the reference's poll (every second, ten seconds).
const (
	DefaultInterval = time.Second
	DefaultTimeout  = 10 * time.Second
)

// Identity is a cluster's UUID and where it was read.
type Identity struct {
	UUID   flow.UID
	Source string // SourceAntrea or SourceNamespace
}

// String is the UUID in its canonical text form (lowercase, dashed), as
// the reference sends it.
func (id Identity) String() string {
	const hex = "0123456789abcdef"
	b := make([]byte, 0, 36)
	for i, c := range id.UUID {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&0xf])
	}
	return string(b)
}

// Options tune Get.
type Options struct {
	// Interval between attempts and Timeout of them all; zero means the
	// defaults.
	Interval, Timeout time.Duration
	Log               *slog.Logger
}

// ErrForbidden is Get's error when the credentials may read neither the
// ConfigMap nor the Namespace.
var ErrForbidden = errors.New("may get neither configmap kube-system/antrea-cluster-identity nor namespace kube-system")

// Get reads the cluster's identity: Antrea's UUID when the ConfigMap
// exists, else (it is absent, or may not be read) the kube-system
// Namespace's UID. A ConfigMap without a valid UUID yet (Antrea's
// controller fills it in after creating it) and a failed request are
// retried every Interval until Timeout; then the last error is returned.
func Get(ctx context.Context, client kubernetes.Interface, o Options) (Identity, error) {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	warned := false
	for {
		id, err := attempt(ctx, client, o.Log)
		if err == nil {
			return id, nil
		}
		if errors.Is(err, ErrForbidden) {
			return Identity{}, err // asking again will not help
		}
		if !warned {
			o.Log.DebugContext(ctx, "cluster identity not read yet; retrying", "err", err)
			warned = true
		}
		select {
		case <-ctx.Done():
			return Identity{}, fmt.Errorf("cluster identity: %w (gave up after %s)", err, o.Timeout)
		case <-tick.C:
		}
	}
}

// attempt makes one try: the ConfigMap, then the Namespace.
func attempt(ctx context.Context, client kubernetes.Interface, log *slog.Logger) (Identity, error) {
	cm, err := client.CoreV1().ConfigMaps(Namespace).Get(ctx, ConfigMap, metav1.GetOptions{})
	cmForbidden := apierrors.IsForbidden(err)
	switch {
	case err == nil:
		text, ok := cm.Data[Key]
		if !ok {
			return Identity{}, fmt.Errorf("%s has no key %q yet", SourceAntrea, Key)
		}
		u, ok := flow.ParseUID(text)
		if !ok {
			return Identity{}, fmt.Errorf("%s: key %q is %q, not a UUID", SourceAntrea, Key, text)
		}
		return Identity{UUID: u, Source: SourceAntrea}, nil
	case apierrors.IsNotFound(err), cmForbidden:
		// No Antrea (or no right to read its ConfigMap): the Namespace.
	default:
		return Identity{}, fmt.Errorf("get %s: %w", SourceAntrea, err)
	}
	ns, err := client.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{})
	switch {
	case err == nil:
	case cmForbidden && apierrors.IsForbidden(err):
		return Identity{}, ErrForbidden
	default:
		return Identity{}, fmt.Errorf("get %s: %w", SourceNamespace, err)
	}
	u, ok := flow.ParseUID(string(ns.UID))
	if !ok {
		return Identity{}, fmt.Errorf("%s: UID %q is not a UUID", SourceNamespace, ns.UID)
	}
	if cmForbidden {
		// Antrea may well be there, with another UUID than the one the
		// reference would send: say so, it is a missing grant.
		log.WarnContext(ctx, "cluster identity: may not get "+SourceAntrea+"; using the UID of "+SourceNamespace+
			", which differs from Antrea's cluster UUID if Antrea runs here (grant get on the ConfigMap)")
	}
	return Identity{UUID: u, Source: SourceNamespace}, nil
}
