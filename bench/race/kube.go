package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"sluice/test/kube/kubetest"
)

// kube is the real control plane both aggregators run against.
type kube struct {
	c     *kubetest.Cluster
	admin *kubernetes.Clientset
}

func startKube(ctx context.Context, dir string) (*kube, error) {
	c, err := kubetest.Start(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("starting etcd and kube-apiserver: %w", err)
	}
	admin, err := c.AdminClient()
	if err != nil {
		c.Stop()
		return nil, err
	}
	k := &kube{c: c, admin: admin}
	// The reference reads the cluster's UUID from here at start-up and
	// exits without it.
	uuid := make([]byte, 16)
	_, _ = rand.Read(uuid)
	uuid[6], uuid[8] = uuid[6]&0x0f|0x40, uuid[8]&0x3f|0x80
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "antrea-cluster-identity"},
		Data: map[string]string{"uuid": fmt.Sprintf("%x-%x-%x-%x-%x", uuid[0:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:])}}
	if err := c.EnsureNamespace(ctx, "kube-system"); err != nil {
		k.stop()
		return nil, err
	}
	if _, err := admin.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		k.stop()
		return nil, fmt.Errorf("cluster identity ConfigMap: %w", err)
	}
	return k, nil
}

func (k *kube) stop() { k.c.Stop() }

// host and port of the API server, as in-cluster clients get them from
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
func (k *kube) hostPort() (string, string, error) {
	u, err := url.Parse(k.c.URL)
	if err != nil {
		return "", "", err
	}
	return u.Hostname(), u.Port(), nil
}

// namespace makes a namespace of its own for one run (so that the
// certificates one aggregator publishes are never read by the other), a
// ServiceAccount "flow-aggregator" bound to cluster-admin (what the
// aggregators may do is not what is measured), and a token for it.
func (k *kube) namespace(ctx context.Context, ns string) (*rest.Config, error) {
	if err := k.c.EnsureNamespace(ctx, ns); err != nil {
		return nil, err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "flow-aggregator"}}
	if _, err := k.admin.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("service account: %w", err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "race-" + ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "flow-aggregator"}}}
	if _, err := k.admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("cluster role binding: %w", err)
	}
	return k.c.ServiceAccountConfig(ctx, ns, "flow-aggregator")
}

// writeServiceAccount writes what the kubelet mounts at
// /var/run/secrets/kubernetes.io/serviceaccount into dir.
func writeServiceAccount(dir, ns string, rc *rest.Config) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"token": []byte(rc.BearerToken), "ca.crt": rc.CAData, "namespace": []byte(ns)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// clientTLS waits for the aggregator of namespace ns to publish its CA
// (ConfigMap flow-aggregator-ca) and the exporters' client certificate
// (Secret flow-aggregator-client-tls), as both the reference and Sluice do,
// and returns a client configuration with them. The server's name is not
// checked (the reference names itself flow-aggregator.<ns>.svc, Sluice
// otherwise); its chain to the published CA is.
func (k *kube) clientTLS(ctx context.Context, ns string, deadline time.Time) (*tls.Config, error) {
	for {
		cm, err1 := k.admin.CoreV1().ConfigMaps(ns).Get(ctx, "flow-aggregator-ca", metav1.GetOptions{})
		sec, err2 := k.admin.CoreV1().Secrets(ns).Get(ctx, "flow-aggregator-client-tls", metav1.GetOptions{})
		if err := errors.Join(err1, err2); err == nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM([]byte(cm.Data["ca.crt"])) {
				return nil, fmt.Errorf("ConfigMap %s/flow-aggregator-ca has no CA certificate", ns)
			}
			cert, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"])
			if err != nil {
				return nil, fmt.Errorf("client certificate in Secret %s/flow-aggregator-client-tls: %w", ns, err)
			}
			return &tls.Config{
				MinVersion:         tls.VersionTLS12,
				Certificates:       []tls.Certificate{cert},
				InsecureSkipVerify: true, // the chain is verified below, the name is not
				VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
					if len(raw) == 0 {
						return errors.New("no server certificate")
					}
					leaf, err := x509.ParseCertificate(raw[0])
					if err != nil {
						return err
					}
					inter := x509.NewCertPool()
					for _, r := range raw[1:] {
						if c, err := x509.ParseCertificate(r); err == nil {
							inter.AddCert(c)
						}
					}
					_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter})
					return err
				},
			}, nil
		} else if time.Now().After(deadline) {
			return nil, fmt.Errorf("the aggregator did not publish its certificates in %s: %w", ns, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond): // polling the API for the objects
		}
	}
}

func writeKubeconfig(path string, rc *rest.Config) error { return kubetest.WriteKubeconfig(path, rc) }
