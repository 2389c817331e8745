package config

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Sinks, named by their key in the file. Keys of ValidateOptions.Sinks.
const (
	SinkFlowCollector     = "flowCollector"
	SinkClickHouse        = "clickHouse"
	SinkS3Uploader        = "s3Uploader"
	SinkFlowLogger        = "flowLogger"
	SinkFlowStreamService = "flowStreamService"
)

// SinkEnabled reports whether the configuration enables the sink of that
// key; false for a key that names no sink.
func (a *Aggregator) SinkEnabled(key string) bool {
	switch key {
	case SinkFlowCollector:
		return a.FlowCollector.Enable
	case SinkClickHouse:
		return a.ClickHouse.Enable
	case SinkS3Uploader:
		return a.S3Uploader.Enable
	case SinkFlowLogger:
		return a.FlowLogger.Enable
	case SinkFlowStreamService:
		return a.FlowStreamService.Enable
	case SinkKafka:
		return a.Kafka.Enable
	}
	return false
}

// SinkSupport is what a build of Sluice can do with one sink.
type SinkSupport struct {
	// Proxy says the sink may run in Proxy mode.
	Proxy bool
}

// ValidateOptions tunes Validate.
type ValidateOptions struct {
	// Sinks are the sinks that may be enabled, by key, and in which modes:
	// the aggregator's sink registry. A sink absent from a non-nil map is
	// not supported. Nil skips these checks (the aggregator makes them
	// again with its registry).
	Sinks map[string]SinkSupport
}

// Validate checks values and combinations of keys. It reports every
// problem at once (an errors.Join of *FieldError, ordered by line), each
// naming the key and, when the configuration came from a file, the line.
// It does not touch the file system or the network.
//
// A sink's own settings are checked only when the sink is enabled, as
// Antrea does, so a disabled section never stops the aggregator.
func (a *Aggregator) Validate(opts ValidateOptions) error {
	return joinSorted(a.validate(opts))
}

func (a *Aggregator) validate(opts ValidateOptions) []error {
	v := &validator{a: a, sinks: opts.Sinks}

	switch a.Mode {
	case ModeAggregate, ModeProxy:
	default:
		v.add("mode", "%q is not a mode (want %q or %q, case-sensitive)", a.Mode, ModeAggregate, ModeProxy)
	}
	if !isTransport(strings.ToLower(a.AggregatorTransportProtocol)) {
		v.add("aggregatorTransportProtocol", "%q is not a transport (want tls, tcp, udp or none)", a.AggregatorTransportProtocol)
	}
	if s := a.FlowAggregatorAddress; s != "" && net.ParseIP(s) == nil && !isDNSName(s) {
		v.add("flowAggregatorAddress", "%q is neither an IP address nor a DNS name", s)
	}
	v.atLeast("recordBufferSize", a.RecordBufferSize, 1)
	v.apiServer(a.APIServer)
	v.flowCollector()
	v.clickHouse()
	v.s3Uploader()
	v.flowLogger()
	v.sink(SinkFlowStreamService, a.FlowStreamService.Enable, "the flow stream service")
	v.kafka()
	v.sluice()
	v.kafkaInput()
	return v.errs
}

// validator collects the problems Validate finds.
type validator struct {
	a     *Aggregator
	sinks map[string]SinkSupport
	errs  []error
}

func (v *validator) add(key, format string, args ...any) {
	file, line := v.a.where(key)
	v.errs = append(v.errs, &FieldError{File: file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)})
}

