// Package config reads the configuration file of `sluice aggregator`.
//
// The file is YAML. It accepts every key of Antrea's flow-aggregator.conf,
// with Antrea's defaults, so an existing Antrea file can be used as it is.
// Keys Sluice adds live under the single top-level key `sluice`, except the
// few that only make sense inside a sink's own section (clickHouse.createSchema,
// clickHouse.queueSize, clickHouse.ttl, clickHouse.tls.caFile).
//
// [Load] and [Parse] decode the file strictly: an unknown key (usually a
// typo) is an error naming the key and its line, with a suggestion when a
// known key is close. Absent keys take their defaults; as in Antrea, an
// empty string (or null) for a key that has a default also means the
// default. [Aggregator.Validate] then checks values and combinations of
// keys. Every problem found is reported at once, one per line, ordered by
// line in the file.
package config

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"sluice/certs"
)

// Modes of the aggregator (the `mode` key; the values are case-sensitive).
const (
	ModeAggregate = "Aggregate"
	ModeProxy     = "Proxy"
)

// Transports of the IPFIX collector (the `aggregatorTransportProtocol` key,
// case-insensitive in the file and lowercased by [Parse]). With
// TransportNone the IPFIX collector is not started; the gRPC collector
// always is.
const (
	TransportTLS  = "tls"
	TransportTCP  = "tcp"
	TransportUDP  = "udp"
	TransportNone = "none"
)

// Record formats.
const (
	FormatIPFIX = "IPFIX" // flowCollector.recordFormat
	FormatJSON  = "JSON"  // flowCollector.recordFormat
	FormatCSV   = "CSV"   // s3Uploader.recordFormat, flowLogger.recordFormat
	// FormatParquet is Sluice's s3Uploader.recordFormat: typed columns.
	FormatParquet = "Parquet"
)

// What the pipeline does when a sink falls a whole buffer behind (the
// `sluice.sinkOverflow` key, case-sensitive).
const (
	// SinkOverflowBlock waits for a sink that is behind while it keeps
	// sending (back-pressure), up to sluice.sinkStallTimeout.
	SinkOverflowBlock = "block"
	// SinkOverflowDrop overwrites what the sink has not read.
	SinkOverflowDrop = "drop"
)

// Defaults that are not obvious from [Default].
const (
	// DefaultCollectorPort is the port of flowCollector.address when the
	// address has none.
	DefaultCollectorPort = "4739"
	// DefaultCollectorProto is the transport of flowCollector.address when
	// the address names none.
	DefaultCollectorProto = "tcp"
	// DefaultClickHouseURL is the default clickHouse.databaseURL.
	DefaultClickHouseURL = "tcp://clickhouse-clickhouse.flow-visibility.svc:9000"
	// DefaultFlowLogFile is the file name of the default flowLogger.path, in
	// the directory of os.TempDir.
	DefaultFlowLogFile = "antrea-flows.log"
)

