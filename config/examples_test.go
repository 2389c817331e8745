package config

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The example files of examples/ load and validate with the sinks this
// version supports.
func TestExamples(t *testing.T) {
	cases := []struct {
		file, mode string
	}{
		{"../examples/aggregator-aggregate.yaml", ModeAggregate},
		{"../examples/aggregator-proxy.yaml", ModeProxy},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			a, err := Load(c.file)
			if err != nil {
				t.Fatal(err)
			}
			if a.Mode != c.mode {
				t.Errorf("mode = %q, want %q", a.Mode, c.mode)
			}
			hostport, proto, err := a.FlowCollector.Target()
			if !a.FlowCollector.Enable || err != nil || hostport != "127.0.0.1:4740" || proto != "tcp" {
				t.Errorf("flowCollector: enable %v, target %q %q %v", a.FlowCollector.Enable, hostport, proto, err)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, file := range []string{"testdata/antrea-flow-aggregator.conf",
		"../examples/aggregator-aggregate.yaml", "../examples/aggregator-proxy.yaml"} {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{"", "mode: proxy\n", "flowColector: {}\n", "a: &x [*x]\n",
		"flowLogger:\n  filters:\n  - {}\n  - ingressNetworkPolicyRuleActions: [Drop]\n",
		"activeFlowRecordTimeout: 1h\nsluice: {tls: {certDir: d}}\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Parse(data, "fuzz.yaml")
		if err != nil {
			if a != nil {
				t.Fatal("configuration returned with an error")
			}
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error text")
			}
			return
		}
		// What Parse accepts is valid, and writes out to a file that reads
		// back to the same configuration.
		if err := a.Validate(ValidateOptions{}); err != nil {
			t.Fatalf("Parse accepted what Validate refuses: %v", err)
		}
		out, err := yaml.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Parse(out, "again.yaml")
		if err != nil {
			t.Fatalf("re-reading %q: %v", out, err)
		}
		again, err := yaml.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		if string(again) != string(out) {
			t.Fatalf("round trip changed the configuration:\n%s\n---\n%s", out, again)
		}
	})
}
