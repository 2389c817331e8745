package config

import (
	"strings"
	"testing"
)

func TestValidateKafka(t *testing.T) {
	kafkaSink := ValidateOptions{Sinks: map[string]SinkSupport{SinkKafka: {Proxy: true}}}
	cases := []struct {
		name, in string
		opts     ValidateOptions
		want     string
	}{
		{"sink", "mode: Proxy\nkafka: {enable: true, brokers: [\"k0:9092\", \"[fd00::1]:9093\"], format: json}\n", kafkaSink, ""},
		{"sink not in this build", "kafka: {enable: true, brokers: [k:9092]}\n", ValidateOptions{Sinks: map[string]SinkSupport{}},
			"cfg.yaml:1: kafka.enable: the kafka sink is not supported yet"},
		{"no brokers", "kafka:\n  enable: true\n", kafkaSink,
			"cfg.yaml:2: kafka.brokers: at least one broker (host:port) is required"},
		{"bad broker", "kafka:\n  enable: true\n  brokers: [k0, \":9092\", \"k:0\"]\n", kafkaSink,
			"cfg.yaml:3: kafka.brokers[0]: address k0: missing port in address\n" +
				"cfg.yaml:3: kafka.brokers[1]: \":9092\" has no host\n" +
				"cfg.yaml:3: kafka.brokers[2]: \"k:0\": the port must be from 1 to 65535"},
		{"format", "kafka: {enable: true, brokers: [k:1], format: avro}\n", kafkaSink,
			`cfg.yaml:1: kafka.format: "avro" is not valid (want proto or json, case-sensitive)`},
		{"sasl", "kafka:\n  enable: true\n  brokers: [k:1]\n  sasl: {mechanism: SCRAM-SHA-512}\n", kafkaSink,
			"cfg.yaml:4: kafka.sasl.username: required with sasl.mechanism SCRAM-SHA-512"},
		{"sasl mechanism", "kafka:\n  enable: true\n  brokers: [k:1]\n  sasl: {mechanism: GSSAPI, username: u}\n", kafkaSink,
			`cfg.yaml:4: kafka.sasl.mechanism: "GSSAPI" is not valid (want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, case-sensitive)`},
		{"tls pair", "kafka:\n  enable: true\n  brokers: [k:1]\n  tls: {enable: true, certFile: c.pem}\n", kafkaSink,
			"cfg.yaml:4: kafka.tls.keyFile: required with kafka.tls.certFile"},
		{"disabled sink not checked", "kafka: {enable: false, format: avro}\n", kafkaSink, ""},
		{"input", "sluice:\n  kafkaInput: {enable: true, brokers: [k:9092], sessionTimeout: 6s}\n", kafkaSink, ""},
		{"input without brokers", "sluice:\n  kafkaInput:\n    enable: true\n    group: \"\"\n", kafkaSink,
			"cfg.yaml:3: sluice.kafkaInput.brokers: at least one broker (host:port) is required"},
		{"input session timeout", "sluice:\n  kafkaInput: {enable: true, brokers: [k:9092], sessionTimeout: 100ms}\n", kafkaSink,
			"cfg.yaml:2: sluice.kafkaInput.sessionTimeout: must be at least 1s, got 100ms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseWith([]byte(c.in), "cfg.yaml", c.opts)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if cfg == nil && err == nil {
				t.Fatal("no configuration and no error")
			}
			if strings.TrimSpace(got) != c.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, c.want)
			}
		})
	}
}