// Aggregator is the whole configuration of `sluice aggregator`. Field names
// follow the YAML keys; see [Default] for the default of each.
//
// Values come from [Load] or [Parse], or from [Default] for a configuration
// built in code. The unexported part remembers the file name and the line of
// every key, so that errors can point into the file.
type Aggregator struct {
	// Mode is ModeAggregate (correlate the two halves of a flow and export
	// one record) or ModeProxy (enrich and forward each record as it comes).
	Mode string `yaml:"mode"`
	// ActiveFlowRecordTimeout is how often an aggregated flow that keeps
	// receiving records is exported. Values under 1s become 1s.
	ActiveFlowRecordTimeout Duration `yaml:"activeFlowRecordTimeout"`
	// InactiveFlowRecordTimeout is how long an aggregated flow is kept after
	// its last record. Values under 1s become 1s.
	InactiveFlowRecordTimeout Duration `yaml:"inactiveFlowRecordTimeout"`
	// AggregatorTransportProtocol is the transport of the IPFIX collector:
	// TransportTLS, TransportTCP, TransportUDP or TransportNone (lowercase
	// after Parse).
	AggregatorTransportProtocol string `yaml:"aggregatorTransportProtocol"`
	// FlowAggregatorAddress is an extra DNS name or IP address put in the
	// generated server certificate.
	FlowAggregatorAddress string `yaml:"flowAggregatorAddress"`
	// RecordContents selects optional record contents.
	RecordContents RecordContents `yaml:"recordContents"`
	// ClusterID is exported in the clusterId element; empty means the
	// cluster's UUID (package clusterid), or nothing without a cluster.
	ClusterID string `yaml:"clusterID"`
	// RecordBufferSize is the number of records the buffer between the
	// pipeline and the sinks holds.
	RecordBufferSize int `yaml:"recordBufferSize"`
	// APIServer holds Antrea's API server settings. Sluice serves its own
	// HTTP API on Sluice.APIAddress; these keys are accepted, and checked,
	// so that Antrea files load.
	APIServer APIServer `yaml:"apiServer"`
	// FlowStreamService is the gRPC service streaming flows to UIs.
	FlowStreamService FlowStreamService `yaml:"flowStreamService"`
	// FlowCollector is the external IPFIX (or JSON) collector sink.
	FlowCollector FlowCollector `yaml:"flowCollector"`
	// ClickHouse is the ClickHouse sink.
	ClickHouse ClickHouse `yaml:"clickHouse"`
	// S3Uploader is the S3 sink.
	S3Uploader S3Uploader `yaml:"s3Uploader"`
	// FlowLogger is the local log file sink.
	FlowLogger FlowLogger `yaml:"flowLogger"`
	// Kafka is the Kafka sink (config/kafka.go).
	Kafka Kafka `yaml:"kafka"`
	// Sluice holds the settings Sluice adds to Antrea's.
	Sluice Sluice `yaml:"sluice"`

	source string         // file name given to Parse or Load
	lines  map[string]int // key path ("flowCollector.address") → line
}

// RecordContents is the `recordContents` section.
type RecordContents struct {
	// PodLabels adds the labels of the source and destination Pods.
	PodLabels bool `yaml:"podLabels"`
}

// APIServer is the `apiServer` section (Antrea's API server).
type APIServer struct {
	APIPort int `yaml:"apiPort"`
	// TLSCipherSuites is a comma-separated list of cipher suite names as
	// crypto/tls spells them; empty means Go's defaults.
	TLSCipherSuites string `yaml:"tlsCipherSuites"`
	// TLSMinVersion is "", VersionTLS10, VersionTLS11, VersionTLS12 or
	// VersionTLS13.
	TLSMinVersion string `yaml:"tlsMinVersion"`
}

// FlowStreamService is the `flowStreamService` section.
type FlowStreamService struct {
	Enable bool `yaml:"enable"`
}

// FlowCollector is the `flowCollector` section: export to an external
// IPFIX collector (or JSON lines over the same connection).
type FlowCollector struct {
	Enable bool `yaml:"enable"`
	// Address is `<host>:<port>[:<proto>]`, IPv6 hosts in brackets; see
	// [FlowCollector.Target].
	Address string `yaml:"address"`
	// ObservationDomainID is the domain of exported messages; nil means
	// the FNV-1 (32-bit) hash of the cluster UUID's 16 octets (of the
	// ClusterID text when there is no cluster UUID).
	ObservationDomainID *uint32 `yaml:"observationDomainID"`
	// RecordFormat is FormatIPFIX or FormatJSON.
	RecordFormat string `yaml:"recordFormat"`
	// TemplateRefreshTimeout is how often templates are re-sent over UDP.
	TemplateRefreshTimeout Duration `yaml:"templateRefreshTimeout"`
	// MaxIPFIXMsgSize is the largest message sent; 0 means chosen from the
	// transport: 65535 octets over TCP, 1400 over UDP (an Ethernet frame
	// with room for the headers; the path MTU is not probed).
	MaxIPFIXMsgSize int          `yaml:"maxIPFIXMsgSize"`
	TLS             CollectorTLS `yaml:"tls"`
	// IncludeK8sNames exports the names of Pods, Nodes and so on.
	IncludeK8sNames bool `yaml:"includeK8sNames"`
	// IncludeK8sUIDs exports their UIDs.
	IncludeK8sUIDs bool `yaml:"includeK8sUIDs"`
}