// addNear is add for a key that may be absent from the file: the error then
// points at the line of near, the key that makes key needed.
func (v *validator) addNear(key, near, format string, args ...any) {
	file, line := v.a.where(key)
	if _, ok := v.a.lines[key]; !ok {
		if _, ok := v.a.lines[near]; ok {
			line = v.a.lines[near]
		}
	}
	v.errs = append(v.errs, &FieldError{File: file, Line: line, Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) addErr(key string, err error) {
	file, line := v.a.where(key)
	v.errs = append(v.errs, &FieldError{File: file, Line: line, Key: key, Err: err})
}

func (v *validator) atLeast(key string, n, lowest int) {
	if n < lowest {
		v.add(key, "must be at least %d, got %d", lowest, n)
	}
}

func (v *validator) minDuration(key string, d Duration, lowest time.Duration) {
	if d.Duration < lowest {
		v.add(key, "must be at least %s, got %s", lowest, d)
	}
}

func (v *validator) oneOf(key, value string, allowed ...string) {
	for _, s := range allowed {
		if value == s {
			return
		}
	}
	var want string
	switch len(allowed) {
	case 1:
		want = allowed[0]
	default:
		want = strings.Join(allowed[:len(allowed)-1], ", ") + " or " + allowed[len(allowed)-1]
	}
	v.add(key, "%q is not valid (want %s, case-sensitive)", value, want)
}

// sink checks that an enabled sink may run: that Sluice supports it and
// that the mode allows it. It reports whether the sink's own settings are
// worth checking (enabled and allowed).
func (v *validator) sink(name string, enabled bool, what string) bool {
	if !enabled || v.sinks == nil {
		return enabled
	}
	key := name + ".enable"
	s, ok := v.sinks[name]
	if !ok {
		v.add(key, "%s is not supported yet", what)
		return false
	}
	if !s.Proxy && v.a.Mode == ModeProxy {
		var can []string
		for k, s := range v.sinks {
			if s.Proxy {
				can = append(can, k)
			}
		}
		sort.Strings(can)
		v.add(key, "%s cannot be used in Proxy mode (only %s can)", what, strings.Join(can, " and "))
		return false
	}
	return true
}

func (v *validator) apiServer(s APIServer) {
	if s.APIPort < 1 || s.APIPort > 65535 {
		v.add("apiServer.apiPort", "must be a port from 1 to 65535, got %d", s.APIPort)
	}
	if s.TLSMinVersion != "" {
		v.oneOf("apiServer.tlsMinVersion", s.TLSMinVersion, "VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")
	}
	if s.TLSCipherSuites != "" {
		known := map[string]bool{}
		for _, c := range tls.CipherSuites() {
			known[c.Name] = true
		}
		for _, c := range tls.InsecureCipherSuites() {
			known[c.Name] = true
		}
		for _, name := range strings.Split(s.TLSCipherSuites, ",") {
			if name = strings.TrimSpace(name); !known[name] {
				v.add("apiServer.tlsCipherSuites", "unknown cipher suite %q", name)
			}
		}
	}
}

func (v *validator) flowCollector() {
	c := v.a.FlowCollector
	ct := v.a.Sluice.CollectorTLS
	v.pair("sluice.collectorTLS", ct.CertFile, ct.KeyFile)
	if !v.sink(SinkFlowCollector, c.Enable, "the flow collector sink") {
		return
	}
	proto := ""
	if c.Address == "" {
		v.addNear("flowCollector.address", "flowCollector.enable", "required when flowCollector.enable is true")
	} else if _, p, err := c.Target(); err != nil {
		v.addErr("flowCollector.address", err)
	} else {
		proto = p
	}
	v.oneOf("flowCollector.recordFormat", c.RecordFormat, FormatIPFIX, FormatJSON)
	if c.TemplateRefreshTimeout.Duration < 0 {
		v.add("flowCollector.templateRefreshTimeout", "must not be negative, got %s", c.TemplateRefreshTimeout)
	}
	if n := c.MaxIPFIXMsgSize; n != 0 && (n < 512 || n > 65535) {
		v.add("flowCollector.maxIPFIXMsgSize", "must be 0 (automatic) or from 512 to 65535, got %d", n)
	}
	v.oneOf("flowCollector.tls.minVersion", c.TLS.MinVersion, "VersionTLS12", "VersionTLS13")
	if c.TLS.Enable && proto == "udp" {
		v.add("flowCollector.tls.enable", "TLS needs the tcp transport, and flowCollector.address names udp")
	}
	if ct != (FileTLS{}) && !c.TLS.Enable {
		v.add("sluice.collectorTLS", "set, but flowCollector.tls.enable is false")
	}
	if ct.CAFile != "" && c.TLS.CASecretName != "" {
		v.add("sluice.collectorTLS.caFile", "conflicts with flowCollector.tls.caSecretName; set one of them")
	}
	if ct.CertFile != "" && c.TLS.ClientSecretName != "" {
		v.add("sluice.collectorTLS.certFile", "conflicts with flowCollector.tls.clientSecretName; set one of them")
	}
}

func (v *validator) clickHouse() {
	c := v.a.ClickHouse
	if !v.sink(SinkClickHouse, c.Enable, "the ClickHouse sink") {
		return
	}
	if c.Database == "" {
		v.add("clickHouse.database", "must not be empty")
	}
	u, err := url.Parse(c.DatabaseURL)
	switch {
	case err != nil:
		v.addErr("clickHouse.databaseURL", err)
	case !isOneOf(u.Scheme, "tcp", "tls", "http", "https") || u.Host == "":
		v.add("clickHouse.databaseURL", "%q is not <scheme>://<host>:<port> with scheme tcp, tls, http or https", c.DatabaseURL)
	}
	v.minDuration("clickHouse.commitInterval", c.CommitInterval, time.Second)
	v.atLeast("clickHouse.queueSize", c.QueueSize, 1)
	v.minDuration("clickHouse.ttl", c.TTL, 0)
}

func (v *validator) s3Uploader() {
	s := v.a.S3Uploader
	if !v.sink(SinkS3Uploader, s.Enable, "the S3 uploader sink") {
		return
	}
	if s.BucketName == "" {
		v.addNear("s3Uploader.bucketName", "s3Uploader.enable", "required when s3Uploader.enable is true")
	}
	v.oneOf("s3Uploader.recordFormat", s.RecordFormat, FormatCSV, FormatParquet)
	v.atLeast("s3Uploader.maxRecordsPerFile", s.MaxRecordsPerFile, 1)
	v.minDuration("s3Uploader.uploadInterval", s.UploadInterval, time.Second)
	if s.Endpoint != "" {
		if u, err := url.Parse(s.Endpoint); err != nil || !isOneOf(u.Scheme, "http", "https") || u.Host == "" ||
			(u.Path != "" && u.Path != "/") {
			v.add("s3Uploader.endpoint", "%q is not http://<host>[:<port>] or https://<host>[:<port>]", s.Endpoint)
		}
	}
}

func (v *validator) flowLogger() {
	l := v.a.FlowLogger
	if !v.sink(SinkFlowLogger, l.Enable, "the flow logger sink") {
		return
	}
	v.oneOf("flowLogger.recordFormat", l.RecordFormat, FormatCSV)
	v.atLeast("flowLogger.maxSize", l.MaxSize, 1)
	v.atLeast("flowLogger.maxBackups", l.MaxBackups, 0)
	v.atLeast("flowLogger.maxAge", l.MaxAge, 0)
	for i, f := range l.Filters {
		for _, list := range []struct {
			key     string
			actions []string
		}{
			{"ingressNetworkPolicyRuleActions", f.IngressNetworkPolicyRuleActions},
			{"egressNetworkPolicyRuleActions", f.EgressNetworkPolicyRuleActions},
		} {
			key := fmt.Sprintf("flowLogger.filters[%d].%s", i, list.key)
			for _, act := range list.actions {
				v.oneOf(key, act, "None", "Allow", "Drop", "Reject")
			}
		}
	}
}

func (v *validator) sluice() {
	s := v.a.Sluice
	type listener struct{ key, host, port string }
	var tcp []listener
	for _, l := range []struct {
		key, addr string
		tcp       bool
	}{
		{"sluice.ipfixAddress", s.IPFIXAddress, isOneOf(strings.ToLower(v.a.AggregatorTransportProtocol), TransportTLS, TransportTCP)},
		{"sluice.grpcAddress", s.GRPCAddress, true},
		{"sluice.apiAddress", s.APIAddress, true},
		{"sluice.flowStreamAddress", s.FlowStreamAddress, v.a.FlowStreamService.Enable},
		{"sluice.ui.address", s.UIListenAddress(), true},
	} {
		switch {
		case l.key == "sluice.grpcAddress" && l.addr == "":
			continue // the gRPC collector is off
		case l.key == "sluice.flowStreamAddress" && l.addr == "":
			if v.a.FlowStreamService.Enable {
				v.add(l.key, "empty, but flowStreamService.enable is true; set an address, or enable: false to turn the service off")
			}
			continue
		case l.key == "sluice.ui.address" && l.addr == "":
			continue // the web UI is off
		}
		host, port, err := SplitListenAddress(l.addr)
		if err != nil {
			v.addErr(l.key, err)
			continue
		}
		if !l.tcp || port == "0" {
			continue
		}
		for _, other := range tcp {
			if other.port == port && (other.host == host || isWildcard(other.host) || isWildcard(host)) {
				v.add(l.key, "port %s is also used by %s", port, other.key)
			}
		}
		tcp = append(tcp, listener{l.key, host, port})
	}

	t := s.TLS
	v.pair("sluice.tls", t.CertFile, t.KeyFile)
	switch {
	case t.CertDir != "" && (t.CertFile != "" || t.KeyFile != "" || t.CAFile != ""):
		v.add("sluice.tls.certDir", "set either certDir (generated certificates) or certFile and keyFile, not both")
	case t.CAFile != "" && t.CertFile == "" && t.KeyFile == "":
		v.add("sluice.tls.caFile", "needs sluice.tls.certFile and sluice.tls.keyFile (or leave it out to generate certificates)")
	}

	for i, h := range s.UI.AllowedHosts {
		if err := checkAllowedHost(h); err != nil {
			v.addErr(fmt.Sprintf("sluice.ui.allowedHosts[%d]", i), err)
		}
	}

	v.atLeast("sluice.aggregate.maxFlows", s.Aggregate.MaxFlows, 1)
	v.oneOf("sluice.sinkOverflow", s.SinkOverflow, SinkOverflowBlock, SinkOverflowDrop)
	if s.Traceflow.DeleteAfter.Duration < 0 {
		v.add("sluice.traceflow.deleteAfter", "must not be negative, got %s", s.Traceflow.DeleteAfter.Duration)
	}
}

// pair checks that a certificate and its key are given together.
func (v *validator) pair(section, certFile, keyFile string) {
	switch {
	case certFile != "" && keyFile == "":
		v.addNear(section+".keyFile", section+".certFile", "required with %s.certFile", section)
	case certFile == "" && keyFile != "":
		v.addNear(section+".certFile", section+".keyFile", "required with %s.keyFile", section)
	}
}

// where returns the file and the line to report for key: the key's own
// line, else that of the nearest enclosing key present in the file.
func (a *Aggregator) where(key string) (string, int) {
	for k := key; k != ""; {
		if line, ok := a.lines[k]; ok {
			return a.source, line
		}
		i := strings.LastIndexAny(k, ".[")
		if i < 0 {
			break
		}
		k = k[:i]
	}
	return a.source, 0
}

// Target parses Address, `<host>:<port>[:<proto>]`, and returns host:port
// ready for net.Dial (IPv6 in brackets) and the transport, "tcp" or "udp".
// The port may be left out (`host`, `host::udp`) and defaults to
// DefaultCollectorPort; the transport defaults to DefaultCollectorProto and
// is case-insensitive. An IPv6 host must be in brackets:
// `[fd00::1]:4739:udp`.
func (c FlowCollector) Target() (hostport, proto string, err error) {
	addr := c.Address
	if addr == "" {
		return "", "", fmt.Errorf("address is empty")
	}
	if ip, err := netip.ParseAddr(addr); err == nil && ip.Is6() {
		return "", "", fmt.Errorf("%q: an IPv6 address goes in brackets, as in [%s]:%s", addr, addr, DefaultCollectorPort)
	}
	var host, rest string
	if strings.HasPrefix(addr, "[") {
		end := strings.IndexByte(addr, ']')
		if end < 0 {
			return "", "", fmt.Errorf("%q: missing ] after the IPv6 address", addr)
		}
		host, rest = addr[1:end], addr[end+1:]
		if _, err := netip.ParseAddr(host); err != nil {
			return "", "", fmt.Errorf("%q: %q in brackets is not an IP address", addr, host)
		}
		if rest != "" && rest[0] != ':' {
			return "", "", fmt.Errorf("%q: unexpected %q after ]", addr, rest)
		}
		rest = strings.TrimPrefix(rest, ":")
	} else {
		var ok bool
		host, rest, ok = strings.Cut(addr, ":")
		if !ok {
			rest = ""
		}
		if strings.Count(rest, ":") > 1 {
			return "", "", fmt.Errorf("%q: too many colons (an IPv6 address goes in brackets, as in [fd00::1]:4739)", addr)
		}
		if host == "" {
			return "", "", fmt.Errorf("%q: the host is empty", addr)
		}
		if net.ParseIP(host) == nil && !isDNSName(host) {
			return "", "", fmt.Errorf("%q: %q is neither an IP address nor a DNS name", addr, host)
		}
	}
	port, proto, _ := strings.Cut(rest, ":")
	if port == "" {
		port = DefaultCollectorPort
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", "", fmt.Errorf("%q: port %q is not a number from 1 to 65535", addr, port)
	}
	proto = strings.ToLower(proto)
	switch proto {
	case "":
		proto = DefaultCollectorProto
	case "tcp", "udp":
	default:
		return "", "", fmt.Errorf("%q: transport %q is not tcp or udp", addr, proto)
	}
	return net.JoinHostPort(host, port), proto, nil
}

// SplitListenAddress checks a listening address, host:port, and splits it.
// The host may be empty (every interface); the port is a number from 0 to
// 65535 (0: any free port).
func SplitListenAddress(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", "", fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	if host != "" && net.ParseIP(host) == nil && !isDNSName(host) {
		return "", "", fmt.Errorf("%q: %q is neither an IP address nor a DNS name", addr, host)
	}
	return host, port, nil
}

// checkAllowedHost checks an entry of sluice.ui.allowedHosts: a DNS name,
// an IP address, or either with a port, as a Host header names them.
func checkAllowedHost(e string) error {
	const want = "want a host name as the Host header names it (no scheme, path or wildcard), an IP address, or either with :port"
	if strings.ContainsAny(e, "/*@ ") {
		return fmt.Errorf("%q: %s", e, want)
	}
	host := e
	if h, p, err := net.SplitHostPort(e); err == nil {
		if _, err := strconv.ParseUint(p, 10, 16); err != nil {
			return fmt.Errorf("%q: port %q is not a number from 0 to 65535", e, p)
		}
		host = h
	} else if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
		host = e[1 : len(e)-1]
	}
	if net.ParseIP(host) != nil {
		return nil
	}
	if host == "" || len(host) > 253 {
		return fmt.Errorf("%q: want a host name, an IP address, or either with :port", e)
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return fmt.Errorf("%q: %s", e, want)
		}
	}
	return nil
}

func isWildcard(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::"
}

func isTransport(s string) bool {
	return isOneOf(s, TransportTLS, TransportTCP, TransportUDP, TransportNone)
}

func isOneOf(s string, allowed ...string) bool {
	for _, a := range allowed {
		if s == a {
			return true
		}
	}
	return false
}

// isDNSName reports whether s is a plausible host name: dot-separated
// labels of letters, digits, '-' and '_', each 1 to 63 characters, not
// starting or ending with '-'; 253 characters at most; one trailing dot
// allowed.
func isDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			ok := r == '-' || r == '_' || ('0' <= r && r <= '9') || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z')
			if !ok {
				return false
			}
		}
	}
	return true
}
