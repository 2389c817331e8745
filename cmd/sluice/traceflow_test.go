package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"sluice/traceflow/crd"
)

const tfCluster = "../../traceflow/testdata/cluster"

// runSluice runs the root command with args and returns stdout, stderr and
// the exit status main would use.
func runSluice(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := newRootCmd()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	code := 0
	if err := cmd.Execute(); err != nil {
		code = 2
		errb.WriteString(err.Error())
	}
	return out.String(), errb.String(), code
}

func TestTraceflowCommand(t *testing.T) {
	out, _, code := runSluice(t, "traceflow", "-S", "default/db", "-D", "8.8.8.8", "--cluster", tfCluster)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"name: default-db-to-8.8.8.8-", "phase: Succeeded", "source: default/db", "destination: 8.8.8.8",
		"    - node: k8s-node-2\n", "          action: MarkedForSNAT\n          egress: egress-db\n          egressIP: 192.168.77.200\n          egressNode: k8s-node-2\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// A failed trace still exits 0: the trace ran.
	out, _, code = runSluice(t, "tf", "-S", "client", "-D", "nope", "--cluster", tfCluster, "-o", "json")
	if code != 0 || !strings.Contains(out, `"phase": "Failed"`) || !strings.Contains(out, `services \"nope\" not found`) {
		t.Errorf("exit %d:\n%s", code, out)
	}
}

func TestTraceflowBadInput(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a Pod: no implied in-cluster state
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"traceflow", "-S", "client", "-D", "db"}, "give --cluster PATH or --kubeconfig FILE"},
		{[]string{"traceflow", "-S", "client", "--cluster", tfCluster}, "please provide source (-S) and destination (-D)"},
		{[]string{"traceflow", "-S", "ghost", "-D", "db", "--cluster", tfCluster}, "requested source Pod default/ghost not found"},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "-f", "tcp,bogus"}, `unknown token "bogus"`},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "--tunnel-type", "gre"}, `tunnel type "gre"`},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "-o", "xml"}, `-o "xml"`},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "--traffic-encryption-mode", "wireGuard", "--traffic-mode", "noEncap"},
			"--traffic-encryption-mode: WireGuard is not applicable to the noEncap mode"},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "--traffic-encryption-mode", "ipsec"}, `"ipsec" is not modelled`},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "--enable-bridging-mode"},
			"--enable-bridging-mode: bridging mode requires the noEncap traffic mode, not encap"},
		{[]string{"traceflow", "-S", "client", "-D", "239.1.2.3", "--cluster", tfCluster, "--multicast"}, "the reference cannot trace this"},
		{[]string{"traceflow", "-S", "client", "-D", "ff05::1", "-f", "ipv6", "--cluster", tfCluster}, "IPv6 multicast address"},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "--diff"}, "--diff needs --with"},
		{[]string{"traceflow", "-S", "client", "-D", "db", "--cluster", "/nonexistent"}, "no such file"},
		{[]string{"traceflow", "pipeline", "--node", "x", "--cluster", tfCluster}, `node "x" is not in the cluster state`},
	} {
		_, errs, code := runSluice(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q", c.args, code, errs, c.want)
		}
	}
}