// CollectorTLS is the `flowCollector.tls` section. In Kubernetes the CA and
// the client key pair come from Secrets named here, in the aggregator's
// namespace, read through the API at start-up and before each connection
// (package sink/ipfixout); outside it, from the files of
// Sluice.CollectorTLS. Without a CA, the system roots are used; without a
// client certificate, none is presented.
type CollectorTLS struct {
	Enable bool `yaml:"enable"`
	// CASecretName is a Secret holding `ca.crt`.
	CASecretName string `yaml:"caSecretName"`
	// ServerName is checked against the collector's certificate; empty
	// means the host of the address.
	ServerName string `yaml:"serverName"`
	// ClientSecretName is a kubernetes.io/tls Secret with the client pair
	// (`tls.crt`, `tls.key`).
	ClientSecretName string `yaml:"clientSecretName"`
	// MinVersion is VersionTLS12 or VersionTLS13.
	MinVersion string `yaml:"minVersion"`
}

// ClickHouse is the `clickHouse` section.
type ClickHouse struct {
	Enable   bool   `yaml:"enable"`
	Database string `yaml:"database"`
	// DatabaseURL is `<scheme>://<host>:<port>` with scheme tcp, tls, http
	// or https.
	DatabaseURL string        `yaml:"databaseURL"`
	TLS         ClickHouseTLS `yaml:"tls"`
	Debug       bool          `yaml:"debug"`
	// Compress turns on lz4 compression.
	Compress bool `yaml:"compress"`
	// CommitInterval is the time between batch inserts (at least 1s).
	CommitInterval Duration `yaml:"commitInterval"`
	// CreateSchema (Sluice) creates the flows table and its views at start
	// when they are missing.
	CreateSchema bool `yaml:"createSchema"`
	// QueueSize (Sluice) bounds the rows waiting to be inserted; beyond
	// it the oldest are dropped and counted.
	QueueSize int `yaml:"queueSize"`
	// TTL (Sluice) is how long rows live in a table CreateSchema creates;
	// 0 keeps them. Servers older than 19.6 have no TTL.
	TTL Duration `yaml:"ttl"`
}

// ClickHouseTLS is the `clickHouse.tls` section.
type ClickHouseTLS struct {
	InsecureSkipVerify bool `yaml:"insecureSkipVerify"`
	// CACert means: verify the server with the CA in CAFile.
	CACert bool `yaml:"caCert"`
	// CAFile (Sluice) is the CA's PEM file; the default is where the
	// reference's chart mounts its clickhouse-ca Secret.
	CAFile string `yaml:"caFile"`
}

// DefaultClickHouseCAFile is the default clickHouse.tls.caFile.
const DefaultClickHouseCAFile = "/etc/flow-aggregator/certs/clickhouse/ca.crt"

// S3Uploader is the `s3Uploader` section.
type S3Uploader struct {
	Enable bool `yaml:"enable"`
	// BucketName is required when the uploader is enabled.
	BucketName   string `yaml:"bucketName"`
	BucketPrefix string `yaml:"bucketPrefix"`
	// Region is a hint for locating the bucket; empty means AWS_REGION,
	// then us-west-2.
	Region string `yaml:"region"`
	// RecordFormat is FormatCSV (Antrea's rows) or FormatParquet (Sluice's
	// typed columns).
	RecordFormat string `yaml:"recordFormat"`
	// Compress gzips uploaded CSV files (zstd pages in Parquet files).
	Compress          bool `yaml:"compress"`
	MaxRecordsPerFile int  `yaml:"maxRecordsPerFile"`
	// UploadInterval is the time between uploads (at least 1s).
	UploadInterval Duration `yaml:"uploadInterval"`
	// Endpoint (Sluice's key) is the URL of an S3-compatible store,
	// http:// or https://; empty means AWS S3.
	Endpoint string `yaml:"endpoint"`
}

