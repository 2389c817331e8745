package config

import (
	"strings"
	"testing"
)

// allSinks supports every sink, to test the settings of sinks Sluice does
// not run yet.
func allSinks() ValidateOptions {
	return ValidateOptions{Sinks: map[string]SinkSupport{SinkFlowCollector: {Proxy: true}, SinkClickHouse: {},
		SinkS3Uploader: {}, SinkFlowLogger: {}, SinkFlowStreamService: {Proxy: true}}}
}

// registrySinks are the sinks the aggregator registers today, as it passes
// them to Validate.
func registrySinks() ValidateOptions {
	return ValidateOptions{Sinks: map[string]SinkSupport{SinkFlowCollector: {Proxy: true}, SinkFlowLogger: {},
		SinkFlowStreamService: {Proxy: true}}}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		in   string
		opts *ValidateOptions // nil: registrySinks()
		want string           // "" for no error; several errors joined by "\n"
	}{
		// Top level.
		{"mode in the wrong case", "mode: proxy\n", nil,
			`cfg.yaml:1: mode: "proxy" is not a mode (want "Aggregate" or "Proxy", case-sensitive)`},
		{"unknown mode", "mode: Relay\n", nil,
			`cfg.yaml:1: mode: "Relay" is not a mode (want "Aggregate" or "Proxy", case-sensitive)`},
		{"proxy", "mode: Proxy\n", nil, ""},
		{"transport in any case", "aggregatorTransportProtocol: TCP\n", nil, ""},
		{"transport none", "aggregatorTransportProtocol: None\n", nil, ""},
		{"bad transport", "aggregatorTransportProtocol: sctp\n", nil,
			`cfg.yaml:1: aggregatorTransportProtocol: "sctp" is not a transport (want tls, tcp, udp or none)`},
		{"aggregator address", "flowAggregatorAddress: flow-aggregator.example.com\n", nil, ""},
		{"aggregator address IP", "flowAggregatorAddress: fd00::5\n", nil, ""},
		{"bad aggregator address", "flowAggregatorAddress: \"not a name\"\n", nil,
			`cfg.yaml:1: flowAggregatorAddress: "not a name" is neither an IP address nor a DNS name`},
		{"sink overflow", "sluice:\n  sinkOverflow: drop\n", nil, ""},
		{"bad sink overflow", "sluice:\n  sinkOverflow: lossy\n", nil,
			`cfg.yaml:2: sluice.sinkOverflow: "lossy" is not valid (want block or drop, case-sensitive)`},
		{"negative buffer", "recordBufferSize: -1\n", nil,
			`cfg.yaml:1: recordBufferSize: must be at least 1, got -1`},
		{"api port", "apiServer:\n  apiPort: 70000\n", nil,
			`cfg.yaml:2: apiServer.apiPort: must be a port from 1 to 65535, got 70000`},
		{"api TLS", "apiServer:\n  tlsMinVersion: VersionTLS13\n  tlsCipherSuites: \"TLS_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256\"\n", nil, ""},
		{"api TLS version", "apiServer:\n  tlsMinVersion: TLS1.3\n", nil,
			`cfg.yaml:2: apiServer.tlsMinVersion: "TLS1.3" is not valid (want VersionTLS10, VersionTLS11, VersionTLS12 or VersionTLS13, case-sensitive)`},
		{"cipher suite", "apiServer:\n  tlsCipherSuites: TLS_AES_128_GCM_SHA256,RC4\n", nil,
			`cfg.yaml:2: apiServer.tlsCipherSuites: unknown cipher suite "RC4"`},

		// Sinks and modes.
		{"proxy and flow logger", "mode: Proxy\nflowLogger:\n  enable: true\n", nil,
			`cfg.yaml:3: flowLogger.enable: the flow logger sink cannot be used in Proxy mode (only flowCollector and flowStreamService can)`},
		{"proxy and flow logger, supported", "mode: Proxy\nflowLogger:\n  enable: true\n", ptr(allSinks()),
			`cfg.yaml:3: flowLogger.enable: the flow logger sink cannot be used in Proxy mode (only flowCollector and flowStreamService can)`},
		{"proxy and ClickHouse", "mode: Proxy\nclickHouse: {enable: true}\n", ptr(allSinks()),
			`cfg.yaml:2: clickHouse.enable: the ClickHouse sink cannot be used in Proxy mode (only flowCollector and flowStreamService can)`},
		{"proxy and S3", "mode: Proxy\ns3Uploader:\n  enable: true\n  bucketName: b\n", ptr(allSinks()),
			`cfg.yaml:3: s3Uploader.enable: the S3 uploader sink cannot be used in Proxy mode (only flowCollector and flowStreamService can)`},
		{"ClickHouse unsupported", "clickHouse:\n  enable: true\n", nil,
			`cfg.yaml:2: clickHouse.enable: the ClickHouse sink is not supported yet`},
		{"S3 unsupported", "s3Uploader:\n  enable: true\n  bucketName: flows\n", nil,
			`cfg.yaml:2: s3Uploader.enable: the S3 uploader sink is not supported yet`},
		{"flow logger unsupported", "flowLogger:\n  enable: true\n", &ValidateOptions{Sinks: map[string]SinkSupport{}},
			`cfg.yaml:2: flowLogger.enable: the flow logger sink is not supported yet`},
		{"flow logger supported", "flowLogger:\n  enable: true\n", nil, ""},
		{"flow logger in Proxy mode", "mode: Proxy\nflowLogger:\n  enable: true\n", nil,
			`cfg.yaml:3: flowLogger.enable: the flow logger sink cannot be used in Proxy mode (only flowCollector and flowStreamService can)`},
		{"flow stream service unsupported", "flowStreamService:\n  enable: true\n", &ValidateOptions{Sinks: map[string]SinkSupport{}},
			`cfg.yaml:2: flowStreamService.enable: the flow stream service is not supported yet`},
		{"flow stream service supported", "flowStreamService:\n  enable: true\n", nil, ""},
		{"flow stream port shared", "flowStreamService:\n  enable: true\nsluice:\n  flowStreamAddress: \":14739\"\n", nil,
			`cfg.yaml:4: sluice.flowStreamAddress: port 14739 is also used by sluice.grpcAddress`},
		{"flow stream port unused when disabled", "sluice:\n  flowStreamAddress: \":14739\"\n", nil, ""},
		{"web UI port shared", "sluice:\n  ui:\n    address: \"10348\"\n", nil,
			`cfg.yaml:3: sluice.ui.address: port 10348 is also used by sluice.apiAddress`},
		{"web UI bad port", "sluice:\n  ui:\n    address: \"localhost:ui\"\n", nil,
			`cfg.yaml:3: sluice.ui.address: "localhost:ui": port "ui" is not a number from 0 to 65535`},
		{"web UI on its own port", "sluice:\n  ui:\n    address: \":8080\"\n", nil, ""},
		{"web UI allowed hosts", "sluice:\n  ui:\n    address: \"0.0.0.0:8080\"\n    allowedHosts: [sluice.example.com, \"sluice.example.com:443\", 10.0.0.7, \"[fd00::7]:8080\", \"fd00::8\"]\n", nil, ""},
		{"web UI bad allowed hosts", "sluice:\n  ui:\n    allowedHosts:\n    - ok.example.com\n    - \"https://sluice.example.com/\"\n    - \"*.example.com\"\n    - \"h:http\"\n", nil,
			`cfg.yaml:3: sluice.ui.allowedHosts[1]: "https://sluice.example.com/": want a host name as the Host header names it (no scheme, path or wildcard), an IP address, or either with :port` + "\n" +
				`cfg.yaml:3: sluice.ui.allowedHosts[2]: "*.example.com": want a host name as the Host header names it (no scheme, path or wildcard), an IP address, or either with :port` + "\n" +
				`cfg.yaml:3: sluice.ui.allowedHosts[3]: "h:http": port "http" is not a number from 0 to 65535`},
		{"flow stream service in Proxy mode", "mode: Proxy\nflowStreamService:\n  enable: true\n", ptr(allSinks()), ""},
		{"flow collector unsupported", "flowCollector:\n  enable: true\n  address: c:4739\n",
			&ValidateOptions{Sinks: map[string]SinkSupport{}},
			`cfg.yaml:2: flowCollector.enable: the flow collector sink is not supported yet`},
		{"ClickHouse queue and TTL", "clickHouse:\n  enable: true\n  queueSize: -1\n  ttl: -1s\n", ptr(allSinks()),
			"cfg.yaml:3: clickHouse.queueSize: must be at least 1, got -1\ncfg.yaml:4: clickHouse.ttl: must be at least 0s, got -1s"},
		{"disabled sinks are not checked", "clickHouse:\n  commitInterval: 1ms\ns3Uploader:\n  uploadInterval: 1ms\nflowCollector:\n  maxIPFIXMsgSize: 5\n", nil, ""},

		// flowCollector.
		{"collector without address", "flowCollector:\n  enable: true\n", nil,
			`cfg.yaml:2: flowCollector.address: required when flowCollector.enable is true`},
		{"collector bad address", "flowCollector:\n  enable: true\n  address: \"10.0.0.1:4739:sctp\"\n", nil,
			`cfg.yaml:3: flowCollector.address: "10.0.0.1:4739:sctp": transport "sctp" is not tcp or udp`},
		{"collector settings", `flowCollector:
  enable: true
  address: "[fd00::10]:4739:udp"
  recordFormat: json
  templateRefreshTimeout: -1s
  maxIPFIXMsgSize: 100
  tls:
    enable: true
    minVersion: VersionTLS11
`, nil, strings.Join([]string{
			`cfg.yaml:4: flowCollector.recordFormat: "json" is not valid (want IPFIX or JSON, case-sensitive)`,
			`cfg.yaml:5: flowCollector.templateRefreshTimeout: must not be negative, got -1s`,
			`cfg.yaml:6: flowCollector.maxIPFIXMsgSize: must be 0 (automatic) or from 512 to 65535, got 100`,
			`cfg.yaml:8: flowCollector.tls.enable: TLS needs the tcp transport, and flowCollector.address names udp`,
			`cfg.yaml:9: flowCollector.tls.minVersion: "VersionTLS11" is not valid (want VersionTLS12 or VersionTLS13, case-sensitive)`,
		}, "\n")},
		{"collector good settings", `flowCollector:
  enable: true
  address: "collector.example:4739"
  recordFormat: JSON
  templateRefreshTimeout: 0s
  maxIPFIXMsgSize: 1400
  tls: {enable: true, minVersion: VersionTLS13, caSecretName: ca}
sluice:
  collectorTLS: {certFile: c.crt, keyFile: c.key}
`, nil, ""},
		{"collector TLS files without TLS", "flowCollector:\n  enable: true\n  address: c:1\nsluice:\n  collectorTLS:\n    caFile: ca.crt\n", nil,
			`cfg.yaml:5: sluice.collectorTLS: set, but flowCollector.tls.enable is false`},
		{"collector TLS conflicts", `flowCollector:
  enable: true
  address: c:1
  tls: {enable: true, caSecretName: ca, clientSecretName: client}
sluice:
  collectorTLS:
    caFile: ca.crt
    certFile: c.crt
`, nil, strings.Join([]string{
			`cfg.yaml:7: sluice.collectorTLS.caFile: conflicts with flowCollector.tls.caSecretName; set one of them`,
			`cfg.yaml:8: sluice.collectorTLS.keyFile: required with sluice.collectorTLS.certFile`,
			`cfg.yaml:8: sluice.collectorTLS.certFile: conflicts with flowCollector.tls.clientSecretName; set one of them`,
		}, "\n")},

		// Sinks not run yet, with every sink supported.
		{"ClickHouse settings", "clickHouse:\n  enable: true\n  databaseURL: ftp://db:21\n  commitInterval: 500ms\n", ptr(allSinks()), strings.Join([]string{
			`cfg.yaml:3: clickHouse.databaseURL: "ftp://db:21" is not <scheme>://<host>:<port> with scheme tcp, tls, http or https`,
			`cfg.yaml:4: clickHouse.commitInterval: must be at least 1s, got 500ms`,
		}, "\n")},
		{"ClickHouse good", "clickHouse:\n  enable: true\n  databaseURL: https://db.example:8443\n  commitInterval: 1s\n", ptr(allSinks()), ""},
		{"S3 settings", "s3Uploader:\n  enable: true\n  recordFormat: JSON\n  uploadInterval: 0s\n  maxRecordsPerFile: -5\n", ptr(allSinks()), strings.Join([]string{
			`cfg.yaml:2: s3Uploader.bucketName: required when s3Uploader.enable is true`,
			`cfg.yaml:3: s3Uploader.recordFormat: "JSON" is not valid (want CSV or Parquet, case-sensitive)`,
			`cfg.yaml:4: s3Uploader.uploadInterval: must be at least 1s, got 0s`,
			`cfg.yaml:5: s3Uploader.maxRecordsPerFile: must be at least 1, got -5`,
		}, "\n")},
		{"S3 endpoint", "s3Uploader:\n  enable: true\n  bucketName: b\n  endpoint: s3.local:9000\n", ptr(allSinks()),
			`cfg.yaml:4: s3Uploader.endpoint: "s3.local:9000" is not http://<host>[:<port>] or https://<host>[:<port>]`},
		{"S3 endpoint with a path", "s3Uploader:\n  enable: true\n  bucketName: b\n  endpoint: http://s3.local/flows\n", ptr(allSinks()),
			`cfg.yaml:4: s3Uploader.endpoint: "http://s3.local/flows" is not http://<host>[:<port>] or https://<host>[:<port>]`},
		{"S3 Parquet to a store of one's own", "s3Uploader:\n  enable: true\n  bucketName: b\n  recordFormat: Parquet\n  endpoint: https://s3.local:9000\n", ptr(allSinks()), ""},
		{"flow logger settings", `flowLogger:
  enable: true
  maxSize: -1
  maxAge: -2
  filters:
  - ingressNetworkPolicyRuleActions: [Allow, drop]
  - egressNetworkPolicyRuleActions: [None, Deny]
`, ptr(allSinks()), strings.Join([]string{
			`cfg.yaml:3: flowLogger.maxSize: must be at least 1, got -1`,
			`cfg.yaml:4: flowLogger.maxAge: must be at least 0, got -2`,
			`cfg.yaml:6: flowLogger.filters[0].ingressNetworkPolicyRuleActions: "drop" is not valid (want None, Allow, Drop or Reject, case-sensitive)`,
			`cfg.yaml:7: flowLogger.filters[1].egressNetworkPolicyRuleActions: "Deny" is not valid (want None, Allow, Drop or Reject, case-sensitive)`,
		}, "\n")},

		// sluice.
		{"address without port", "sluice:\n  grpcAddress: localhost\n", nil,
			`cfg.yaml:2: sluice.grpcAddress: "localhost" is not host:port: address localhost: missing port in address`},
		{"port out of range", "sluice:\n  apiAddress: \":99999\"\n", nil,
			`cfg.yaml:2: sluice.apiAddress: ":99999": port "99999" is not a number from 0 to 65535`},
		{"named port", "sluice:\n  apiAddress: \"localhost:http\"\n", nil,
			`cfg.yaml:2: sluice.apiAddress: "localhost:http": port "http" is not a number from 0 to 65535`},
		{"bad host", "sluice:\n  ipfixAddress: \"no such host:4739\"\n", nil,
			`cfg.yaml:2: sluice.ipfixAddress: "no such host:4739": "no such host" is neither an IP address nor a DNS name`},
		{"good addresses", "sluice:\n  ipfixAddress: \"[::1]:4739\"\n  grpcAddress: 127.0.0.1:0\n  apiAddress: localhost:8080\n", nil, ""},
		{"shared TCP port", "sluice:\n  grpcAddress: \"127.0.0.1:4739\"\n", nil,
			`cfg.yaml:2: sluice.grpcAddress: port 4739 is also used by sluice.ipfixAddress`},
		{"UDP shares the port", "aggregatorTransportProtocol: udp\nsluice:\n  grpcAddress: \":4739\"\n", nil, ""},
		{"other hosts share the port", "sluice:\n  grpcAddress: \"10.0.0.1:8080\"\n  apiAddress: \"10.0.0.2:8080\"\n", nil, ""},
		{"certDir and files", "sluice:\n  tls:\n    certDir: /var/lib/sluice\n    certFile: s.crt\n    keyFile: s.key\n", nil,
			`cfg.yaml:3: sluice.tls.certDir: set either certDir (generated certificates) or certFile and keyFile, not both`},
		{"cert without key", "sluice:\n  tls:\n    certFile: s.crt\n", nil,
			`cfg.yaml:3: sluice.tls.keyFile: required with sluice.tls.certFile`},
		{"key without cert", "sluice:\n  tls:\n    keyFile: s.key\n    caFile: ca.crt\n", nil,
			`cfg.yaml:3: sluice.tls.certFile: required with sluice.tls.keyFile`},
		{"CA alone", "sluice:\n  tls:\n    caFile: ca.crt\n", nil,
			`cfg.yaml:3: sluice.tls.caFile: needs sluice.tls.certFile and sluice.tls.keyFile (or leave it out to generate certificates)`},
		{"own certificates", "sluice:\n  tls: {certFile: s.crt, keyFile: s.key, caFile: ca.crt}\n", nil, ""},
		{"max flows", "sluice:\n  aggregate:\n    maxFlows: 0\n", nil,
			`cfg.yaml:3: sluice.aggregate.maxFlows: must be at least 1, got 0`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := Decode([]byte(c.in), testFile)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			opts := registrySinks()
			if c.opts != nil {
				opts = *c.opts
			}
			err = a.Validate(opts)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != c.want {
				t.Errorf("got\n%s\nwant\n%s", got, c.want)
			}
			// Parse validates as Validate does without a list of sinks.
			werr := a.Validate(ValidateOptions{})
			if _, perr := Parse([]byte(c.in), testFile); (perr == nil) != (werr == nil) || (perr != nil && perr.Error() != werr.Error()) {
				t.Errorf("Parse: got %v, want %v", perr, werr)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestValidateWithoutFile(t *testing.T) {
	a := Default()
	a.Mode = "proxy"
	a.FlowCollector.Enable = true
	err := a.Validate(ValidateOptions{})
	want := `mode: "proxy" is not a mode (want "Aggregate" or "Proxy", case-sensitive)` + "\n" +
		`flowCollector.address: required when flowCollector.enable is true`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

func TestSinkEnabled(t *testing.T) {
	a := Default()
	a.ClickHouse.Enable, a.FlowStreamService.Enable = true, true
	for key, want := range map[string]bool{SinkFlowCollector: false, SinkClickHouse: true, SinkS3Uploader: false,
		SinkFlowLogger: false, SinkFlowStreamService: true, "nothing": false} {
		if got := a.SinkEnabled(key); got != want {
			t.Errorf("SinkEnabled(%q) = %v, want %v", key, got, want)
		}
	}
	// Without a list of sinks, an enabled sink is not judged.
	a.Mode = ModeProxy
	if err := a.Validate(ValidateOptions{}); err != nil {
		t.Errorf("Validate without sinks: %v", err)
	}
}

func TestTarget(t *testing.T) {
	cases := []struct {
		addr, hostport, proto, err string
	}{
		{"collector.example", "collector.example:4739", "tcp", ""},
		{"10.0.0.1", "10.0.0.1:4739", "tcp", ""},
		{"10.0.0.1:4740", "10.0.0.1:4740", "tcp", ""},
		{"10.0.0.1:4740:udp", "10.0.0.1:4740", "udp", ""},
		{"10.0.0.1:4740:TCP", "10.0.0.1:4740", "tcp", ""},
		{"10.0.0.1::udp", "10.0.0.1:4739", "udp", ""},
		{"[::1]:4739:tcp", "[::1]:4739", "tcp", ""},
		{"[fd00::10]", "[fd00::10]:4739", "tcp", ""},
		{"[fd00::10]:9995", "[fd00::10]:9995", "tcp", ""},
		{"[fe80::1%eth0]:4739:udp", "[fe80::1%eth0]:4739", "udp", ""},
		{"", "", "", `address is empty`},
		{"10.0.0.1:4739:sctp", "", "", `"10.0.0.1:4739:sctp": transport "sctp" is not tcp or udp`},
		{"10.0.0.1:0", "", "", `"10.0.0.1:0": port "0" is not a number from 1 to 65535`},
		{"10.0.0.1:65536", "", "", `"10.0.0.1:65536": port "65536" is not a number from 1 to 65535`},
		{"10.0.0.1:udp", "", "", `"10.0.0.1:udp": port "udp" is not a number from 1 to 65535`},
		{":4739", "", "", `":4739": the host is empty`},
		{"fd00::10", "", "", `"fd00::10": an IPv6 address goes in brackets, as in [fd00::10]:4739`},
		{"fd00::10:4739:tcp", "", "", `"fd00::10:4739:tcp": too many colons (an IPv6 address goes in brackets, as in [fd00::1]:4739)`},
		{"[fd00::10:4739", "", "", `"[fd00::10:4739": missing ] after the IPv6 address`},
		{"[collector]:4739", "", "", `"[collector]:4739": "collector" in brackets is not an IP address`},
		{"[::1]4739", "", "", `"[::1]4739": unexpected "4739" after ]`},
		{"bad host!:4739", "", "", `"bad host!:4739": "bad host!" is neither an IP address nor a DNS name`},
	}
	for _, c := range cases {
		hp, proto, err := FlowCollector{Address: c.addr}.Target()
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if hp != c.hostport || proto != c.proto || gotErr != c.err {
			t.Errorf("Target(%q) = %q, %q, %q; want %q, %q, %q", c.addr, hp, proto, gotErr, c.hostport, c.proto, c.err)
		}
	}
}

func TestSplitListenAddress(t *testing.T) {
	for _, c := range []struct{ addr, host, port string }{
		{":4739", "", "4739"}, {"0.0.0.0:0", "0.0.0.0", "0"}, {"[::]:14739", "::", "14739"},
		{"localhost:10348", "localhost", "10348"},
	} {
		host, port, err := SplitListenAddress(c.addr)
		if err != nil || host != c.host || port != c.port {
			t.Errorf("SplitListenAddress(%q) = %q, %q, %v", c.addr, host, port, err)
		}
	}
	for _, addr := range []string{"", "4739", ":-1", ":65536", "a:b:c", "[::1]"} {
		if _, _, err := SplitListenAddress(addr); err == nil {
			t.Errorf("SplitListenAddress(%q): no error", addr)
		}
	}
}

func TestIsDNSName(t *testing.T) {
	for s, want := range map[string]bool{
		"a": true, "flow-aggregator.flow-aggregator.svc": true, "x.example.": true, "_srv.example": true,
		"": false, ".": false, "-a": false, "a-": false, "a..b": false, "a b": false, "a/b": false,
		strings.Repeat("a", 64): false, strings.Repeat("a.", 127) + "a": false,
	} {
		if got := isDNSName(s); got != want {
			t.Errorf("isDNSName(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestUIListenAddress(t *testing.T) {
	for in, want := range map[string]string{"": "", "8080": "127.0.0.1:8080", ":8080": "127.0.0.1:8080",
		"0.0.0.0:8080": "0.0.0.0:8080", "[::1]:80": "[::1]:80", " 9000 ": "127.0.0.1:9000"} {
		s := Sluice{UI: UIOptions{Address: in}}
		if got := s.UIListenAddress(); got != want {
			t.Errorf("UIListenAddress(%q) = %q, want %q", in, got, want)
		}
	}
}
