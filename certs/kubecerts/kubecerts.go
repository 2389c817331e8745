// Package kubecerts keeps the aggregator's generated TLS material in
// Kubernetes, under the names the reference Flow Aggregator uses, so that
// exporters on every Node can fetch it through the API:
//
//   - Secret flow-aggregator-ca-tls (ca.crt, ca.key): the CA, so that it
//     survives aggregator restarts (its certificate directory is an
//     emptyDir); only the aggregator may read it.
//   - ConfigMap flow-aggregator-ca (ca.crt): the CA certificate exporters
//     check the aggregator against.
//   - Secret flow-aggregator-client-tls (kubernetes.io/tls: tls.crt,
//     tls.key, ca.crt): the exporters' client certificate.
//
// The aggregator calls Restore before it generates or renews certificates
// in its directory (package certs) and Publish after; exporters call Fetch.
//
// The aggregator creates these objects at run time, so Helm does not know
// them: Publish gives them an owner reference to an object of the release
// (the aggregator's ConfigMap, see Owner), and Kubernetes' garbage
// collector deletes them when `helm uninstall` deletes that object. Were
// they left behind, a reinstall would take up the old CA.
package kubecerts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sluice/certs"
)

// Object names, as the reference's.
const (
	CASecret     = "flow-aggregator-ca-tls"
	CAConfigMap  = "flow-aggregator-ca"
	ClientSecret = "flow-aggregator-client-tls"
)

// ErrCAConflict is returned by Publish when another aggregator (a replica
// started at the same time) published a different CA first.
var ErrCAConflict = errors.New("kubecerts: another aggregator published its CA first; a restart adopts it")

// Restore writes the CA kept in the cluster into dir when dir has none, so
// that certs.Ensure issues from it instead of making a new CA. It does
// nothing when the Secret does not exist yet (first start). It reports
// whether the cluster holds a CA: only then may Publish replace it (with a
// renewed one).
func Restore(ctx context.Context, client kubernetes.Interface, ns, dir string) (found bool, err error) {
	s, err := client.CoreV1().Secrets(ns).Get(ctx, CASecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("kubecerts: reading Secret %s/%s: %w", ns, CASecret, err)
	}
	if _, err := os.Stat(filepath.Join(dir, certs.CACertFile)); err == nil {
		return true, nil
	}
	crt, key := s.Data[certs.CACertFile], s.Data[certs.CAKeyFile]
	if len(crt) == 0 || len(key) == 0 {
		return true, fmt.Errorf("kubecerts: Secret %s/%s lacks %s or %s", ns, CASecret, certs.CACertFile, certs.CAKeyFile)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return true, fmt.Errorf("kubecerts: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, certs.CAKeyFile), key, 0o600); err != nil {
		return true, fmt.Errorf("kubecerts: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, certs.CACertFile), crt, 0o644); err != nil {
		return true, fmt.Errorf("kubecerts: %w", err)
	}
	return true, nil
}

// OwnerConfigMapEnv names the environment variable holding the name of
// the ConfigMap, in the aggregator's namespace, that owns the published
// objects: the chart sets it to the aggregator's own ConfigMap
// (<fullname>-configmap), as the reference's chart sets it.
const OwnerConfigMapEnv = "FA_CONFIG_MAP_NAME"

// Owner returns an owner reference to the ConfigMap name in namespace ns,
// for Publish. It needs get on that ConfigMap.
func Owner(ctx context.Context, client kubernetes.Interface, ns, name string) (*metav1.OwnerReference, error) {
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubecerts: reading ConfigMap %s/%s, the owner of the certificate objects: %w", ns, name, err)
	}
	// Neither controller nor blockOwnerDeletion: the owner is not a
	// controller of these objects, and blocking its deletion would need
	// update on its finalizers where that is enforced.
	return &metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: cm.Name, UID: cm.UID}, nil
}

// withOwner returns refs with owner in it and whether that changed refs.
// A reference to an object of the owner's kind and name with another UID
// (an owner deleted and created again) is replaced; other owners stay.
func withOwner(refs []metav1.OwnerReference, owner *metav1.OwnerReference) ([]metav1.OwnerReference, bool) {
	if owner == nil {
		return refs, false
	}
	out := make([]metav1.OwnerReference, 0, len(refs)+1)
	have := false
	for _, r := range refs {
		switch {
		case r.UID == owner.UID:
			have = true
			out = append(out, r)
		case r.Kind == owner.Kind && r.Name == owner.Name && r.APIVersion == owner.APIVersion:
			// a stale reference: dropped
		default:
			out = append(out, r)
		}
	}
	if have && len(out) == len(refs) {
		return refs, false
	}
	if !have {
		out = append(out, *owner)
	}
	return out, true
}

// Publish creates or updates the CA Secret, the CA ConfigMap and the
// client Secret in namespace ns from the files in dir, leaving objects
// that already hold the same data and owner untouched. replaceCA is
// Restore's answer: a CA Secret that appeared since (another replica's) is
// never overwritten; that is ErrCAConflict. With owner (see Owner), every
// object gets an owner reference to it, including objects an earlier
// version created without one; nil leaves owner references as they are.
func Publish(ctx context.Context, client kubernetes.Interface, ns, dir string, replaceCA bool, owner *metav1.OwnerReference) error {
	read := func(name string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("kubecerts: %w", err)
		}
		return b, nil
	}
	ca, err := read(certs.CACertFile)
	if err != nil {
		return err
	}
	caKey, err := read(certs.CAKeyFile)
	if err != nil {
		return err
	}
	crt, err := read(certs.ClientCertFile)
	if err != nil {
		return err
	}
	key, err := read(certs.ClientKeyFile)
	if err != nil {
		return err
	}
	labels := map[string]string{"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": "aggregator"}
	meta := func(name string) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}
		m.OwnerReferences, _ = withOwner(nil, owner)
		return m
	}
	if err := putSecret(ctx, client, &corev1.Secret{
		ObjectMeta: meta(CASecret),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{certs.CACertFile: ca, certs.CAKeyFile: caKey},
	}, replaceCA, owner); err != nil {
		return err
	}
	if err := putConfigMap(ctx, client, &corev1.ConfigMap{
		ObjectMeta: meta(CAConfigMap),
		Data:       map[string]string{certs.CACertFile: string(ca)},
	}, owner); err != nil {
		return err
	}
	return putSecret(ctx, client, &corev1.Secret{
		ObjectMeta: meta(ClientSecret),
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, certs.CACertFile: ca},
	}, true, owner)
}