// FlowLogger is the `flowLogger` section: one CSV line per exported record
// in a rotated local file.
type FlowLogger struct {
	Enable bool `yaml:"enable"`
	// Path is the log file.
	Path string `yaml:"path"`
	// MaxSize is the size in megabytes at which the file is rotated.
	MaxSize int `yaml:"maxSize"`
	// MaxBackups is how many rotated files are kept; 0 keeps all.
	MaxBackups int `yaml:"maxBackups"`
	// MaxAge is how many days rotated files are kept; 0 keeps them.
	MaxAge int `yaml:"maxAge"`
	// Compress gzips rotated files.
	Compress bool `yaml:"compress"`
	// RecordFormat is FormatCSV (the only format).
	RecordFormat string `yaml:"recordFormat"`
	// Filters select the records logged: a record is logged when any filter
	// matches it; with no filters every record is.
	Filters []FlowFilter `yaml:"filters"`
	// PrettyPrint writes protocol names, actions and policy types as words.
	PrettyPrint bool `yaml:"prettyPrint"`
}

// FlowFilter matches a record when each of its non-empty lists contains
// the record's rule action. Actions are None, Allow, Drop or Reject.
type FlowFilter struct {
	IngressNetworkPolicyRuleActions []string `yaml:"ingressNetworkPolicyRuleActions"`
	EgressNetworkPolicyRuleActions  []string `yaml:"egressNetworkPolicyRuleActions"`
}

// Sluice is the `sluice` section: what Sluice adds to Antrea's keys.
type Sluice struct {
	// IPFIXAddress is where the IPFIX collector listens (host:port), with
	// the transport of AggregatorTransportProtocol.
	IPFIXAddress string `yaml:"ipfixAddress"`
	// GRPCAddress is where the gRPC collector listens (always mutual TLS).
	// Unlike other keys, an explicit empty value is kept: it turns the
	// gRPC collector off (a key without a value keeps the default).
	GRPCAddress string `yaml:"grpcAddress"`
	// FlowStreamAddress is where FlowStreamService listens (server TLS,
	// no client certificate) when flowStreamService.enable is true; it
	// must not be empty then (flowStreamService.enable: false turns the
	// service off).
	FlowStreamAddress string `yaml:"flowStreamAddress"`
	// APIAddress is where the HTTP API listens: /metrics, /healthz, /readyz.
	APIAddress string `yaml:"apiAddress"`
	// Inventory is a file of Pod, Node and Service metadata for enrichment,
	// as `kubectl get pods,nodes,services -A -o yaml` (or -o json) prints
	// it, re-read when it changes; empty means none.
	Inventory string `yaml:"inventory"`
	// Kubeconfig is a kubeconfig file; empty leaves the choice (in-cluster
	// configuration or no Kubernetes at all) to the command.
	Kubeconfig string `yaml:"kubeconfig"`
	// TLS is the collectors' own TLS material.
	TLS ServerTLS `yaml:"tls"`
	// CollectorTLS holds files for TLS to the external collector, used
	// when flowCollector.tls.enable is true.
	CollectorTLS FileTLS `yaml:"collectorTLS"`
	// Proxy holds settings of Proxy mode.
	Proxy ProxyOptions `yaml:"proxy"`
	// Aggregate holds settings of Aggregate mode.
	Aggregate AggregateOptions `yaml:"aggregate"`
	// DrainTimeout bounds how long a stopping aggregator lets its sinks
	// send what they hold; what they have not sent by then is counted as
	// lost (reason "shutdown"). 0 means the default, 10s.
	DrainTimeout Duration `yaml:"drainTimeout"`
	// SinkOverflow is what the pipeline does when a sink falls a whole
	// recordBufferSize behind: "block" (the default) waits for it while
	// it keeps sending, which slows the collectors and, over TCP and TLS,
	// the exporters; "drop" overwrites what it has not read, as Sluice
	// did before (counted, reason "buffer-full").
	SinkOverflow string `yaml:"sinkOverflow"`
	// SinkStallTimeout is how long, with sinkOverflow "block", a sink
	// that is a whole buffer behind may go without reading before the
	// pipeline stops waiting for it and overwrites what it has not read
	// (counted, reason "buffer-full"): one dead destination must not
	// stall the others. 0 means the default, 5s.
	SinkStallTimeout Duration `yaml:"sinkStallTimeout"`
	// Traceflow holds the Traceflow controller's settings.
	Traceflow TraceflowOptions `yaml:"traceflow"`
	// UI is the web UI (package ui).
	UI UIOptions `yaml:"ui"`
	// KafkaInput reads records from a Kafka topic (config/kafka.go).
	KafkaInput KafkaInput `yaml:"kafkaInput"`
}

