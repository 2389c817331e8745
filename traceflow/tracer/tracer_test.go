package tracer

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"sluice/traceflow/cluster"
	"sluice/traceflow/crd"
	"sluice/traceflow/flowspec"
	"sluice/traceflow/pipeline"
)

var fixedNow = func() time.Time { return time.Unix(1700000000, 0) }

// loadModel builds the fixture cluster, with overlays, in one mode.
func loadModel(t testing.TB, mode pipeline.TrafficMode, overlays ...string) *pipeline.Model {
	t.Helper()
	ctx := context.Background()
	objs, err := cluster.ReadPath(ctx, "../testdata/cluster")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range overlays {
		top, err := cluster.ReadPath(ctx, "../testdata/overlays/"+o)
		if err != nil {
			t.Fatal(err)
		}
		objs = cluster.Overlay(objs, top)
	}
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		t.Fatal(err)
	}
	cfg := pipeline.DefaultConfig()
	cfg.TrafficMode, cfg.Tag = mode, 7
	m, _, err := pipeline.Build(ctx, st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func trace(t testing.TB, m *pipeline.Model, src, dst, flow string) *crd.Traceflow {
	t.Helper()
	s, d, err := Endpoints(m.State, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	pkt, err := flowspec.Parse(flow)
	if err != nil {
		t.Fatal(err)
	}
	tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d, Packet: pkt}}
	tf.Name = "test"
	tr, err := Run(context.Background(), m, tf, Options{Now: fixedNow})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Traceflow
}

// obs parses a compact YAML list of observations, so that expectations
// read like the output they describe.
func results(t *testing.T, y string) []crd.NodeResult {
	t.Helper()
	var out []crd.NodeResult
	if err := yaml.UnmarshalStrict([]byte(y), &out); err != nil {
		t.Fatalf("bad expectation: %v", err)
	}
	for i := range out {
		out[i].Timestamp = 1700000000
	}
	return out
}

func TestTraces(t *testing.T) {
	cases := []struct {
		name, mode, src, dst, flow string
		overlays                   []string
		phase                      crd.Phase
		reason                     string
		want                       string
	}{
		{name: "intra-node delivered", src: "default/client", dst: "default/web", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "inter-node through the tunnel", src: "default/client", dst: "default/db", flow: "tcp,tcp_dst=5432", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.102}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "service clusterIP load-balanced", src: "default/client", dst: "default/db-svc", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: LB, action: Forwarded, pod: default/db, translatedDstIP: 10.10.2.7}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.102}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "hairpin service", src: "default/client", dst: "client-svc", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: LB, action: Forwarded, pod: default/client, translatedSrcIP: 169.254.0.253, translatedDstIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "service without endpoints times out", src: "default/client", dst: "empty-svc",
			phase: crd.PhaseFailed, reason: "Traceflow timeout", want: `[]`},
		{name: "k8s egress allow", overlays: []string{"k8s-egress-allow.yaml"}, src: "default/client", dst: "default/db",
			flow: "tcp,tcp_dst=5432", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: NetworkPolicy, componentInfo: EgressRule, action: Forwarded, networkPolicy: "K8sNetworkPolicy:default/client-egress"}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.102}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "k8s egress default drop", overlays: []string{"k8s-egress-allow.yaml"}, src: "default/client", dst: "default/db",
			flow: "tcp,tcp_dst=80", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: NetworkPolicy, componentInfo: EgressDefaultRule, action: Dropped}`},
		{name: "k8s ingress default drop", overlays: []string{"k8s-ingress-isolate.yaml"}, src: "default/client", dst: "default/db",
			flow: "tcp,tcp_dst=5432", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.102}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: NetworkPolicy, componentInfo: IngressDefaultRule, action: Dropped}`},
		{name: "k8s ingress allow from namespace", overlays: []string{"k8s-ingress-isolate.yaml"}, src: "prod/api", dst: "default/db",
			flow: "tcp,tcp_dst=5432", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-2
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.2.8}
  - {component: NetworkPolicy, componentInfo: IngressRule, action: Forwarded, networkPolicy: "K8sNetworkPolicy:default/db-from-prod"}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "antrea cluster policy drop", overlays: []string{"antrea-deny.yaml"}, src: "default/client", dst: "default/web",
			phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: NetworkPolicy, componentInfo: IngressMetric, action: Dropped, networkPolicy: "AntreaClusterNetworkPolicy:protect-web", networkPolicyRule: drop-from-client}`},
		{name: "antrea policy reject", overlays: []string{"antrea-deny.yaml"}, src: "default/client", dst: "default/db",
			flow: "tcp,tcp_dst=5432", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: NetworkPolicy, componentInfo: EgressMetric, action: Rejected, networkPolicy: "AntreaNetworkPolicy:default/no-db-from-client", networkPolicyRule: reject-db}`},
		{name: "antrea policy port not matched", overlays: []string{"antrea-deny.yaml"}, src: "default/client", dst: "default/db",
			flow: "udp,udp_dst=5432", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.102}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "pod to node IP", src: "prod/api", dst: "192.168.77.101", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-2
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.2.8}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "pod to own gateway", src: "prod/api", dst: "10.10.2.1", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-2
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.2.8}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "pod to external IP", src: "prod/api", dst: "8.8.8.8", flow: "udp,udp_dst=53", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-2
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.2.8}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "local egress", src: "default/db", dst: "8.8.8.8", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-2
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.2.7}
  - {component: Egress, action: MarkedForSNAT, egress: egress-db, egressIP: 192.168.77.200, egressNode: k8s-node-2}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "remote egress", src: "default/client", dst: "8.8.8.8", flow: "tcp,tcp_dst=443", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Egress, action: ForwardedToEgressNode, egress: egress-client, egressIP: 192.168.77.210, egressNode: k8s-node-3}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.210}
