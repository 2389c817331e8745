package kube_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sluice/certs"
	"sluice/certs/kubecerts"
	"sluice/test/kube/kubetest"
)

// TestCertificateObjectsOwned: the aggregator, run as the chart runs it
// (the release's ServiceAccount and RBAC, POD_NAMESPACE and
// FA_CONFIG_MAP_NAME of the rendered Deployment), makes the release's
// ConfigMap the owner of the CA Secret, the CA ConfigMap and the client
// Secret it creates, and adopts those an older version created without an
// owner (keeping their CA). Kubernetes' garbage collector then deletes
// them when `helm uninstall` deletes the ConfigMap; no controller-manager
// runs here, so the test checks the owner references the collector
// follows.
func TestCertificateObjectsOwned(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	const release, ns = "owned", "owned-certs"
	out, err := render(t, release, ns, "createNamespace=true", "exporter.enable=false", "sluice.traceflow.enable=false")
	if err != nil {
		t.Fatal(err)
	}
	applyYAML(t, ctx, c, out)
	var d appsv1.Deployment
	parseRendered(t, out).get(t, "Deployment", release+"-flow-aggregator", &d)
	var ownerName string
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == kubecerts.OwnerConfigMapEnv {
			ownerName = e.Value
		}
	}
	if ownerName == "" {
		t.Fatalf("the Deployment sets no %s", kubecerts.OwnerConfigMapEnv)
	}
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	owner, err := admin.CoreV1().ConfigMaps(ns).Get(ctx, ownerName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s names %q, not a ConfigMap of the release: %v", kubecerts.OwnerConfigMapEnv, ownerName, err)
	}
	rc, err := c.ServiceAccountConfig(ctx, ns, d.Spec.Template.Spec.ServiceAccountName)
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kubetest.WriteKubeconfig(kc, rc); err != nil {
		t.Fatal(err)
	}
	env := []string{"POD_NAMESPACE=" + ns, kubecerts.OwnerConfigMapEnv + "=" + ownerName}
	publish := func(t *testing.T) {
		t.Helper()
		agg := startAggregatorWith(t, aggregatorOptions{kubeconfig: kc, grpc: true, env: env}, startJSONCollector(t))
		agg.waitPublished(t, ctx)
	}

	t.Run("adopts", func(t *testing.T) {
		// What an aggregator before owner references left in the cluster.
		old := t.TempDir()
		if _, err := certs.Ensure(old, certs.Options{}); err != nil {
			t.Fatal(err)
		}
		if err := kubecerts.Publish(ctx, admin, ns, old, true, nil); err != nil {
			t.Fatal(err)
		}
		oldCA, err := os.ReadFile(filepath.Join(old, certs.CACertFile))
		if err != nil {
			t.Fatal(err)
		}
		checkOwned(t, admin, ns, nil)
		publish(t)
		checkOwned(t, admin, ns, owner)
		s, err := admin.CoreV1().Secrets(ns).Get(ctx, kubecerts.CASecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(s.Data[certs.CACertFile]) != string(oldCA) {
			t.Error("adopting the CA Secret replaced the CA")
		}
	})

	t.Run("creates", func(t *testing.T) {
		for _, del := range []func() error{
			func() error {
				return admin.CoreV1().Secrets(ns).Delete(ctx, kubecerts.CASecret, metav1.DeleteOptions{})
			},
			func() error {
				return admin.CoreV1().Secrets(ns).Delete(ctx, kubecerts.ClientSecret, metav1.DeleteOptions{})
			},
			func() error {
				return admin.CoreV1().ConfigMaps(ns).Delete(ctx, kubecerts.CAConfigMap, metav1.DeleteOptions{})
			},
		} {
			if err := del(); err != nil {
				t.Fatal(err)
			}
		}
		publish(t)
		checkOwned(t, admin, ns, owner)
	})
}

// checkOwned checks that the three certificate objects have exactly one
// owner reference, to owner (none when owner is nil), neither controller
// nor blocking the owner's deletion.
func checkOwned(t *testing.T, cs kubernetes.Interface, ns string, owner *corev1.ConfigMap) {
	t.Helper()
	ctx := testContext(t, 30*time.Second)
	metas := map[string]metav1.ObjectMeta{}
	for _, name := range []string{kubecerts.CASecret, kubecerts.ClientSecret} {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		metas["Secret "+name] = s.ObjectMeta
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, kubecerts.CAConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	metas["ConfigMap "+kubecerts.CAConfigMap] = cm.ObjectMeta
	for what, m := range metas {
		refs := m.OwnerReferences
		if owner == nil {
			if len(refs) != 0 {
				t.Errorf("%s: owners %+v, want none", what, refs)
			}
			continue
		}
		if len(refs) != 1 {
			t.Errorf("%s: owners %+v, want ConfigMap %s", what, refs, owner.Name)
			continue
		}
		r := refs[0]
		if r.APIVersion != "v1" || r.Kind != "ConfigMap" || r.Name != owner.Name || r.UID != owner.UID ||
			r.Controller != nil || r.BlockOwnerDeletion != nil {
			t.Errorf("%s: owner %+v, want v1 ConfigMap %s uid %s", what, r, owner.Name, owner.UID)
		}
	}
}