// UIOptions is the `sluice.ui` section: the read-only web UI.
type UIOptions struct {
	// Address is where the web UI listens (host:port); empty turns it
	// off (the default). A port alone ("8080" or ":8080") binds to
	// 127.0.0.1 only: reach it in a cluster with kubectl port-forward, or
	// name a host (0.0.0.0:8080) to serve every interface.
	Address string `yaml:"address"`
	// AllowedHosts are further names (any port), IP addresses or
	// host:port pairs that requests to the UI may name in their Host
	// header, beside localhost, loopback addresses and the host of
	// Address; requests naming any other host are refused (DNS-rebinding
	// protection). Set it to the name of an Ingress that serves the UI,
	// say. The default is empty.
	AllowedHosts []string `yaml:"allowedHosts"`
}

// UIListenAddress is sluice.ui.address as a listen address: a bare port
// or ":port" becomes 127.0.0.1:port; empty stays empty (off).
func (s Sluice) UIListenAddress() string {
	a := strings.TrimSpace(s.UI.Address)
	switch {
	case a == "":
		return ""
	case !strings.Contains(a, ":"):
		return "127.0.0.1:" + a
	case strings.HasPrefix(a, ":"):
		return "127.0.0.1" + a
	}
	return a
}

// TraceflowOptions is the `sluice.traceflow` section: the controller that
// answers Traceflow objects (traceflows.sluice.io) by tracing them on the
// datapath model of the cluster, as `sluice traceflow --kubeconfig` does.
// The model settings take the CLI's flag values (--traffic-mode,
// --tunnel-type, --service-cidr, --egress-except-cidr, --proxy-all,
// --traffic-encryption-mode, --multicast, --enable-bridging-mode) and are
// checked when the
// aggregator starts.
type TraceflowOptions struct {
	// Enable runs the controller; it needs Kubernetes (sluice.kubeconfig
	// or the in-cluster configuration).
	Enable bool `yaml:"enable"`
	// DeleteAfter is how long after its start a finished (Succeeded or
	// Failed) Traceflow is deleted; 0 keeps them, as Antrea does.
	DeleteAfter       Duration `yaml:"deleteAfter"`
	TrafficMode       string   `yaml:"trafficMode"`
	TunnelType        string   `yaml:"tunnelType"`
	ServiceCIDRs      []string `yaml:"serviceCIDRs"`
	EgressExceptCIDRs []string `yaml:"egressExceptCIDRs"`
	ProxyAll          bool     `yaml:"proxyAll"`
	// TrafficEncryptionMode is the agents' trafficEncryptionMode (none or
	// wireGuard), as the CLI's --traffic-encryption-mode.
	TrafficEncryptionMode string `yaml:"trafficEncryptionMode"`
	// Multicast is the agents' multicast.enable, as --multicast.
	Multicast bool `yaml:"multicast"`
	// EnableBridgingMode is the agents' enableBridgingMode, as
	// --enable-bridging-mode.
	EnableBridgingMode bool `yaml:"enableBridgingMode"`
}

