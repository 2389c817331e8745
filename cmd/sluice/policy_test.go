package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// policyFlowLog is a flow log of the example cluster: cart-1 to pay-api-1
// (allowed by the cluster's pay-api-from-cart), frontend-2 to pay-api-1
// (dropped by its isolation), frontend-1 to cart-2 through the cart
// Service.
const policyFlowLog = `1790000000,1790000060,10.10.2.6,10.10.1.7,40001,8443,TCP,cart-1,web,demo-node-2,pay-api-1,payments,demo-node-1,,,0,,pay-api-from-cart,payments,,Allow,K8sNetworkPolicy,,,,,,,,
1790000000,1790000060,10.10.2.5,10.10.1.7,40002,8443,TCP,frontend-2,web,demo-node-2,pay-api-1,payments,demo-node-1,,,0,,pay-api-from-cart,payments,,Drop,K8sNetworkPolicy,,,,,,,,
1790000000,1790000060,10.10.1.5,10.10.3.6,40003,8080,TCP,frontend-1,web,demo-node-1,cart-2,web,demo-node-3,10.96.10.10,10.96.10.10,8080,web/cart:http,,,,,,,,,,,,,
`

// TestPolicyCommands: recommend writes a YAML stream and a directory,
// verify passes the recommendation (exit 0), fails a policy that blocks
// observed traffic (exit 1, naming the flow and the rule), and refuses
// bad input (an error, exit 2).
func TestPolicyCommands(t *testing.T) {
	dir := t.TempDir()
	flows := filepath.Join(dir, "flows.log")
	if err := os.WriteFile(flows, []byte(policyFlowLog), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--flows", flows, "--cluster", "../../examples/cluster"}
	stream, stderr, err := runCLI(t, append([]string{"policy", "recommend"}, common...)...)
	if err != nil {
		t.Fatalf("recommend: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "3 records, 3 distinct connections: 2 carried") {
		t.Errorf("recommend's figures: %s", stderr)
	}
	docs := strings.Split(stream, "\n---\n")
	var names []string
	for _, d := range docs {
		var obj struct {
			Kind     string
			Metadata struct{ Namespace, Name string }
		}
		if err := yaml.Unmarshal([]byte(d), &obj); err != nil || obj.Kind != "NetworkPolicy" {
			t.Fatalf("document %q: %v", d, err)
		}
		names = append(names, obj.Metadata.Namespace+"/"+obj.Metadata.Name)
	}
	want := "payments/sluice-default-deny payments/sluice-pay-api web/sluice-cart web/sluice-default-deny web/sluice-frontend"
	if strings.Join(names, " ") != want {
		t.Errorf("objects %v, want %s", names, want)
	}
	if !strings.Contains(stream, "# ingress[0] from Pods web/cart, TCP/8443: 1 connection, 1 record, first seen 2026-09-21T14:13:20Z, last seen 2026-09-21T14:14:20Z") {
		t.Errorf("no justification of pay-api's rule:\n%s", stream)
	}
	out := filepath.Join(dir, "rec")
	if _, stderr, err := runCLI(t, append([]string{"policy", "recommend", "-o", out}, common...)...); err != nil {
		t.Fatalf("recommend -o: %v\n%s", err, stderr)
	}
	files, _ := os.ReadDir(out)
	if len(files) != len(docs) {
		t.Errorf("-o DIR: %d files, want %d", len(files), len(docs))
	}

	antrea, stderr, err := runCLI(t, append([]string{"policy", "recommend", "--format", "antrea"}, common...)...)
	if err != nil {
		t.Fatalf("recommend --format antrea: %v\n%s", err, stderr)
	}
	if strings.Count(antrea, "kind: ClusterNetworkPolicy\n") != 2 || strings.Count(antrea, "kind: NetworkPolicy\n") != 3 ||
		strings.Contains(antrea, "networking.k8s.io") || !strings.Contains(antrea, "tier: baseline") {
		t.Errorf("--format antrea:\n%s", antrea)
	}
	os.WriteFile(filepath.Join(dir, "antrea.yaml"), []byte(antrea), 0o600)
	if _, stderr, err := runCLI(t, append([]string{"policy", "verify", "-f", filepath.Join(dir, "antrea.yaml")}, common...)...); err != nil {
		t.Errorf("verify of the Antrea policies: %v\n%s", err, stderr)
	}

	js, stderr, err := runCLI(t, append([]string{"policy", "verify", "-f", out, "-o", "json"}, common...)...)
	if err != nil {
		t.Fatalf("verify: %v\n%s", err, stderr)
	}
	var rep struct {
		Connections, Unchanged int
		NewlyBlocked           []any
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil || rep.Connections != 3 || rep.Unchanged != 3 || len(rep.NewlyBlocked) != 0 {
		t.Errorf("verify -o json: %+v %v\n%s", rep, err, js)
	}

	// An egress deny-all for web blocks cart-1 to pay-api-1 and frontend-1
	// to cart-2 (a deny-all for payments' ingress would not: the cluster's
	// own pay-api-from-cart still allows the cart).
	deny := filepath.Join(dir, "deny.yaml")
	os.WriteFile(deny, []byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: web}
spec: {podSelector: {}, policyTypes: [Egress]}
`), 0o600)
	table, _, err := runCLI(t, append([]string{"policy", "verify", "-f", deny}, common...)...)
	var ee exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("verify of a blocking policy: %v, want exit status 1\n%s", err, table)
	}
	if !strings.Contains(table, "2 newly blocked") || !strings.Contains(table, "web/cart-1") ||
		!strings.Contains(table, "egress K8sNetworkPolicy:web/deny-all: isolated") {
		t.Errorf("the table does not name the blocked flow and its rule:\n%s", table)
	}
	y, _, err := runCLI(t, append([]string{"policy", "verify", "-f", deny, "-o", "yaml"}, common...)...)
	if !errors.As(err, &ee) || !strings.Contains(y, "- destination: payments/pay-api-1\n") || !strings.Contains(y, "unchanged: 1\n") {
		t.Errorf("-o yaml: %v\n%s", err, y)
	}

	// --since: the log's records are older than an hour.
	if _, stderr, err := runCLI(t, append([]string{"policy", "recommend", "--since", "1h"}, common...)...); err != nil ||
		!strings.Contains(stderr, "0 records, 0 distinct connections") {
		t.Errorf("recommend --since 1h: %v\n%s", err, stderr)
	}
	if js, _, err := runCLI(t, append([]string{"policy", "verify", "--since", "1h", "-f", deny, "-o", "json"}, common...)...); err != nil ||
		!strings.Contains(js, `"connections": 0`) {
		t.Errorf("verify --since 1h: %v, want exit status 0 and no connection\n%s", err, js)
	}

	bad := filepath.Join(dir, "bad.log")
	os.WriteFile(bad, []byte("1,2,3\n"), 0o600)
	for _, args := range [][]string{
		append([]string{"policy", "verify"}, common...),                                         // no -f
		append([]string{"policy", "verify", "-f", deny, "-o", "xml"}, common...),                // bad format
		{"policy", "verify", "-f", deny, "--flows", bad, "--cluster", "../../examples/cluster"}, // bad log
		{"policy", "verify", "-f", deny, "--cluster", "../../examples/cluster"},                 // no flows
		append([]string{"policy", "recommend", "--isolation", "sideways"}, common...),
		append([]string{"policy", "recommend", "--format", "calico"}, common...),
		append([]string{"policy", "recommend", "--cidr-prefix", "33"}, common...),
		append([]string{"policy", "recommend", "--cidr-prefix", "0"}, common...),
		append([]string{"policy", "recommend", "--cidr-prefix-v6", "0"}, common...),
		append([]string{"policy", "recommend", "--since", "-1h"}, common...),
	} {
		_, _, err := runCLI(t, args...)
		if err == nil || errors.As(err, &ee) {
			t.Errorf("%v: %v, want an error (exit status 2)", args, err)
		} else if exitCode(err) != 2 {
			t.Errorf("%v: exit status %d, want 2", args, exitCode(err))
		}
	}
}

// TestPolicyRecommendWarnsWidened: the cluster lets cart-1 reach
// 203.0.113.80 on 443 and 203.0.113.81 on 80 only; the aggregated rule
// (the /24 on 80 and 443) cannot keep 203.0.113.80 on 80 denied, and
// recommend says so, naming the connection.
func TestPolicyRecommendWarnsWidened(t *testing.T) {
	dir := t.TempDir()
	clusterDir := filepath.Join(dir, "cluster")
	if err := os.MkdirAll(clusterDir, 0o755); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("../../examples/cluster/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("example cluster: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(clusterDir, filepath.Base(f)), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(clusterDir, "cart-out.yaml"), []byte(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: cart-out, namespace: web}
spec:
  podSelector: {matchLabels: {app: cart}}
  policyTypes: [Egress]
  egress:
  - {to: [{ipBlock: {cidr: 203.0.113.80/32}}], ports: [{port: 443}]}
  - {to: [{ipBlock: {cidr: 203.0.113.81/32}}], ports: [{port: 80}]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	line := func(dst string, port int) string {
		f := make([]string, 30)
		copy(f, []string{"1790000000", "1790000060", "10.10.2.6", dst, "40001", strconv.Itoa(port), "TCP", "cart-1", "web", "demo-node-2"})
		f[15] = "0"
		return strings.Join(f, ",") + "\n"
	}
	flows := filepath.Join(dir, "flows.log")
	if err := os.WriteFile(flows, []byte(line("203.0.113.80", 443)+line("203.0.113.81", 80)+line("203.0.113.80", 80)), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--flows", flows, "--cluster", clusterDir}
	_, stderr, err := runCLI(t, append([]string{"policy", "recommend"}, common...)...)
	if err != nil {
		t.Fatalf("recommend: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, "2 carried") || !strings.Contains(stderr, "warning: the policies would allow 1 of the 1 connections denied now") ||
		!strings.Contains(stderr, "web/cart-1 -> 203.0.113.80 TCP/80") {
		t.Errorf("recommend does not warn of the denied connection it allows:\n%s", stderr)
	}
	// Without the cluster's policy nothing is denied, and nothing warned of.
	if err := os.Remove(filepath.Join(clusterDir, "cart-out.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := runCLI(t, append([]string{"policy", "recommend"}, common...)...); err != nil || strings.Contains(stderr, "warning") {
		t.Errorf("recommend without cart-out: %v\n%s", err, stderr)
	}
}