func TestTraceflowInconsistentState(t *testing.T) {
	dir := t.TempDir()
	bad := "apiVersion: v1\nkind: Pod\nmetadata: {name: lost, namespace: default}\nspec: {nodeName: k8s-node-9}\nstatus: {podIP: 10.10.9.9}\n"
	if err := os.WriteFile(filepath.Join(dir, "lost.yaml"), []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errs, code := runSluice(t, "traceflow", "-S", "client", "-D", "db", "--cluster", tfCluster, "--with", dir)
	if code == 0 || !strings.Contains(errs, `Pod default/lost: is on Node "k8s-node-9"`) {
		t.Errorf("exit %d stderr %q", code, errs)
	}
}

func TestTraceflowObjectRoundTrip(t *testing.T) {
	dir := t.TempDir()
	in := `apiVersion: crd.antrea.io/v1beta1
kind: Traceflow
metadata: {name: tf-db}
spec:
  source: {namespace: default, pod: client}
  destination: {namespace: default, service: db-svc}
  packet:
    transportHeader: {tcp: {dstPort: 5432, flags: 2}}
`
	path := filepath.Join(dir, "tf.yaml")
	if err := os.WriteFile(path, []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := runSluice(t, "traceflow", "--traceflow", path, "--cluster", tfCluster)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var tf crd.Traceflow
	if err := yaml.UnmarshalStrict([]byte(out), &tf); err != nil {
		t.Fatalf("output is not a Traceflow: %v\n%s", err, out)
	}
	if tf.Name != "tf-db" || tf.Status.Phase != crd.PhaseSucceeded || len(tf.Status.Results) != 2 ||
		tf.Status.Results[0].Observations[1].Pod != "default/db" || tf.Spec.Destination.Service != "db-svc" {
		t.Errorf("round trip:\n%s", out)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(in, "source:", "sorce:", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runSluice(t, "traceflow", "--traceflow", path, "--cluster", tfCluster); code == 0 || !strings.Contains(errs, `unknown field "sorce"`) {
		t.Errorf("misspelt field: exit %d, %s", code, errs)
	}
}

func TestTraceflowWhatIf(t *testing.T) {
	out, _, code := runSluice(t, "traceflow", "-S", "client", "-D", "db", "-f", "tcp,tcp_dst=5432", "--cluster", tfCluster,
		"--with", "../../traceflow/testdata/overlays/antrea-deny.yaml", "--diff")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	want := "# changes\nnode k8s-node-1:\n" +
		"  - Forwarding/Output Forwarded tunnelDstIP=192.168.77.102\n" +
		"  + NetworkPolicy/EgressMetric Rejected networkPolicy=AntreaNetworkPolicy:default/no-db-from-client networkPolicyRule=reject-db\n" +
		"node k8s-node-2:\n  - Forwarding Received\n  - Forwarding/Output Delivered\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("diff:\n%s", out)
	}
}

func TestTraceflowPipeline(t *testing.T) {
	out, _, code := runSluice(t, "traceflow", "pipeline", "--node", "k8s-node-3", "--cluster", tfCluster, "--tag", "7")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{
		"table=PipelineRootClassifier, priority=200,ip actions=goto_table:Classifier\n",
		"table=EgressMark, priority=200,ct_state=+trk,ip,tun_dst=192.168.77.210 actions=set_field:0x1/0xff->pkt_mark,",
		"table=Output, priority=203,ip,reg0=0x200000/0x600000,reg1=0x1,ip_dscp=7 actions=output:NXM_NX_REG1[],controller(reason=no_match,userdata=01)\n",
		"group_id=2,type=select,bucket=bucket_id:0,weight:100,actions=load:0xa0a0207->NXM_NX_REG3[],set_field:0x21538/0x7ffff->reg4,resubmit(,EndpointDNAT)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("pipeline lacks %q", want)
		}
	}
}

// TestTraceflowPipelineOVSScript: --ovs-script prints the shell script that
// builds the Node's bridge (its content is checked against real Open
// vSwitch in traceflow/ovscheck), and --proxy-all reaches the model.
func TestTraceflowPipelineOVSScript(t *testing.T) {
	out, _, code := runSluice(t, "traceflow", "pipeline", "--node", "k8s-node-3", "--cluster", tfCluster, "--ovs-script")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"#!/bin/sh\n", "ovs-vsctl --may-exist add-br \"$BR\"", "ovs-ofctl"} {
		if !strings.Contains(out, want) {
			t.Errorf("script lacks %q", want)
		}
	}
	if strings.Contains(out, "table=PipelineRootClassifier") {
		t.Error("the script names tables, which ovs-ofctl cannot load: want numbers")
	}
	plain, _, _ := runSluice(t, "traceflow", "pipeline", "--node", "k8s-node-3", "--cluster", tfCluster)
	all, _, code := runSluice(t, "traceflow", "pipeline", "--node", "k8s-node-3", "--cluster", tfCluster, "--proxy-all")
	if code != 0 || all == plain || !strings.Contains(all, "NodePortMark") {
		t.Errorf("--proxy-all changed nothing in the pipeline (exit %d)", code)
	}
}

// TestTraceflowWireGuard: --traffic-encryption-mode reaches the model's
// flows (the script routes peer PodCIDRs to the gateway, not the tunnel)
// and the trace (Forwarded out of the gateway, to the peer Node's IP).
func TestTraceflowWireGuard(t *testing.T) {
	peerFlow := func(script string) string {
		for _, l := range strings.Split(script, "\n") {
			if strings.Contains(l, "nw_dst=10.10.1.0/24 ") {
				return l
			}
		}
		return ""
	}
	plain, _, code := runSluice(t, "traceflow", "pipeline", "--node", "k8s-node-3", "--cluster", tfCluster, "--ovs-script")
	if f := peerFlow(plain); code != 0 || !strings.Contains(f, "tun_dst") {
		t.Errorf("encap: flow to the peer PodCIDR %q (exit %d), want it through the tunnel", f, code)
	}
	wg, _, code := runSluice(t, "traceflow", "pipeline", "--node", "k8s-node-3", "--cluster", tfCluster, "--ovs-script",
		"--traffic-encryption-mode", "wireGuard")
	if f := peerFlow(wg); code != 0 || f == "" || strings.Contains(f, "tun_dst") {
		t.Errorf("WireGuard: flow to the peer PodCIDR %q (exit %d), want it to the gateway", f, code)
	}
	out, _, code := runSluice(t, "traceflow", "-S", "default/client", "-D", "default/db", "--cluster", tfCluster,
		"--traffic-encryption-mode", "WireGuard")
	want := "          componentInfo: Output\n          action: Forwarded\n          tunnelDstIP: 192.168.77.102\n"
	if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "    - node: k8s-node-2\n") {
		t.Errorf("exit %d, output lacks %q or k8s-node-2:\n%s", code, want, out)
	}
}