// ServerTLS is the `sluice.tls` section: the certificates of the IPFIX (tls
// transport) and gRPC collectors. Either CertFile and KeyFile (and
// optionally CAFile, the CA that client certificates must chain to) name
// files the user provides, or Sluice generates a CA and certificates and
// keeps them in a directory: CertDir, or [ServerTLS.CertDirectory]'s
// default when CertDir is empty. Setting both kinds is an error.
type ServerTLS struct {
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// CAFile verifies client certificates. Without it, no exporter can
	// authenticate, so the mutual-TLS collectors accept no one.
	CAFile  string `yaml:"caFile"`
	CertDir string `yaml:"certDir"`
	// ReloadInterval is how often the certificate files are checked for
	// changes, which are then used by new connections without a restart
	// (a Secret volume, cert-manager, an operator's renewal). 0 turns it
	// off.
	ReloadInterval Duration `yaml:"reloadInterval"`
}

// FileTLS is a key pair and a CA given as PEM files (`sluice.collectorTLS`).
// All are optional; CertFile and KeyFile go together.
type FileTLS struct {
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	CAFile   string `yaml:"caFile"`
}

// ProxyOptions is the `sluice.proxy` section.
type ProxyOptions struct {
	// PassThroughUnknown forwards information elements Sluice does not know
	// to the collector instead of dropping them.
	PassThroughUnknown bool `yaml:"passThroughUnknown"`
	// FastPath forwards IPFIX records whose export is their own fields
	// plus Proxy mode's by copying their octets, without a flow record in
	// between. It applies when flowCollector is the only consumer of
	// records and sends IPFIX, and flowCollector.includeK8sUIDs is off.
	FastPath bool `yaml:"fastPath"`
	// FillPods names the Pods an inter-Node half lacks (the default). An
	// ingest tier that writes to Kafka for an Aggregate tier sets it
	// false: correlation tells the halves apart by the Pod each names.
	FillPods bool `yaml:"fillPods"`
}

// AggregateOptions is the `sluice.aggregate` section.
type AggregateOptions struct {
	// MaxFlows bounds the number of flows held for correlation (at least 1).
	MaxFlows int `yaml:"maxFlows"`
	// ExportOneSided exports flows for which only one side ever reported.
	ExportOneSided bool `yaml:"exportOneSided"`
	// FastPath encodes each exported record into IPFIX as the store
	// builds it, without a flow record allocated per export, when
	// flowCollector is the only consumer of records and sends IPFIX.
	FastPath bool `yaml:"fastPath"`
}

