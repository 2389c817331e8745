package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"sluice/internal/testkit"
)

// TestConntrackAccounting: on a Node whose conntrack does not count
// (net.netfilter.nf_conntrack_acct=0, the kernel's default), the exporter
// turns accounting on where /proc/sys is writable, and says so; where it
// is read-only (a container that is not privileged) it warns once what to
// set on the Node, and its gauge says the counters are 0.
func TestConntrackAccounting(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("SLUICE_REQUIRE_PEERS") == "1" {
			t.Fatal("this test needs root (network and mount namespaces, conntrack)")
		}
		t.Skip("needs root: it creates network and mount namespaces and reads conntrack")
	}
	ip := need(t, "ip")
	need(t, "unshare")
	need(t, "nft")
	bin := sluiceBinary(t)
	sweepStale(ip)
	ns := fmt.Sprintf("slx%d-acct", os.Getpid())
	if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
		t.Skipf("network namespaces are not available here (ip netns add: %v: %s)", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ip, "netns", "del", ns).Run() })
	// A rule that uses conntrack, so that the namespace has its sysctls.
	run(t, ip, "netns", "exec", ns, "nft", "add", "table", "inet", "sluice")
	sysctl := func(set string) string {
		args := []string{ip, "netns", "exec", ns, "sysctl", "-n", "net.netfilter.nf_conntrack_acct"}
		if set != "" {
			args = []string{ip, "netns", "exec", ns, "sysctl", "-qw", "net.netfilter.nf_conntrack_acct=" + set}
		}
		return strings.TrimSpace(run(t, args...))
	}
	args := []string{"exporter", "--source", "conntrack", "--netns", ns, "--node", "node-1", "--pod-cidr", "10.10.1.0/24",
		"--collector", "127.0.0.1:9:tcp", "--poll-interval", "1s", "--metrics-address", "127.0.0.1:0"}

	t.Run("read-only", func(t *testing.T) {
		sysctl("0")
		// /proc/sys read-only in the exporter's own mount namespace, as
		// container runtimes mount it.
		logs := startWrapped(t, append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount -o bind,ro /proc/sys /proc/sys && exec "$@"`, "sh", bin}, args...)...)
		metrics := waitReady(t, logs)
		if !strings.Contains(metrics, "sluice_exporter_conntrack_accounting 0") {
			t.Errorf("gauge: want sluice_exporter_conntrack_accounting 0 in\n%s", grepLines(metrics, "conntrack_accounting"))
		}
		if got := sysctl(""); got != "0" {
			t.Errorf("nf_conntrack_acct = %s after a read-only attempt", got)
		}
		warn := regexp.MustCompile(`level=WARN msg="conntrack does not count bytes and packets.*Set the sysctl net.netfilter.nf_conntrack_acct=1 on the Node`)
		if n := len(warn.FindAllString(logs.String(), -1)); n != 1 {
			t.Errorf("%d warnings naming the sysctl to set, want 1:\n%s", n, logs.String())
		}
	})

	t.Run("writable", func(t *testing.T) {
		sysctl("0")
		logs := startWrapped(t, append([]string{bin}, args...)...)
		metrics := waitReady(t, logs)
		if !strings.Contains(metrics, "sluice_exporter_conntrack_accounting 1") {
			t.Errorf("gauge: want sluice_exporter_conntrack_accounting 1 in\n%s", grepLines(metrics, "conntrack_accounting"))
		}
		if got := sysctl(""); got != "1" {
			t.Errorf("nf_conntrack_acct = %s, want the exporter to have set 1", got)
		}
		if out := logs.String(); !strings.Contains(out, "turned conntrack accounting on") || strings.Contains(out, "conntrack does not count") {
			t.Errorf("log:\n%s", out)
		}
	})
}

// startWrapped runs cmd (the exporter, or a wrapper that execs it) and
// stops it with SIGTERM when the test ends.
func startWrapped(t *testing.T, cmd ...string) *testkit.LogBuffer {
	t.Helper()
	var logs testkit.LogBuffer
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Stdout, c.Stderr = &logs, &logs
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = c.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%v:\n%s", cmd, logs.String())
		}
	})
	return &logs
}

var metricsAddr = regexp.MustCompile(`serving /healthz, /readyz and /metrics" address=(\S+)`)

// waitReady waits for the exporter's /readyz (at the address it logs) to
// answer 200, and returns its /metrics.
func waitReady(t *testing.T, logs *testkit.LogBuffer) string {
	t.Helper()
	var addr string
	testkit.WaitFor(t, "the exporter's metrics address", func() bool {
		m := metricsAddr.FindStringSubmatch(logs.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testkit.WaitFor(t, "/readyz 200", func() bool { code, _ := get("/readyz"); return code == 200 })
	_, metrics := get("/metrics")
	return metrics
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
