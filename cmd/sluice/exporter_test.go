package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestExporterFlagErrors: bad flag values stop the command with an error
// naming the flag, before anything starts.
func TestExporterFlagErrors(t *testing.T) {
	// No generated certificates to fall back on.
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	cases := map[string][]string{
		"--collector":        {"--collector", "fd00::1:4739", "--pod-cidr", "10.0.0.0/24"},
		"client certificate": {"--collector", "127.0.0.1:14739:grpc", "--pod-cidr", "10.0.0.0/24"},
		"--tls-cert-dir":     {"--source", "synthetic", "--tls-cert-dir", "/nonexistent"},
		"not tls or grpc":    {"--source", "synthetic", "--collector", "127.0.0.1:1:udp", "--tls-cert-dir", "/nonexistent"},
		"--ie-profile":       {"--ie-profile", "v9.9", "--pod-cidr", "10.0.0.0/24"},
		"--pod-cidr":         {"--pod-cidr", "10.0.0.300/24"},
		"--source":           {"--source", "pcap", "--pod-cidr", "10.0.0.0/24"},
		"--netns only":       {"--source", "synthetic", "--netns", "x", "--pod-cidr", "10.0.0.0/24"},
		"--poll-interval":    {"--poll-interval", "100ms", "--pod-cidr", "10.0.0.0/24"},
		"not both":           {"--inventory", "a", "--kubeconfig", "b", "--pod-cidr", "10.0.0.0/24"},
		"--in-cluster with":  {"--in-cluster", "--inventory", "a", "--pod-cidr", "10.0.0.0/24"},
		"--rate":             {"--source", "synthetic", "--rate", "0"},
		"--late-naming":      {"--source", "synthetic", "--late-naming", "-1s"},
		"--max-held":         {"--source", "synthetic", "--max-held", "0"},
		"tls":                {"--source", "synthetic", "--collector", "127.0.0.1:1:tcp", "--tls-ca-file", "ca.crt"},
		"no such file":       {"--source", "synthetic", "--collector", "127.0.0.1:1:tcp", "--inventory", "/nonexistent/inventory.yaml"},
	}
	for want, args := range cases {
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"exporter", "--node", "n1", "--metrics-address", ""}, args...))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: error %v, want one mentioning %q", args, err, want)
		}
	}
}

// TestExporterLateNamingFlags: --late-naming and --max-held reach the
// exporter's Settings, and whether --late-naming was given at all (when
// not, the exporter picks its default from the poll interval).
func TestExporterLateNamingFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		set  bool
		late time.Duration
		held int
	}{
		{nil, false, 10 * time.Second, 4096},
		{[]string{"--late-naming=0", "--max-held=9"}, true, 0, 9},
		{[]string{"--late-naming", "30s"}, true, 30 * time.Second, 4096},
	} {
		cmd, f := newExporterCmdFlags()
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatal(err)
		}
		s := f.settings(cmd)
		if s.LateNamingSet != c.set || s.LateNaming != c.late || s.MaxHeld != c.held {
			t.Errorf("%v: late naming %v (given: %v), %d held; want %v (%v), %d", c.args, s.LateNaming, s.LateNamingSet, s.MaxHeld, c.late, c.set, c.held)
		}
	}
}