// Default returns the configuration of an empty file: Antrea's defaults for
// Antrea's keys, and Sluice's for the `sluice` section. It is valid.
func Default() *Aggregator {
	return &Aggregator{
		Mode:                        ModeAggregate,
		ActiveFlowRecordTimeout:     Duration{60 * time.Second},
		InactiveFlowRecordTimeout:   Duration{90 * time.Second},
		AggregatorTransportProtocol: TransportTLS,
		RecordBufferSize:            8192,
		APIServer:                   APIServer{APIPort: 10348},
		FlowCollector: FlowCollector{
			RecordFormat:           FormatIPFIX,
			TemplateRefreshTimeout: Duration{600 * time.Second},
			TLS:                    CollectorTLS{MinVersion: "VersionTLS12"},
			IncludeK8sNames:        true,
		},
		ClickHouse: ClickHouse{
			Database:       "default",
			DatabaseURL:    DefaultClickHouseURL,
			Compress:       true,
			CommitInterval: Duration{8 * time.Second},
			QueueSize:      524288,
			TLS:            ClickHouseTLS{CAFile: DefaultClickHouseCAFile},
		},
		S3Uploader: S3Uploader{
			RecordFormat:      FormatCSV,
			Compress:          true,
			MaxRecordsPerFile: 1000000,
			UploadInterval:    Duration{60 * time.Second},
		},
		FlowLogger: FlowLogger{
			Path:         filepath.Join(os.TempDir(), DefaultFlowLogFile),
			MaxSize:      100,
			MaxBackups:   3,
			Compress:     true,
			RecordFormat: FormatCSV,
			PrettyPrint:  true,
		},
		Kafka: Kafka{Topic: DefaultKafkaTopic, Format: KafkaFormatProto, MaxBufferedRecords: DefaultKafkaMaxBufferedRecords},
		Sluice: Sluice{
			KafkaInput:   KafkaInput{Topic: DefaultKafkaTopic, Group: DefaultKafkaGroup, SessionTimeout: Duration{DefaultKafkaSessionTimeout}},
			IPFIXAddress: ":4739",
			GRPCAddress:  ":14739",
			APIAddress:   ":10348",
			// Antrea's FlowStreamService port.
			FlowStreamAddress: ":14740",
			Proxy:             ProxyOptions{PassThroughUnknown: true, FastPath: true, FillPods: true},
			Aggregate:         AggregateOptions{MaxFlows: 1000000, ExportOneSided: true, FastPath: true},
			DrainTimeout:      Duration{10 * time.Second},
			SinkOverflow:      SinkOverflowBlock,
			SinkStallTimeout:  Duration{5 * time.Second},
			TLS:               ServerTLS{ReloadInterval: Duration{10 * time.Second}},
			Traceflow: TraceflowOptions{TrafficMode: "encap", TunnelType: "geneve",
				ServiceCIDRs: []string{"10.96.0.0/12"}, TrafficEncryptionMode: "none"},
		},
	}
}