- node: k8s-node-3
  observations:
  - {component: Forwarding, action: Received}
  - {component: Egress, action: MarkedForSNAT, egressIP: 192.168.77.210}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "remote egress with egress allow before it", overlays: []string{"k8s-egress-allow.yaml", "allow-external.yaml"}, src: "default/client", dst: "8.8.8.8", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: NetworkPolicy, componentInfo: EgressRule, action: Forwarded, networkPolicy: "K8sNetworkPolicy:default/client-external"}
  - {component: Egress, action: ForwardedToEgressNode, egress: egress-client, egressIP: 192.168.77.210, egressNode: k8s-node-3}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.210}
- node: k8s-node-3
  observations:
  - {component: Forwarding, action: Received}
  - {component: Egress, action: MarkedForSNAT, egressIP: 192.168.77.210}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "egress without IP", src: "default/web", dst: "8.8.8.8", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.6}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "egress pod to excluded node IP", src: "default/client", dst: "192.168.77.102", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "noEncap inter-node", mode: "noEncap", src: "default/client", dst: "default/db", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Forwarded}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "noEncap ignores egress", mode: "noEncap", src: "default/client", dst: "8.8.8.8", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "hybrid same subnet routes directly", mode: "hybrid", src: "default/client", dst: "default/db", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Forwarded}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "hybrid keeps egress", mode: "hybrid", src: "default/db", dst: "8.8.8.8", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-2
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.2.7}
  - {component: Egress, action: MarkedForSNAT, egress: egress-db, egressIP: 192.168.77.200, egressNode: k8s-node-2}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "networkPolicyOnly inter-node", mode: "networkPolicyOnly", src: "default/client", dst: "default/db", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: Forwarded}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "networkPolicyOnly external", mode: "networkPolicyOnly", src: "default/client", dst: "1.1.1.1", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: 10.10.1.5}
  - {component: Forwarding, componentInfo: Output, action: ForwardedOutOfNetwork}`},
		{name: "ipv6 inter-node", src: "default/client", dst: "default/db", flow: "ipv6,tcp,tcp_dst=5432", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: "fd00:10:1::5"}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.102}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "ipv6 icmp echo", src: "default/client", dst: "fd00:10:2::7", flow: "ipv6", phase: crd.PhaseSucceeded, want: `
- node: k8s-node-1
  observations:
  - {component: SpoofGuard, action: Forwarded, srcPodIP: "fd00:10:1::5"}
  - {component: Forwarding, componentInfo: Output, action: Forwarded, tunnelDstIP: 192.168.77.102}
- node: k8s-node-2
  observations:
  - {component: Forwarding, action: Received}
  - {component: Forwarding, componentInfo: Output, action: Delivered}`},
		{name: "missing destination pod", src: "default/client", dst: "default/nope", phase: crd.PhaseFailed,
			reason: `Node: k8s-node-1, error: failed to get the destination Service: services "nope" not found`, want: `[]`},
		{name: "ipv6 to pod without ipv6", src: "default/client", dst: "default/web", flow: "ipv6", phase: crd.PhaseFailed,
			reason: "Node: k8s-node-1, error: destination Pod does not have an IPv6 address", want: `[]`},
		{name: "ipv6 to ipv4 address", src: "default/client", dst: "10.10.2.7", flow: "ipv6", phase: crd.PhaseFailed,
			reason: "Node: k8s-node-1, error: destination IP does not match the IP header family", want: `[]`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mode := pipeline.Encap
			if c.mode != "" {
				mode = pipeline.TrafficMode(c.mode)
			}
			m := loadModel(t, mode, c.overlays...)
			tf := trace(t, m, c.src, c.dst, c.flow)
			if tf.Status.Phase != c.phase || tf.Status.Reason != c.reason {
				t.Errorf("phase %q reason %q, want %q %q", tf.Status.Phase, tf.Status.Reason, c.phase, c.reason)
			}
			want := results(t, c.want)
			if len(want) == 0 {
				want = nil
			}
			if !reflect.DeepEqual(tf.Status.Results, want) {
				got, _ := yaml.Marshal(tf.Status.Results)
				exp, _ := yaml.Marshal(want)
				t.Errorf("results:\n%s\nwant:\n%s", got, exp)
			}
		})
	}
}

func TestAdmission(t *testing.T) {
	m := loadModel(t, pipeline.Encap)
	for _, c := range []struct {
		spec crd.TraceflowSpec
		want string
	}{
		{crd.TraceflowSpec{Destination: crd.Destination{IP: "1.1.1.1"}}, "neither source nor destination Pod"},
		{crd.TraceflowSpec{Destination: crd.Destination{Namespace: "default", Pod: "db"}}, "source Pod must be specified"},
		{crd.TraceflowSpec{Source: crd.Source{Namespace: "default", Pod: "ghost"}, Destination: crd.Destination{IP: "1.1.1.1"}}, "requested source Pod default/ghost not found"},
		{crd.TraceflowSpec{Source: crd.Source{Namespace: "prod", Pod: "node-exporter"}, Destination: crd.Destination{IP: "1.1.1.1"}}, "hostNetwork Pod"},
	} {
		tf := &crd.Traceflow{Spec: c.spec}
		tf.Name = "t"
		_, err := Run(context.Background(), m, tf, Options{Now: fixedNow})
		var ae *AdmissionError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want admission error containing %q", c.spec, err, c.want)
		}
	}
}
