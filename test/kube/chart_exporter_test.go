package kube_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sluice/flow"
	"sluice/internal/testkit/netns"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
)

// TestChartExporterNamesPods runs the exporter as the chart's DaemonSet
// does by default (its rendered arguments and environment, in-cluster
// credentials of its ServiceAccount bound by its RBAC) on a Node of its
// own: it resolves the aggregator's Service (the collector address is
// namespace/service) to the ClusterIP, connects there, and its records of
// a connection between two Pods of the Node carry both Pods' names, which
// only the exporter knows (the aggregator here has no metadata source),
// and the bytes conntrack counted.
func TestChartExporterNamesPods(t *testing.T) {
	c := cluster(t)
	requireNetns(t)
	ctx := testContext(t, 3*time.Minute)
	const release, ns, nodeName = "chx1", "sluice-chart-names", "chart-node-1"
	cr := installChart(t, ctx, c, release, ns)
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{PodCIDR: "10.244.61.0/24", PodCIDRs: []string{"10.244.61.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const clientIP, serverIP, serverPort = "10.244.61.2", "10.244.61.3", 8080
	for _, p := range []struct{ name, ip string }{{"client", clientIP}, {"server", serverIP}} {
		pod := newPod(ns, p.name, map[string]string{"app": p.name})
		pod.Spec.NodeName = nodeName
		created, err := admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		setPodIP(t, ctx, admin, created, p.ip)
	}

	// The aggregator, outside the cluster's view: no metadata source.
	out := stubcollector.New(t)
	certDir := t.TempDir()
	agg := testagg.Start(t, fmt.Sprintf(`
mode: Aggregate
aggregatorTransportProtocol: none
flowAggregatorAddress: %s.%s.svc
activeFlowRecordTimeout: 1s
inactiveFlowRecordTimeout: 5s
flowCollector: {enable: true, address: "%s:tcp"}
sluice: {ipfixAddress: "127.0.0.1:0", apiAddress: "127.0.0.1:0", grpcAddress: "127.0.0.1:0", tls: {certDir: %q}}
`, cr.fullname, ns, out.Addr(), certDir))
	cr.publishCerts(t, ctx, c, certDir)

	// The Node reaches the Service's ClusterIP, as kube-proxy would make
	// it, at the aggregator.
	svc, err := admin.CoreV1().Services(ns).Get(ctx, cr.fullname, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := svc.Spec.ClusterIP
	if net.ParseIP(clusterIP) == nil {
		t.Fatalf("Service %s/%s has no ClusterIP: %q", ns, cr.fullname, clusterIP)
	}
	n := newChartNode(t, c, nodeName)
	runCmd(t, "ip", "-n", n.netns, "addr", "add", clusterIP+"/32", "dev", "lo")
	n.forward(t, net.JoinHostPort(clusterIP, "14739"), agg.Addrs().GRPC)
	// The two Pods' addresses, in the Node's own namespace.
	for _, ip := range []string{clientIP, serverIP} {
		runCmd(t, "ip", "-n", n.netns, "addr", "add", ip+"/32", "dev", "lo")
	}

	e := n.startChartExporter(t, ctx, c, cr)
	if err := e.waitProbe(ctx, "/readyz", 200, "ok"); err != nil {
		t.Fatal(err)
	}

	// One connection, client → server, after the exporter started (and
	// turned conntrack's accounting on).
	var ln net.Listener
	if err := netns.Do(n.netns, func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(serverIP, "8080"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer s.Close()
		_, err = io.Copy(s, s) // echo
		served <- err
	}()
	var localPort uint16
	const payload = 5000
	if err := netns.Do(n.netns, func() error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(clientIP)}}
		cn, err := d.Dial("tcp", net.JoinHostPort(serverIP, "8080"))
		if err != nil {
			return err
		}
		defer cn.Close()
		localPort = uint16(cn.LocalAddr().(*net.TCPAddr).Port)
		if _, err := cn.Write([]byte(strings.Repeat("x", payload))); err != nil {
			return err
		}
		_ = cn.(*net.TCPConn).CloseWrite()
		got, err := io.Copy(io.Discard, cn)
		if err == nil && got != payload {
			err = fmt.Errorf("echoed %d of %d bytes", got, payload)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}

	var rec flow.Flow
	if err := poll(ctx, "the connection's record at the aggregator", func() (bool, error) {
		for _, r := range out.Records() {
			if r.Flow.SourcePort == localPort && r.Flow.DestinationPort == serverPort {
				rec = r.Flow
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("%v\nexporter log:\n%s", err, e.logs.String())
	}
	if rec.SourcePodName != "client" || rec.SourcePodNamespace != ns || rec.DestinationPodName != "server" ||
		rec.DestinationPodNamespace != ns || rec.SourceNodeName != nodeName || rec.FlowType != flow.FlowTypeIntraNode {
		t.Errorf("record %s/%s on %q → %s/%s, flow type %d; want %s/client on %s → %s/server, intra-Node", rec.SourcePodNamespace,
			rec.SourcePodName, rec.SourceNodeName, rec.DestinationPodNamespace, rec.DestinationPodName, rec.FlowType, ns, nodeName, ns)
	}
	if rec.Stats.OctetTotalCount < payload || rec.ReverseStats.OctetTotalCount < payload {
		t.Errorf("octets %d, reverse %d; want at least the %d bytes each way", rec.Stats.OctetTotalCount, rec.ReverseStats.OctetTotalCount, payload)
	}
	_, metrics, err := e.probe(ctx, "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sluice_exporter_connected 1", "sluice_exporter_conntrack_accounting 1"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	logs := e.logs.String()
	for _, bad := range []string{"no metadata source", "level=ERROR"} {
		if strings.Contains(logs, bad) {
			t.Errorf("exporter log has %q:\n%s", bad, logs)
		}
	}
	// The chart's default leaves policy attribution off.
	if strings.Contains(metrics, "sluice_exporter_attribution_generation") {
		t.Error("policy attribution is on with the chart's defaults")
	}
}

// TestChartExporterProbesWhileWaiting runs the exporter as the chart's
// DaemonSet does on a Node without a Pod CIDR, before the aggregator has
// published its certificates: /healthz answers 200 from the start, /readyz
// 503 saying what it waits for (the certificates, then the Pod CIDR), and
// 200 once the Node has a Pod CIDR. A SIGTERM while it waits ends it with
// exit status 0 and no error.
func TestChartExporterProbesWhileWaiting(t *testing.T) {
	c := cluster(t)
	requireNetns(t)
	ctx := testContext(t, 3*time.Minute)
	const release, ns, nodeName = "chx2", "sluice-chart-probes", "chart-node-2"
	cr := installChart(t, ctx, c, release, ns)
	admin, err := c.AdminClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := newChartNode(t, c, nodeName)

	// Stopped while it waits for the certificates.
	e := n.startChartExporter(t, ctx, c, cr)
	if err := e.waitProbe(ctx, "/healthz", 200, "ok"); err != nil {
		t.Fatal(err)
	}
	if err := e.waitProbe(ctx, "/readyz", 503, "waiting for the aggregator's certificates"); err != nil {
		t.Fatal(err)
	}
	if code, body, err := e.probe(ctx, "/metrics"); err != nil || code != 200 || !strings.Contains(body, "process_start_time_seconds") {
		t.Errorf("/metrics while waiting: %d, %v", code, err)
	}
	if err := e.stop(t); err != nil {
		var ee *exec.ExitError
		errors.As(err, &ee)
		t.Errorf("SIGTERM while waiting: %v (exit status %d), want exit status 0\n%s", err, ee.ExitCode(), e.logs.String())
	}
	if logs := e.logs.String(); strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "stopped before the set-up was complete") {
		t.Errorf("log of an exporter stopped while waiting:\n%s", logs)
	}

	// Again: the certificates come, then the Pod CIDR.
	e = n.startChartExporter(t, ctx, c, cr)
	if err := e.waitProbe(ctx, "/readyz", 503, "waiting for the aggregator's certificates"); err != nil {
		t.Fatal(err)
	}
	cr.publishCerts(t, ctx, c, t.TempDir())
	if err := e.waitProbe(ctx, "/readyz", 503, "waiting for a Pod CIDR of Node "+nodeName); err != nil {
		t.Fatal(err)
	}
	if code, _, err := e.probe(ctx, "/healthz"); err != nil || code != 200 {
		t.Errorf("/healthz while waiting for the Pod CIDR: %d, %v", code, err)
	}
	node, err := admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Spec.PodCIDR, node.Spec.PodCIDRs = "10.244.62.0/24", []string{"10.244.62.0/24"}
	if _, err := admin.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.waitProbe(ctx, "/readyz", 200, "ok"); err != nil {
		t.Fatal(err)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "10.244.62.0/24") {
		t.Errorf("the exporter's log does not name the Pod CIDR:\n%s", logs)
	}
}