// applyDefaults restores the default of every key left empty (an empty
// string or 0 where 0 means nothing), as Antrea does, and normalises values
// whose spelling does not matter. Keys absent from the file already hold
// their defaults, since decoding starts from Default.
func (a *Aggregator) applyDefaults() {
	d := Default()
	setString := func(v *string, def string) {
		if *v == "" {
			*v = def
		}
	}
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setString(&a.Mode, d.Mode)
	setString(&a.AggregatorTransportProtocol, d.AggregatorTransportProtocol)
	if p := strings.ToLower(a.AggregatorTransportProtocol); isTransport(p) {
		a.AggregatorTransportProtocol = p
	}
	a.ActiveFlowRecordTimeout = atLeastOneSecond(a.ActiveFlowRecordTimeout)
	a.InactiveFlowRecordTimeout = atLeastOneSecond(a.InactiveFlowRecordTimeout)
	setInt(&a.RecordBufferSize, d.RecordBufferSize)
	setInt(&a.APIServer.APIPort, d.APIServer.APIPort)

	setString(&a.FlowCollector.RecordFormat, d.FlowCollector.RecordFormat)
	setString(&a.FlowCollector.TLS.MinVersion, d.FlowCollector.TLS.MinVersion)

	setString(&a.ClickHouse.Database, d.ClickHouse.Database)
	setString(&a.ClickHouse.DatabaseURL, d.ClickHouse.DatabaseURL)
	setInt(&a.ClickHouse.QueueSize, d.ClickHouse.QueueSize)
	setString(&a.ClickHouse.TLS.CAFile, d.ClickHouse.TLS.CAFile)

	setString(&a.S3Uploader.RecordFormat, d.S3Uploader.RecordFormat)
	setInt(&a.S3Uploader.MaxRecordsPerFile, d.S3Uploader.MaxRecordsPerFile)

	setString(&a.FlowLogger.Path, d.FlowLogger.Path)
	setString(&a.FlowLogger.RecordFormat, d.FlowLogger.RecordFormat)
	setInt(&a.FlowLogger.MaxSize, d.FlowLogger.MaxSize)

	setString(&a.Kafka.Topic, d.Kafka.Topic)
	setString(&a.Kafka.Format, d.Kafka.Format)
	setInt(&a.Kafka.MaxBufferedRecords, d.Kafka.MaxBufferedRecords)
	setString(&a.Sluice.KafkaInput.Topic, d.Sluice.KafkaInput.Topic)
	setString(&a.Sluice.KafkaInput.Group, d.Sluice.KafkaInput.Group)
	if a.Sluice.KafkaInput.SessionTimeout.Duration == 0 {
		a.Sluice.KafkaInput.SessionTimeout = d.Sluice.KafkaInput.SessionTimeout
	}
	setString(&a.Sluice.IPFIXAddress, d.Sluice.IPFIXAddress)
	// sluice.grpcAddress is not restored: decoding starts from the
	// default, so an empty value was written in the file, and means off.
	// An empty flowStreamAddress is not restored either: validation
	// refuses it when the service is enabled, rather than guess.
	setString(&a.Sluice.APIAddress, d.Sluice.APIAddress)
	if a.Sluice.DrainTimeout.Duration <= 0 {
		a.Sluice.DrainTimeout = d.Sluice.DrainTimeout
	}
	if a.Sluice.SinkStallTimeout.Duration <= 0 {
		a.Sluice.SinkStallTimeout = d.Sluice.SinkStallTimeout
	}
	setString(&a.Sluice.SinkOverflow, d.Sluice.SinkOverflow)
	setString(&a.Sluice.Traceflow.TrafficMode, d.Sluice.Traceflow.TrafficMode)
	setString(&a.Sluice.Traceflow.TunnelType, d.Sluice.Traceflow.TunnelType)
	setString(&a.Sluice.Traceflow.TrafficEncryptionMode, d.Sluice.Traceflow.TrafficEncryptionMode)
}

// atLeastOneSecond rounds a flow record timeout up to 1s, as Antrea does.
func atLeastOneSecond(d Duration) Duration {
	if d.Duration < time.Second {
		return Duration{time.Second}
	}
	return d
}

// Source returns the file name the configuration was read from ("" for
// one built in code).
func (a *Aggregator) Source() string { return a.source }

// Line returns the line of key (a dotted path such as
// "flowCollector.address" or "flowLogger.filters[0]") in the file, or 0 if
// the key was not in it.
func (a *Aggregator) Line(key string) int { return a.lines[key] }

// KeyError returns an error about key that names the file and the key's
// line, in the format of the errors of Parse. The command uses it for
// problems found later, when acting on the configuration (a certificate
// file that cannot be read, an address already in use).
func (a *Aggregator) KeyError(key string, err error) error {
	file, line := a.where(key)
	return &FieldError{File: file, Line: line, Key: key, Err: err}
}

// CertDirectory returns the directory for generated certificates: CertDir
// when set, otherwise $XDG_STATE_HOME/sluice/certs, or
// $HOME/.local/state/sluice/certs when XDG_STATE_HOME is unset (the XDG
// base directory default). A state directory rather than the working
// directory, so that a service started from "/" and a user in their
// checkout both keep one CA across restarts; exporters trust that CA, so
// it must survive. The result is meaningful only when CertFile is empty.
func (t ServerTLS) CertDirectory() (string, error) {
	if t.CertDir != "" {
		return t.CertDir, nil
	}
	dir, err := certs.DefaultDir()
	if err != nil {
		return "", &FieldError{Key: "sluice.tls.certDir", Msg: "no default directory; set the key", Err: err}
	}
	return dir, nil
}

// Generated reports whether Sluice generates its own certificates (no
// certFile given) rather than reading the user's.
func (t ServerTLS) Generated() bool { return t.CertFile == "" && t.KeyFile == "" }
