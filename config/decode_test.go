package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const testFile = "cfg.yaml"

// withoutMeta returns a copy of a without the file name and key lines, for
// comparing with Default().
func withoutMeta(a *Aggregator) Aggregator {
	c := *a
	c.source, c.lines = "", nil
	return c
}

func TestEmptyFileGivesDefaults(t *testing.T) {
	for _, in := range []string{"", "\n", "# nothing but a comment\n", "---\n", "{}\n", "~\n",
		"sluice:\nflowCollector:\nflowLogger:\n  filters:\n"} {
		a, err := Parse([]byte(in), testFile)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if got, want := withoutMeta(a), withoutMeta(Default()); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: got %+v, want the defaults %+v", in, got, want)
		}
	}
}

// TestDefaultValues pins every default against the reference's tables.
func TestDefaultValues(t *testing.T) {
	a, err := Parse(nil, testFile)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		key       string
		got, want any
	}{
		{"mode", a.Mode, "Aggregate"},
		{"activeFlowRecordTimeout", a.ActiveFlowRecordTimeout.Duration, 60 * time.Second},
		{"inactiveFlowRecordTimeout", a.InactiveFlowRecordTimeout.Duration, 90 * time.Second},
		{"aggregatorTransportProtocol", a.AggregatorTransportProtocol, "tls"},
		{"flowAggregatorAddress", a.FlowAggregatorAddress, ""},
		{"recordContents.podLabels", a.RecordContents.PodLabels, false},
		{"recordBufferSize", a.RecordBufferSize, 8192},
		{"clusterID", a.ClusterID, ""},
		{"apiServer.apiPort", a.APIServer.APIPort, 10348},
		{"apiServer.tlsCipherSuites", a.APIServer.TLSCipherSuites, ""},
		{"apiServer.tlsMinVersion", a.APIServer.TLSMinVersion, ""},
		{"flowStreamService.enable", a.FlowStreamService.Enable, false},
		{"flowCollector.enable", a.FlowCollector.Enable, false},
		{"flowCollector.address", a.FlowCollector.Address, ""},
		{"flowCollector.observationDomainID", a.FlowCollector.ObservationDomainID, (*uint32)(nil)},
		{"flowCollector.recordFormat", a.FlowCollector.RecordFormat, "IPFIX"},
		{"flowCollector.templateRefreshTimeout", a.FlowCollector.TemplateRefreshTimeout.Duration, 600 * time.Second},
		{"flowCollector.maxIPFIXMsgSize", a.FlowCollector.MaxIPFIXMsgSize, 0},
		{"flowCollector.tls.enable", a.FlowCollector.TLS.Enable, false},
		{"flowCollector.tls.caSecretName", a.FlowCollector.TLS.CASecretName, ""},
		{"flowCollector.tls.serverName", a.FlowCollector.TLS.ServerName, ""},
		{"flowCollector.tls.clientSecretName", a.FlowCollector.TLS.ClientSecretName, ""},
		{"flowCollector.tls.minVersion", a.FlowCollector.TLS.MinVersion, "VersionTLS12"},
		{"flowCollector.includeK8sNames", a.FlowCollector.IncludeK8sNames, true},
		{"flowCollector.includeK8sUIDs", a.FlowCollector.IncludeK8sUIDs, false},
		{"clickHouse.enable", a.ClickHouse.Enable, false},
		{"clickHouse.database", a.ClickHouse.Database, "default"},
		{"clickHouse.databaseURL", a.ClickHouse.DatabaseURL, "tcp://clickhouse-clickhouse.flow-visibility.svc:9000"},
		{"clickHouse.tls.insecureSkipVerify", a.ClickHouse.TLS.InsecureSkipVerify, false},
		{"clickHouse.tls.caCert", a.ClickHouse.TLS.CACert, false},
		{"clickHouse.debug", a.ClickHouse.Debug, false},
		{"clickHouse.compress", a.ClickHouse.Compress, true},
		{"clickHouse.commitInterval", a.ClickHouse.CommitInterval.Duration, 8 * time.Second},
		{"clickHouse.createSchema", a.ClickHouse.CreateSchema, false},
		{"clickHouse.queueSize", a.ClickHouse.QueueSize, 524288},
		{"clickHouse.ttl", a.ClickHouse.TTL.Duration, time.Duration(0)},
		{"clickHouse.tls.caFile", a.ClickHouse.TLS.CAFile, "/etc/flow-aggregator/certs/clickhouse/ca.crt"},
		{"s3Uploader.enable", a.S3Uploader.Enable, false},
		{"s3Uploader.bucketName", a.S3Uploader.BucketName, ""},
		{"s3Uploader.bucketPrefix", a.S3Uploader.BucketPrefix, ""},
		{"s3Uploader.region", a.S3Uploader.Region, ""},
		{"s3Uploader.recordFormat", a.S3Uploader.RecordFormat, "CSV"},
		{"s3Uploader.compress", a.S3Uploader.Compress, true},
		{"s3Uploader.maxRecordsPerFile", a.S3Uploader.MaxRecordsPerFile, 1000000},
		{"s3Uploader.uploadInterval", a.S3Uploader.UploadInterval.Duration, 60 * time.Second},
		{"s3Uploader.endpoint", a.S3Uploader.Endpoint, ""},
		{"flowLogger.enable", a.FlowLogger.Enable, false},
		{"flowLogger.path", a.FlowLogger.Path, filepath.Join(os.TempDir(), "antrea-flows.log")},
		{"flowLogger.maxSize", a.FlowLogger.MaxSize, 100},
		{"flowLogger.maxBackups", a.FlowLogger.MaxBackups, 3},
		{"flowLogger.maxAge", a.FlowLogger.MaxAge, 0},
		{"flowLogger.compress", a.FlowLogger.Compress, true},
		{"flowLogger.recordFormat", a.FlowLogger.RecordFormat, "CSV"},
		{"flowLogger.filters", a.FlowLogger.Filters, []FlowFilter(nil)},
		{"flowLogger.prettyPrint", a.FlowLogger.PrettyPrint, true},
		{"kafka", a.Kafka, Kafka{Topic: "sluice-flows", Format: "proto", MaxBufferedRecords: 100000}},
		{"kafka.tls", a.Kafka.TLS, KafkaTLS{}},
		{"kafka.sasl", a.Kafka.SASL, KafkaSASL{}},
		{"sluice.kafkaInput.tls", a.Sluice.KafkaInput.TLS, KafkaTLS{}},
		{"sluice.kafkaInput.sasl", a.Sluice.KafkaInput.SASL, KafkaSASL{}},
		{"sluice.kafkaInput", a.Sluice.KafkaInput, KafkaInput{Topic: "sluice-flows", Group: "sluice-aggregate", SessionTimeout: Duration{45 * time.Second}}},
		{"sluice.ipfixAddress", a.Sluice.IPFIXAddress, ":4739"},
		{"sluice.grpcAddress", a.Sluice.GRPCAddress, ":14739"},
		{"sluice.flowStreamAddress", a.Sluice.FlowStreamAddress, ":14740"},
		{"sluice.apiAddress", a.Sluice.APIAddress, ":10348"},
		{"sluice.ui.address", a.Sluice.UI.Address, ""},
		{"sluice.ui.allowedHosts", a.Sluice.UI.AllowedHosts, []string(nil)},
		{"sluice.inventory", a.Sluice.Inventory, ""},
		{"sluice.kubeconfig", a.Sluice.Kubeconfig, ""},
		{"sluice.tls", a.Sluice.TLS, ServerTLS{ReloadInterval: Duration{10 * time.Second}}},
		{"sluice.collectorTLS", a.Sluice.CollectorTLS, FileTLS{}},
		{"sluice.proxy.passThroughUnknown", a.Sluice.Proxy.PassThroughUnknown, true},
		{"sluice.proxy.fastPath", a.Sluice.Proxy.FastPath, true},
		{"sluice.proxy.fillPods", a.Sluice.Proxy.FillPods, true},
		{"sluice.aggregate.maxFlows", a.Sluice.Aggregate.MaxFlows, 1000000},
		{"sluice.aggregate.exportOneSided", a.Sluice.Aggregate.ExportOneSided, true},
		{"sluice.aggregate.fastPath", a.Sluice.Aggregate.FastPath, true},
		{"sluice.drainTimeout", a.Sluice.DrainTimeout.Duration, 10 * time.Second},
		{"sluice.sinkOverflow", a.Sluice.SinkOverflow, "block"},
		{"sluice.sinkStallTimeout", a.Sluice.SinkStallTimeout.Duration, 5 * time.Second},
		{"sluice.traceflow", a.Sluice.Traceflow, TraceflowOptions{TrafficMode: "encap", TunnelType: "geneve",
			ServiceCIDRs: []string{"10.96.0.0/12"}, TrafficEncryptionMode: "none", Multicast: false, EnableBridgingMode: false}},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %#v, want %#v", c.key, c.got, c.want)
		}
	}
	// Every key of the configuration has its check: a new key needs one.
	covered := map[string]bool{}
	for _, c := range checks {
		covered[c.key] = true
	}
	for _, k := range keyPaths(reflect.TypeFor[Aggregator](), "") {
		parent := k
		if i := strings.LastIndexByte(k, '.'); i >= 0 {
			parent = k[:i]
		}
		if !covered[k] && !covered[parent] && !isSection(k) {
			t.Errorf("no check of the default of %s", k)
		}
	}
}

