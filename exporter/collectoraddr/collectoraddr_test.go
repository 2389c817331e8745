package collectoraddr

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	good := map[string]Collector{
		"10.0.0.1":          {"10.0.0.1", 4739, "tls"},
		"10.0.0.1:4740":     {"10.0.0.1", 4740, "tls"},
		"10.0.0.1:4740:tcp": {"10.0.0.1", 4740, "tcp"},
		"10.0.0.1::UDP":     {"10.0.0.1", 4739, "udp"},
		"10.0.0.1:":         {"10.0.0.1", 4739, "tls"},
		"flow-aggregator/flow-aggregator:4739:tls":   {"flow-aggregator/flow-aggregator", 4739, "tls"},
		"fa.example.com:14739:tcp":                   {"fa.example.com", 14739, "tcp"},
		"[fd00::10]:4739:tcp":                        {"fd00::10", 4739, "tcp"},
		"[fd00::10]":                                 {"fd00::10", 4739, "tls"},
		"[fd00::10]::udp":                            {"fd00::10", 4739, "udp"},
		"flow-aggregator/flow-aggregator:14739:grpc": {"flow-aggregator/flow-aggregator", 14739, "grpc"},
		"10.0.0.1:4739:GRPC":                         {"10.0.0.1", 4739, "grpc"},
		"10.0.0.1::grpc":                             {"10.0.0.1", 14739, "grpc"},
		"[fd00::10]::grpc":                           {"fd00::10", 14739, "grpc"},
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":              "no host",
		":4739":         "no host",
		"fd00::10:4739": "brackets",
		"[fd00::10":     "missing ]",
		"[10.0.0.1]:1":  "IPv6",
		"host:0":        "port",
		"host:70000":    "port",
		"host:12x":      "port",
		"host:1:sctp":   "protocol",
		"host:1:http":   "protocol",
		"host:1:tcp:x":  "too many",
		"ns/":           "namespace/name",
		"a/b/c:1":       "namespace/name",
		"[fd00::1]x":    "unexpected",
		"ho st:1":       "characters",
	}
	for in, why := range bad {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("%q: error %v, want one mentioning %q", in, err, why)
		}
	}
}

// FuzzParse: any input gives a result or an error, never a
// panic, and a result formats back to an address that parses the same.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "10.0.0.1:4740:tcp", "[fd00::10]:4739:udp", "ns/svc::tls", "[", "a:b:c:d", "[::]:", "h:65535:TLS", "ns/svc::grpc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil {
			return
		}
		if c.Host == "" || c.Port == 0 || (c.Proto != "tcp" && c.Proto != "udp" && c.Proto != "tls" && c.Proto != "grpc") {
			t.Fatalf("%q parsed to %+v", s, c)
		}
		again, err := Parse(c.String())
		if err != nil || again != c {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, c, c.String(), again, err)
		}
	})
}
