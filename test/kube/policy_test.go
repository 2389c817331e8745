package kube_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/test/kube/kubetest"
)

// TestPolicyRecommendApply: the policies `sluice policy recommend` writes
// from a demo run's flow log are accepted by server-side apply on the
// real API server, one file per object, and `sluice policy verify` passes
// them (exit status 0).
func TestPolicyRecommendApply(t *testing.T) {
	c := cluster(t)
	ctx := testContext(t, 3*time.Minute)
	run := t.TempDir()
	out, err := exec.CommandContext(ctx, shared.sluice, "demo", "--duration", "3s", "--ui-address", "", "--out", run).CombinedOutput()
	if err != nil {
		t.Fatalf("sluice demo: %v\n%s", err, out)
	}
	pdir := filepath.Join(t.TempDir(), "policies")
	for _, iso := range []string{"both", "ingress", "egress"} {
		dir := filepath.Join(pdir, iso)
		out, err = exec.CommandContext(ctx, shared.sluice, "policy", "recommend", "--flows", filepath.Join(run, "flows.log"),
			"--cluster", "../../examples/cluster", "--isolation", iso, "-o", dir).CombinedOutput()
		if err != nil {
			t.Fatalf("recommend --isolation %s: %v\n%s", iso, err, out)
		}
		files, err := os.ReadDir(dir)
		if err != nil || len(files) < 5 {
			t.Fatalf("--isolation %s: %d files in %s (%v)", iso, len(files), dir, err)
		}
		applied := 0
		for _, f := range files {
			b, err := os.ReadFile(filepath.Join(dir, f.Name()))
			if err != nil {
				t.Fatal(err)
			}
			objs, err := kubetest.Objects(b)
			if err != nil {
				t.Fatalf("%s: %v", f.Name(), err)
			}
			if len(objs) != 1 {
				t.Errorf("%s holds %d objects, want one", f.Name(), len(objs))
			}
			for _, o := range objs {
				if err := c.EnsureNamespace(ctx, o.GetNamespace()); err != nil {
					t.Fatal(err)
				}
			}
			res, err := c.ServerSideApply(ctx, objs)
			if err != nil {
				t.Fatalf("%s: %v", f.Name(), err)
			}
			for _, r := range res {
				if r.Err != nil {
					t.Errorf("%s: %v", f.Name(), r.Err)
				} else {
					applied++
				}
			}
		}
		t.Logf("--isolation %s: %d NetworkPolicies accepted", iso, applied)
		cmd := exec.CommandContext(ctx, shared.sluice, "policy", "verify", "--flows", filepath.Join(run, "flows.log"),
			"--cluster", "../../examples/cluster", "-f", dir)
		out, err = cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(string(out), " 0 newly blocked") {
			t.Errorf("verify --isolation %s: exit %d\n%s", iso, code, out)
		}
	}
}