// isSection reports whether key holds other keys.
func isSection(key string) bool {
	for _, k := range keyPaths(reflect.TypeFor[Aggregator](), "") {
		if strings.HasPrefix(k, key+".") {
			return true
		}
	}
	return false
}

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(ValidateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestAntreaConfLoads(t *testing.T) {
	const path = "testdata/antrea-flow-aggregator.conf"
	a, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := withoutMeta(Default())
	want.FlowLogger.Path = "/tmp/antrea-flows.log"
	want.S3Uploader.Region = "us-west-2"
	if got := withoutMeta(a); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if a.Source() != path {
		t.Errorf("Source() = %q", a.Source())
	}
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for key, line := range map[string]string{
		"mode":                         `mode: "Aggregate"`,
		"flowCollector.tls.minVersion": `minVersion: "VersionTLS12"`,
		"clickHouse.tls.caCert":        `caCert: false`,
		"recordBufferSize":             `recordBufferSize: 8192`,
	} {
		if got, want := a.Line(key), lineOf(t, string(text), line); got != want {
			t.Errorf("Line(%q) = %d, want %d", key, got, want)
		}
	}
	if got := a.Line("sluice.grpcAddress"); got != 0 {
		t.Errorf("Line of an absent key = %d, want 0", got)
	}
}

// TestAntreaConfAllSinks enables every sink of the Antrea file with every
// sink supported: the only problem is the S3 bucket the chart leaves empty.
func TestAntreaConfAllSinks(t *testing.T) {
	text, err := os.ReadFile("testdata/antrea-flow-aggregator.conf")
	if err != nil {
		t.Fatal(err)
	}
	in := strings.ReplaceAll(string(text), "enable: false", "enable: true")
	in = strings.Replace(in, `address: ""`, `address: "collector.example:4739:tcp"`, 1)
	a, err := Decode([]byte(in), testFile)
	if err != nil {
		t.Fatal(err)
	}
	err = a.Validate(allSinks())
	want := fmt.Sprintf("cfg.yaml:%d: s3Uploader.bucketName: required when s3Uploader.enable is true",
		lineOf(t, in, `bucketName: ""`))
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

func lineOf(t *testing.T, text, substr string) int {
	t.Helper()
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			return i + 1
		}
	}
	t.Fatalf("%q not in the text", substr)
	return 0
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "read config: open ") {
		t.Errorf("got %v", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name, in, want string
	}{
		{"typo with suggestion", "mode: Aggregate\nflowColector:\n  enable: true\n",
			`cfg.yaml:2: unknown key "flowColector" (did you mean "flowCollector"?)`},
		{"nested typo", "flowCollector:\n  enable: false\n  adress: 10.0.0.1\n",
			`cfg.yaml:3: unknown key "flowCollector.adress" (did you mean "flowCollector.address"?)`},
		{"swapped letters", "mdoe: Proxy\n",
			`cfg.yaml:1: unknown key "mdoe" (did you mean "mode"?)`},
		{"wrong case", "activeFlowRecordTimeOut: 10s\n",
			`cfg.yaml:1: unknown key "activeFlowRecordTimeOut" (did you mean "activeFlowRecordTimeout"?)`},
		{"key of another section", "ipfixAddress: \":4739\"\n",
			`cfg.yaml:1: unknown key "ipfixAddress" (did you mean "sluice.ipfixAddress"?)`},
		{"key of several sections", "enable: true\n",
			`cfg.yaml:1: unknown key "enable"`},
		{"nothing close", "colour: blue\n",
			`cfg.yaml:1: unknown key "colour"`},
		{"sluice key", "sluice:\n  tls:\n    certdir: /x\n",
			`cfg.yaml:3: unknown key "sluice.tls.certdir" (did you mean "sluice.tls.certDir"?)`},
		{"in a list", "flowLogger:\n  filters:\n  - ingressNetworkPolicyRuleAction: [Drop]\n",
			`cfg.yaml:3: unknown key "flowLogger.filters[0].ingressNetworkPolicyRuleAction" (did you mean "flowLogger.filters[0].ingressNetworkPolicyRuleActions"?)`},
		{"repeated key", "mode: Proxy\nmode: Aggregate\n",
			`cfg.yaml:2: mode: key repeated (first at line 1)`},
		{"merge", "sluice:\n  <<: {grpcAddress: \":1\"}\n",
			`cfg.yaml:2: sluice: merge keys (<<) are not supported`},
		{"bad duration", "activeFlowRecordTimeout: 60\n",
			`cfg.yaml:1: activeFlowRecordTimeout: invalid duration: time: missing unit in duration "60" (write it like "60s" or "1m30s")`},
		{"bad nested duration", "flowCollector:\n  templateRefreshTimeout: soon\n",
			`cfg.yaml:2: flowCollector.templateRefreshTimeout: invalid duration: time: invalid duration "soon" (write it like "60s" or "1m30s")`},
		{"duration as a list", "clickHouse:\n  commitInterval: [8s]\n",
			`cfg.yaml:2: clickHouse.commitInterval: expected a duration such as "60s", found a list`},
		{"bad boolean", "recordContents:\n  podLabels: maybe\n",
			`cfg.yaml:2: recordContents.podLabels: "maybe" is not a boolean (true or false)`},
		{"bad integer", "recordBufferSize: lots\n",
			`cfg.yaml:1: recordBufferSize: "lots" is not an integer`},
		{"negative domain", "flowCollector:\n  observationDomainID: -1\n",
			`cfg.yaml:2: flowCollector.observationDomainID: "-1" is not an integer from 0 to 4294967295`},
		{"section as a value", "flowCollector: true\n",
			`cfg.yaml:1: flowCollector: expected a mapping of keys, found "true"`},
		{"list for a string", "mode: [Proxy]\n",
			`cfg.yaml:1: mode: expected a string, found a list`},
		{"scalar for a list", "flowLogger:\n  filters:\n  - egressNetworkPolicyRuleActions: Drop\n",
			`cfg.yaml:3: flowLogger.filters[0].egressNetworkPolicyRuleActions: "Drop" is not a list of strings`},
		{"mapping for a list", "flowLogger:\n  filters: {}\n",
			`cfg.yaml:2: flowLogger.filters: expected a list, found a mapping`},
		{"not a mapping", "- mode: Proxy\n",
			`cfg.yaml:1: expected a mapping of keys, found a list`},
		{"syntax", "mode: Proxy\n  bad: indent\n",
			`cfg.yaml:2: invalid YAML: mapping values are not allowed in this context`},
		{"two documents", "mode: Proxy\n---\nmode: Aggregate\n",
			`cfg.yaml:2: a second YAML document; the file must hold one`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := Parse([]byte(c.in), testFile)
			if err == nil || err.Error() != c.want {
				t.Errorf("got  %v\nwant %s", err, c.want)
			}
			if a != nil {
				t.Error("a configuration returned with an error")
			}
		})
	}
}