// putSecret creates want or updates it when its data or owner differ;
// with replace false, differing data is ErrCAConflict instead.
func putSecret(ctx context.Context, client kubernetes.Interface, want *corev1.Secret, replace bool, owner *metav1.OwnerReference) error {
	api := client.CoreV1().Secrets(want.Namespace)
	have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err := api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) && !replace {
			return ErrCAConflict
		}
		if err != nil {
			return fmt.Errorf("kubecerts: creating Secret %s/%s: %w", want.Namespace, want.Name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("kubecerts: reading Secret %s/%s: %w", want.Namespace, want.Name, err)
	}
	refs, adopt := withOwner(have.OwnerReferences, owner)
	same := sameBytes(have.Data, want.Data)
	if same && !adopt {
		return nil
	}
	if !same && !replace {
		return ErrCAConflict
	}
	if !same {
		have.Data, have.Type = want.Data, want.Type
	}
	have.OwnerReferences = refs
	if _, err := api.Update(ctx, have, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("kubecerts: updating Secret %s/%s: %w", want.Namespace, want.Name, err)
	}
	return nil
}

func putConfigMap(ctx context.Context, client kubernetes.Interface, want *corev1.ConfigMap, owner *metav1.OwnerReference) error {
	api := client.CoreV1().ConfigMaps(want.Namespace)
	have, err := api.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := api.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("kubecerts: creating ConfigMap %s/%s: %w", want.Namespace, want.Name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("kubecerts: reading ConfigMap %s/%s: %w", want.Namespace, want.Name, err)
	}
	refs, adopt := withOwner(have.OwnerReferences, owner)
	if have.Data[certs.CACertFile] == want.Data[certs.CACertFile] && !adopt {
		return nil
	}
	have.Data, have.OwnerReferences = want.Data, refs
	if _, err := api.Update(ctx, have, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("kubecerts: updating ConfigMap %s/%s: %w", want.Namespace, want.Name, err)
	}
	return nil
}

func sameBytes(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// Fetch reads the CA ConfigMap and the client Secret from namespace ns and
// writes ca.crt, client.crt and client.key into dir (created 0700), the
// layout the exporter's --tls-cert-dir takes. It needs get on those two
// objects only.
func Fetch(ctx context.Context, client kubernetes.Interface, ns, dir string) error {
	cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, CAConfigMap, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kubecerts: reading ConfigMap %s/%s: %w", ns, CAConfigMap, err)
	}
	s, err := client.CoreV1().Secrets(ns).Get(ctx, ClientSecret, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("kubecerts: reading Secret %s/%s: %w", ns, ClientSecret, err)
	}
	ca, crt, key := []byte(cm.Data[certs.CACertFile]), s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
	if len(ca) == 0 || len(crt) == 0 || len(key) == 0 {
		return fmt.Errorf("kubecerts: ConfigMap %s or Secret %s in %s is incomplete", CAConfigMap, ClientSecret, ns)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("kubecerts: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{{certs.CACertFile, ca, 0o644}, {certs.ClientCertFile, crt, 0o644}, {certs.ClientKeyFile, key, 0o600}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return fmt.Errorf("kubecerts: %w", err)
		}
	}
	return nil
}

// CollectorPEM is the TLS material for the external collector that
// ReadCollectorSecrets read; parts whose Secret was not named are empty.
type CollectorPEM struct {
	CA, Cert, Key certs.PEM
}

// ReadCollectorSecrets reads flowCollector.tls's Secrets from namespace
// ns, as the reference's keys have them: the CA from key ca.crt of Secret
// caSecret, the client pair from keys tls.crt and tls.key of the
// kubernetes.io/tls Secret clientSecret. An empty name reads nothing. It
// needs get on the two Secrets only.
func ReadCollectorSecrets(ctx context.Context, client kubernetes.Interface, ns, caSecret, clientSecret string) (CollectorPEM, error) {
	var out CollectorPEM
	read := func(name string, keys ...string) ([]certs.PEM, error) {
		s, err := client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("kubecerts: reading Secret %s/%s: %w", ns, name, err)
		}
		pems := make([]certs.PEM, len(keys))
		for i, k := range keys {
			if len(s.Data[k]) == 0 {
				return nil, fmt.Errorf("kubecerts: Secret %s/%s has no %s", ns, name, k)
			}
			pems[i] = certs.PEM{Data: s.Data[k], Name: fmt.Sprintf("Secret %s/%s key %s", ns, name, k)}
		}
		return pems, nil
	}
	if caSecret != "" {
		p, err := read(caSecret, certs.CACertFile)
		if err != nil {
			return CollectorPEM{}, err
		}
		out.CA = p[0]
	}
	if clientSecret != "" {
		p, err := read(clientSecret, corev1.TLSCertKey, corev1.TLSPrivateKeyKey)
		if err != nil {
			return CollectorPEM{}, err
		}
		out.Cert, out.Key = p[0], p[1]
	}
	return out, nil
}
