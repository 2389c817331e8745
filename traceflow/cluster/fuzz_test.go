package cluster

import (
	"os"
	"testing"
)

// FuzzParseBuild feeds arbitrary bytes through the YAML reader and the
// state builder: each must answer with objects or an error, never panic,
// and a State comes back exactly when there is no error.
func FuzzParseBuild(f *testing.F) {
	f.Add([]byte(base))
	for _, name := range []string{"nodes.yaml", "workloads.yaml", "services.yaml", "egress.yaml"} {
		if b, err := os.ReadFile("../testdata/cluster/" + name); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("apiVersion: v1\nkind: List\nitems: [{kind: List, items: [{kind: Pod}]}]\n"))
	f.Add([]byte("kind: Node\nmetadata: {name: n}\nstatus: {addresses: [{type: InternalIP, address: '::1'}]}\nspec: {podCIDRs: ['::/0']}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := ParseObjects(data, "fuzz")
		if err != nil {
			return
		}
		st, probs := Build(objs)
		if (st == nil) != (probs.Err() != nil) {
			t.Fatalf("state %v with problems %v", st != nil, probs)
		}
	})
}
