package ui

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sluice/flow"
	"sluice/ring"
	"sluice/traceflow/cluster"
)

// TestPolicyAPI: the Policies page's API recommends from the records the
// UI holds (in the namespace and window asked for), verifies edited
// policies, and refuses bad requests with a clear status.
func TestPolicyAPI(t *testing.T) {
	buf := ring.New[*flow.Flow](64)
	objs := func(ctx context.Context) ([]cluster.Object, error) {
		return cluster.ReadPath(ctx, "../examples/cluster")
	}
	s, hs := testServer(t, Options{Buffer: buf, Cluster: objs})
	now := time.Now()
	for _, f := range []flow.Flow{
		// cart-1 -> pay-api-1, allowed; frontend-2 -> pay-api-1, dropped.
		{StartTime: now.Add(-time.Minute), EndTime: now, SourceIP: netip.MustParseAddr("10.10.2.6"), DestinationIP: netip.MustParseAddr("10.10.1.7"),
			SourcePort: 40001, DestinationPort: 8443, Protocol: 6, SourcePodNamespace: "web", SourcePodName: "cart-1",
			DestinationPodNamespace: "payments", DestinationPodName: "pay-api-1",
			Ingress: flow.Policy{Name: "pay-api-from-cart", Namespace: "payments", RuleAction: flow.ActionAllow, Type: 1}},
		{StartTime: now.Add(-time.Minute), EndTime: now, SourceIP: netip.MustParseAddr("10.10.2.5"), DestinationIP: netip.MustParseAddr("10.10.1.7"),
			SourcePort: 40002, DestinationPort: 8443, Protocol: 6, SourcePodNamespace: "web", SourcePodName: "frontend-2",
			DestinationPodNamespace: "payments", DestinationPodName: "pay-api-1",
			Ingress: flow.Policy{Name: "pay-api-from-cart", Namespace: "payments", RuleAction: flow.ActionDrop, Type: 1}},
		// Two hours old: outside a one-hour window.
		{StartTime: now.Add(-3 * time.Hour), EndTime: now.Add(-2 * time.Hour), SourceIP: netip.MustParseAddr("10.10.1.10"),
			DestinationIP: netip.MustParseAddr("198.51.100.7"), SourcePort: 40003, DestinationPort: 443, Protocol: 6,
			SourcePodNamespace: "batch", SourcePodName: "crawler-0"},
	} {
		buf.Produce(&f)
	}
	waitSeen(t, s, 3)
	post := func(path, body string) (int, map[string]any) {
		resp, err := http.Post(hs.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, res := post("/api/policy/recommend", `{"namespace":"","window":"1h"}`)
	if code != 200 {
		t.Fatalf("recommend: %d %v", code, res)
	}
	rep := res["report"].(map[string]any)
	if res["records"].(float64) != 2 || rep["connections"].(float64) != 2 || len(rep["newlyBlocked"].([]any)) != 0 || res["carried"].(float64) != 1 {
		t.Errorf("recommend in the last hour: %v", res)
	}
	y := res["yaml"].(string)
	if !strings.Contains(y, "name: sluice-pay-api") || strings.Contains(y, "crawler") {
		t.Errorf("the recommendation:\n%s", y)
	}
	code, res = post("/api/policy/recommend", `{"namespace":"batch","window":""}`)
	if code != 200 || !strings.Contains(res["yaml"].(string), "name: sluice-crawler") || strings.Contains(res["yaml"].(string), "pay-api") {
		t.Errorf("recommend for batch, every record: %d %v", code, res)
	}
	deny := `{"window":"","yaml":"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: d, namespace: web}\nspec: {podSelector: {}, policyTypes: [Egress]}\n"}`
	code, res = post("/api/policy/verify", deny)
	if code != 200 || len(res["report"].(map[string]any)["newlyBlocked"].([]any)) != 1 {
		t.Errorf("verify a web egress deny: %d %v", code, res)
	}
	for _, c := range []struct {
		path, body string
		code       int
	}{
		{"/api/policy/verify", `{"window":""}`, http.StatusBadRequest},
		{"/api/policy/verify", `{"window":"","yaml":"kind: [\n"}`, http.StatusUnprocessableEntity},
		{"/api/policy/recommend", `{"window":"yesterday"}`, http.StatusBadRequest},
		{"/api/policy/recommend", `{"window":"1h","isolation":"up"}`, http.StatusUnprocessableEntity},
		{"/api/policy/recommend", `{"bogus":1}`, http.StatusBadRequest},
	} {
		if code, res := post(c.path, c.body); code != c.code || res["error"] == nil {
			t.Errorf("%s %s: %d %v, want %d with an error", c.path, c.body, code, res, c.code)
		}
	}
	resp, err := http.Post(hs.URL+"/api/policy/recommend", "text/plain", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d", resp.StatusCode)
	}
	var nss []string
	resp, err = http.Get(hs.URL + "/api/policy/namespaces")
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&nss)
	resp.Body.Close()
	if strings.Join(nss, ",") != "batch,data,kube-system,ops,payments,web" {
		t.Errorf("namespaces %v", nss)
	}

	// Without a cluster, the page is told why.
	_, hs2 := testServer(t, Options{Buffer: ring.New[*flow.Flow](8)})
	resp, err = http.Post(hs2.URL+"/api/policy/recommend", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("no cluster: %d", resp.StatusCode)
	}
}
