package kube_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"sluice/test/kube/kubetest"
)

// TestServerSideApply applies deploy/sluice.yaml, and the chart rendered
// for every variant of TestChartRenders (each as its own release in its own
// namespace), with server-side apply on the real API server: every object
// must be accepted, CRDs included.
func TestServerSideApply(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	manifests := map[string][]byte{}
	b, err := os.ReadFile("../../deploy/sluice.yaml")
	if err != nil {
		t.Fatal(err)
	}
	manifests["deploy/sluice.yaml"] = b
	for i, v := range chartVariants() {
		out, err := render(t, fmt.Sprintf("ssa%d", i), fmt.Sprintf("ssa-%s", v.name), append(v.set, "createNamespace=true")...)
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		manifests[v.name] = out
	}
	for name, m := range manifests {
		objs, err := kubetest.Objects(m)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res, err := c.ServerSideApply(ctx, objs)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(res) != len(objs) {
			t.Errorf("%s: %d of %d objects applied", name, len(res), len(objs))
		}
		kinds := map[string]int{}
		for _, r := range res {
			kinds[r.Object.GetKind()]++
			if r.Err != nil {
				t.Errorf("%s: %v", name, r.Err)
			}
		}
		if kinds["Namespace"] != 1 {
			t.Errorf("%s: %d Namespaces (want the release's own)", name, kinds["Namespace"])
		}
		t.Logf("%s: %d objects accepted: %v", name, len(res), kinds)
	}
}
