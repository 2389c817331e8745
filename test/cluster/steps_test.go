package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/chromedp/chromedp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/internal/testkit/chserver"
	"sluice/internal/testkit/stubcollector"
	chsink "sluice/sink/clickhouse"
)

const (
	chUser     = "sluice"
	chPassword = "s3cret-for-the-test"
)

// clickHouse is a clickhouse-server on the Node's bridge address with the
// flows table made as docs/sinks.md says (`sluice clickhouse schema`).
type clickHouse struct {
	*chserver.Server
	conn ch.Conn
}

func startClickHouse(t *testing.T) *clickHouse {
	t.Helper()
	srv := chserver.Start(t, chserver.Options{Host: nodeIP, Users: map[string]string{chUser: chPassword}})
	conn, err := ch.Open(&ch.Options{Addr: []string{srv.Addr}, Auth: ch.Auth{Username: chUser, Password: chPassword}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sv, err := conn.ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	stmts, _ := chsink.Schema(chsink.SchemaOptions{Server: chsink.Version{Major: sv.Version.Major, Minor: sv.Version.Minor, Patch: sv.Version.Patch}})
	for _, s := range stmts {
		if err := conn.Exec(ctx, s.SQL); err != nil {
			t.Fatalf("%s: %v", s.Object, err)
		}
	}
	return &clickHouse{Server: srv, conn: conn}
}

func (c *clickHouse) count(ctx context.Context, where string) (uint64, error) {
	var n uint64
	err := c.conn.QueryRow(ctx, "SELECT count() FROM "+chsink.Table+" WHERE "+where).Scan(&n)
	return n, err
}

// portForward runs `kubectl port-forward` to a Deployment's port and
// returns the local address.
func (c *kc) portForward(t *testing.T, target, port string) string {
	t.Helper()
	cmd := exec.Command(c.kubectlBin, "-n", relNS, "port-forward", target, ":"+port)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// "Forwarding from 127.0.0.1:40135 -> 10351"
	re := regexp.MustCompile(`Forwarding from (127\.0\.0\.1:\d+) ->`)
	found := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		var acc []byte
		for {
			n, err := out.Read(buf)
			acc = append(acc, buf[:n]...)
			if m := re.FindSubmatch(acc); m != nil {
				found <- string(m[1])
				// Keep reading, so the pipe never fills.
				for {
					if _, err := out.Read(buf); err != nil {
						return
					}
				}
			}
			if err != nil {
				close(found)
				return
			}
		}
	}()
	select {
	case addr, ok := <-found:
		if !ok {
			t.Fatal("kubectl port-forward ended without forwarding")
		}
		return addr
	case <-time.After(time.Minute):
		t.Fatal("kubectl port-forward did not start within a minute")
	}
	return ""
}

// checkUI opens the web UI through `kubectl port-forward` in headless
// Chromium: the Flows page shows the client's rows naming both Pods.
func checkUI(t *testing.T, c *kc) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium: %v (scripts/install-deps.sh installs it)", err)
	}
	addr := c.portForward(t, "deployment/"+release, "10351")
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(bctx, 2*time.Minute)
	defer cancelT()
	// Rows whose source is demo/client and destination a server Pod.
	rows := `[...document.querySelectorAll('.tbody [role=row]')].filter(r => r.children[1].textContent === 'demo/client' && /^demo\/server-/.test(r.children[3].textContent)).length`
	if err := chromedp.Do(ctx, chromedp.Navigate("http://"+addr+"/#/flows?pod=client")); err != nil {
		t.Fatal(err)
	}
	pctx, cancelP := context.WithTimeout(ctx, 90*time.Second)
	defer cancelP()
	if _, err := chromedp.Run(pctx, chromedp.Poll[bool](rows+" > 0", chromedp.WithPollingInterval(500*time.Millisecond))); err != nil {
		text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 2000)`))
		t.Fatalf("the Flows page shows no demo/client → demo/server-… row: %v; it shows:\n%s", err, text)
	}
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](rows))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the Flows page draws %d rows of the client (its table renders the rows that fit the window)", n)

	// Its rows group the server Pods into their Deployment by the Pods'
	// owners, whatever their generated names look like.
	b, err := httpGet("http://" + addr + "/api/flows")
	if err != nil {
		t.Fatal(err)
	}
	var page struct {
		Rows []struct {
			SrcPod, DstPod, DstWl, DstWlKind string
		}
	}
	if err := json.Unmarshal(b, &page); err != nil {
		t.Fatal(err)
	}
	grouped := 0
	for _, r := range page.Rows {
		if r.SrcPod != "client" || !strings.HasPrefix(r.DstPod, "server-") {
			continue
		}
		if r.DstWl != "server" || r.DstWlKind != "Deployment" {
			t.Errorf("the UI puts Pod %s in workload %s %q, want Deployment \"server\"", r.DstPod, r.DstWlKind, r.DstWl)
		}
		grouped++
	}
	if grouped == 0 {
		t.Error("/api/flows has no row of the client")
	}
}

// upgradeToProxy: `helm upgrade` to Proxy mode with two replicas and an
// HPA while a client runs across it. Records keep flowing, the exporter
// reconnects by itself, and the test counts what the collector never got.
func upgradeToProxy(t *testing.T, c *kc, ipfix *stubcollector.Collector) {
	const n = 60
	// client2 waits until the servers let it in (the policy allows
	// app=client; the test's stand-in for an enforcing CNI learns it
	// here), then makes a request every half second, across the upgrade.
	c.apply(clientPod("client2", "client", n, bodyBytes, "5s", "--wait", "--interval", "500ms"))
	client2 := c.podIP(appNS, "client2")
	c.enforcePolicy(client2)
	// Wait for the first records of client2's requests, then upgrade
	// mid-run.
	waitFor(t, 2*time.Minute, "client2's first records", func() (bool, string) {
		for _, cn := range connsFrom(ipfix.Records(), client2) {
			if cn.revOctets >= bodyBytes {
				return true, ""
			}
		}
		return false, ""
	})
	before, _ := httpGet("http://127.0.0.1:10350/metrics")
	resentBefore, _ := metric(before, "sluice_exporter_records_resent_total")
	c.helm("upgrade", release, "deploy/helm/sluice", "-n", relNS, "--reuse-values", "--wait", "--timeout", "5m",
		"--set", "mode=Proxy", "--set", "flowLogger.enable=false", "--set", "autoscaling.enable=true", "--set", "autoscaling.minReplicas=2",
		"--set", "autoscaling.maxReplicas=3")
	c.waitReady(relNS, "app.kubernetes.io/component=aggregator", 2, 3*time.Minute)
	if ok, failed, _ := c.clientDone("client2"); ok != n || failed != 0 {
		t.Fatalf("client2: %d ok, %d failed", ok, failed)
	}
	// Every connection of client2 reaches the collector with its final
	// counters (the exporter reports each one every 5 s until conntrack
	// forgets it).
	var cs map[uint16]*conn
	waitFor(t, 3*time.Minute, "client2's connections at the collector", func() (bool, string) {
		cs = connsFrom(ipfix.Records(), client2)
		done := 0
		for _, cn := range cs {
			if cn.revOctets >= bodyBytes {
				done++
			}
		}
		return done == n, fmt.Sprintf("%d of %d", done, n)
	})
	after, _ := httpGet("http://127.0.0.1:10350/metrics")
	resentAfter, _ := metric(after, "sluice_exporter_records_resent_total")
	if v, _ := metric(after, "sluice_exporter_connected"); v != 1 {
		t.Errorf("the exporter is not connected after the upgrade (sluice_exporter_connected %v)", v)
	}
	if v, _ := metric(after, "sluice_exporter_records_dropped_total"); v != 0 {
		t.Errorf("the exporter dropped %v records", v)
	}
	proxied := 0
	for _, cn := range cs {
		if cn.viaProxy {
			proxied++
		}
	}
	if proxied == 0 {
		t.Error("no record of client2 came through Proxy mode")
	}
	t.Logf("across the upgrade: all %d connections of client2 at the collector with their final counters (0 lost), %d through Proxy mode; the exporter sent %v records again",
		n, proxied, resentAfter-resentBefore)
	hpa, err := c.cs.AutoscalingV2().HorizontalPodAutoscalers(relNS).Get(context.Background(), release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 2 {
		t.Errorf("HPA minReplicas %v", hpa.Spec.MinReplicas)
	}
}

// uninstall: `helm uninstall` leaves no object of the release, the CA
// the aggregator made included.
func uninstall(t *testing.T, c *kc) {
	c.helm("uninstall", release, "-n", relNS, "--wait", "--timeout", "3m")
	kinds := "deployments,daemonsets,replicasets,pods,services,configmaps,secrets,serviceaccounts,roles,rolebindings,horizontalpodautoscalers"
	waitFor(t, 3*time.Minute, "no object of the release", func() (bool, string) {
		left := []string{}
		out, err := c.try(c.kubectlBin, "-n", relNS, "get", kinds, "-o", "name")
		if err != nil {
			return false, err.Error()
		}
		for _, l := range strings.Fields(out) {
			// Objects every namespace has.
			if l == "configmap/kube-root-ca.crt" || l == "serviceaccount/default" || l == "secret/clickhouse-secret" {
				continue
			}
			left = append(left, l)
		}
		out, err = c.try(c.kubectlBin, "get", "clusterroles,clusterrolebindings", "-l", "app.kubernetes.io/instance="+release, "-o", "name")
		if err != nil {
			return false, err.Error()
		}
		left = append(left, strings.Fields(out)...)
		return len(left) == 0, strings.Join(left, " ")
	})
}
