package kube_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sluice/test/kube/kubetest"
)

// env is what TestMain prepares once for every test of the package: one
// control plane (starting one takes about 15 s) and one sluice binary.
type env struct {
	cluster *kubetest.Cluster
	sluice  string // path of the sluice binary
	err     error  // why the control plane or the binary is missing
}

// shared is set by TestMain before any test runs and only read after.
var shared env

func TestMain(m *testing.M) {
	flag.Parse()
	code := func() int {
		dir, err := os.MkdirTemp("", "sluice-kube-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if testing.Short() {
			shared.err = fmt.Errorf("-short")
			return m.Run()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		shared.sluice = filepath.Join(dir, "sluice")
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", shared.sluice, "sluice/cmd/sluice").CombinedOutput(); err != nil {
			shared.err = fmt.Errorf("go build sluice: %v\n%s", err, out)
			return m.Run()
		}
		c, err := kubetest.Start(ctx, filepath.Join(dir, "cluster"))
		if err != nil {
			shared.err = err
			return m.Run()
		}
		defer c.Stop()
		shared.cluster = c
		return m.Run()
	}()
	os.Exit(code)
}

const requirePeersEnv = "SLUICE_REQUIRE_PEERS"

// cluster returns the shared control plane; without one the test skips,
// or fails when SLUICE_REQUIRE_PEERS=1.
func cluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	if shared.cluster == nil {
		missing(t, fmt.Sprintf("no control plane: %v", shared.err))
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs := shared.cluster.Logs()
			if len(logs) > 4000 {
				logs = logs[len(logs)-4000:]
			}
			t.Logf("control plane log (tail):\n%s", logs)
		}
	})
	return shared.cluster
}

func helm(t *testing.T) string {
	t.Helper()
	p := kubetest.HelmPath()
	if _, err := os.Stat(p); err != nil {
		missing(t, fmt.Sprintf("helm %s: %v (run scripts/build-helm.sh)", kubetest.HelmVersion, err))
	}
	return p
}

func missing(t *testing.T, why string) {
	t.Helper()
	if os.Getenv(requirePeersEnv) == "1" {
		t.Fatalf("%s (required: %s=1)", why, requirePeersEnv)
	}
	t.Skipf("%s; set %s=1 to make this a failure", why, requirePeersEnv)
}

func testContext(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// chartDir is the chart, relative to this package.
const chartDir = "../../deploy/helm/sluice"

// render runs helm template on the chart with release name, namespace and
// --set values; it returns the manifest, or helm's error output.
func render(t *testing.T, release, ns string, set ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", ns}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm(t), args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// poll calls cond until it is true or ctx ends.
func poll(ctx context.Context, what string, cond func() (bool, error)) error {
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