func TestErrorTypes(t *testing.T) {
	_, err := Parse([]byte("mode: Aggregate\nsluice:\n  grpcAdress: x\n  apiAddress: nope\n"), testFile)
	var uk *UnknownKeyError
	if !errors.As(err, &uk) || uk.Line != 3 || uk.Key != "sluice.grpcAdress" || uk.Suggestion != "sluice.grpcAddress" {
		t.Errorf("UnknownKeyError: got %+v", uk)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Line != 4 || fe.Key != "sluice.apiAddress" || fe.File != testFile {
		t.Errorf("FieldError: got %+v", fe)
	}
	if fe != nil && fe.Unwrap() == nil {
		t.Error("the address error does not wrap its cause")
	}
}

func TestAliases(t *testing.T) {
	in := "sluice:\n  grpcAddress: &addr \"127.0.0.1:14739\"\n  apiAddress: *addr\n"
	// An alias is read as its anchor's value; here that makes two listeners
	// share one port, which validation reports on the alias's line.
	_, err := Parse([]byte(in), testFile)
	want := `cfg.yaml:3: sluice.apiAddress: port 14739 is also used by sluice.grpcAddress`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

func TestTimeoutsRoundedUp(t *testing.T) {
	cases := []struct {
		in   string
		want time.Duration
	}{
		{"500ms", time.Second},
		{"0s", time.Second},
		{"0", time.Second},
		{"-3s", time.Second},
		{"1500ms", 1500 * time.Millisecond},
		{"1m30s", 90 * time.Second},
		{`""`, 60 * time.Second}, // empty: the default
		{"", 60 * time.Second},   // null: the default
	}
	for _, c := range cases {
		a, err := Parse([]byte("activeFlowRecordTimeout: "+c.in+"\ninactiveFlowRecordTimeout: "+c.in+"\n"), testFile)
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if a.ActiveFlowRecordTimeout.Duration != c.want {
			t.Errorf("%q: active = %v, want %v", c.in, a.ActiveFlowRecordTimeout, c.want)
		}
		wantInactive := c.want
		if c.in == "" || c.in == `""` {
			wantInactive = 90 * time.Second
		}
		if a.InactiveFlowRecordTimeout.Duration != wantInactive {
			t.Errorf("%q: inactive = %v, want %v", c.in, a.InactiveFlowRecordTimeout, wantInactive)
		}
	}
}

func TestEmptyMeansDefault(t *testing.T) {
	in := `mode: ""
aggregatorTransportProtocol: ""
recordBufferSize: 0
apiServer: {apiPort: 0}
flowCollector: {recordFormat: "", templateRefreshTimeout: ""}
clickHouse: {database: "", databaseURL: "", commitInterval: ""}
s3Uploader: {recordFormat: "", maxRecordsPerFile: 0, uploadInterval: ""}
flowLogger: {path: "", maxSize: 0, recordFormat: ""}
sluice: {ipfixAddress: "", apiAddress: ""}
`
	a, err := Parse([]byte(in), testFile)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := withoutMeta(a), withoutMeta(Default()); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

// TestEmptyGRPCAddressTurnsOff: unlike other keys, an empty
// sluice.grpcAddress is kept (the collector is off); without a value it is
// the default. An empty flowStreamAddress is refused while the service is
// enabled.
func TestEmptyGRPCAddressTurnsOff(t *testing.T) {
	for in, want := range map[string]string{
		`sluice: {grpcAddress: ""}`:    "",
		`sluice: {grpcAddress: ''}`:    "",
		"sluice: {grpcAddress: }":      ":14739",
		"sluice: {grpcAddress: ~}":     ":14739",
		`sluice: {apiAddress: ":1"}`:   ":14739",
		`sluice: {grpcAddress: ":99"}`: ":99",
	} {
		a, err := Parse([]byte(in), testFile)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if a.Sluice.GRPCAddress != want {
			t.Errorf("%s: grpcAddress %q, want %q", in, a.Sluice.GRPCAddress, want)
		}
	}
	_, err := Parse([]byte("flowStreamService: {enable: true}\nsluice: {flowStreamAddress: \"\"}\n"), testFile)
	if err == nil || !strings.Contains(err.Error(), "sluice.flowStreamAddress") || !strings.Contains(err.Error(), "enable: false") {
		t.Errorf("empty flowStreamAddress with the service on: %v", err)
	}
	if _, err := Parse([]byte("flowStreamService: {enable: false}\nsluice: {flowStreamAddress: \"\"}\n"), testFile); err != nil {
		t.Errorf("empty flowStreamAddress with the service off: %v", err)
	}
}

func TestExplicitValuesKept(t *testing.T) {
	in := `flowCollector:
  includeK8sNames: false
  templateRefreshTimeout: 0s
  observationDomainID: 0
flowLogger:
  maxBackups: 0
  compress: no
sluice:
  proxy: {passThroughUnknown: false, fastPath: false}
  aggregate: {exportOneSided: off}
aggregatorTransportProtocol: UDP
`
	a, err := Parse([]byte(in), testFile)
	if err != nil {
		t.Fatal(err)
	}
	if a.FlowCollector.IncludeK8sNames || a.FlowCollector.TemplateRefreshTimeout.Duration != 0 ||
		a.FlowCollector.ObservationDomainID == nil || *a.FlowCollector.ObservationDomainID != 0 ||
		a.FlowLogger.MaxBackups != 0 || a.FlowLogger.Compress ||
		a.Sluice.Proxy.PassThroughUnknown || a.Sluice.Proxy.FastPath || a.Sluice.Aggregate.ExportOneSided {
		t.Errorf("explicit values lost: %+v", a)
	}
	if a.AggregatorTransportProtocol != TransportUDP {
		t.Errorf("transport = %q, want it lowercased", a.AggregatorTransportProtocol)
	}
}

func TestMultipleErrorsInLineOrder(t *testing.T) {
	in := `mode: proxy
activeFlowRecordTimeout: 10
flowColector:
  enable: true
sluice:
  grpcAddress: nowhere
  aggregate:
    maxFlows: 0
clickHouse:
  enable: true
`
	_, err := ParseWith([]byte(in), testFile, registrySinks())
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		`cfg.yaml:1: mode: "proxy" is not a mode (want "Aggregate" or "Proxy", case-sensitive)`,
		`cfg.yaml:2: activeFlowRecordTimeout: invalid duration: time: missing unit in duration "10" (write it like "60s" or "1m30s")`,
		`cfg.yaml:3: unknown key "flowColector" (did you mean "flowCollector"?)`,
		`cfg.yaml:6: sluice.grpcAddress: "nowhere" is not host:port: address nowhere: missing port in address`,
		`cfg.yaml:8: sluice.aggregate.maxFlows: must be at least 1, got 0`,
		`cfg.yaml:10: clickHouse.enable: the ClickHouse sink is not supported yet`,
	}
	got := strings.Split(err.Error(), "\n")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	a, err := Load("../examples/aggregator-aggregate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "activeFlowRecordTimeout: 1m0s") {
		t.Errorf("durations not written as strings:\n%s", out)
	}
	b, err := Parse(out, "round-trip")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got, want := withoutMeta(b), withoutMeta(a); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"a", "", 1}, {"", "ab", 2}, {"mode", "mode", 0}, {"mdoe", "mode", 1},
		{"adress", "address", 1}, {"flowcolector", "flowcollector", 1}, {"kitten", "sitting", 3},
	} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestKeyError(t *testing.T) {
	a, err := Parse([]byte("sluice:\n  tls:\n    certFile: /x.crt\n    keyFile: /x.key\n"), testFile)
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("open /x.crt: no such file or directory")
	err = a.KeyError("sluice.tls.certFile", cause)
	if want := "cfg.yaml:3: sluice.tls.certFile: open /x.crt: no such file or directory"; err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if !errors.Is(err, cause) {
		t.Error("KeyError does not wrap its cause")
	}
	// A key absent from the file points at its section, or at nothing.
	if got := a.KeyError("sluice.tls.caFile", cause).Error(); !strings.HasPrefix(got, "cfg.yaml:2: ") {
		t.Errorf("got %v", got)
	}
	if got := Default().KeyError("mode", cause).Error(); got != "mode: "+cause.Error() {
		t.Errorf("got %v", got)
	}
}

func TestCertDirectory(t *testing.T) {
	if got, _ := (ServerTLS{CertDir: "/etc/sluice/certs"}).CertDirectory(); got != "/etc/sluice/certs" {
		t.Errorf("CertDir set: got %q", got)
	}
	t.Setenv("XDG_STATE_HOME", "/state")
	if got, _ := (ServerTLS{}).CertDirectory(); got != "/state/sluice/certs" {
		t.Errorf("XDG_STATE_HOME set: got %q", got)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if got, _ := (ServerTLS{}).CertDirectory(); got != "/home/u/.local/state/sluice/certs" {
		t.Errorf("HOME only: got %q", got)
	}
	t.Setenv("HOME", "")
	if _, err := (ServerTLS{}).CertDirectory(); err == nil || !strings.HasPrefix(err.Error(), "sluice.tls.certDir: no default directory; set the key: ") {
		t.Errorf("no HOME: got %v", err)
	}
	if !(ServerTLS{}).Generated() || (ServerTLS{CertFile: "a", KeyFile: "b"}).Generated() {
		t.Error("Generated")
	}
}
