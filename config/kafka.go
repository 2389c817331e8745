package config

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// SinkKafka is the kafka sink's section.
const SinkKafka = "kafka"

// Kafka record formats (kafka.format).
const (
	KafkaFormatProto = "proto"
	KafkaFormatJSON  = "json"
)

// SASL mechanisms (kafka.sasl.mechanism, sluice.kafkaInput.sasl.mechanism).
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Kafka is the `kafka` section: the sink that writes every record to a
// Kafka topic, keyed by a symmetric flow key (package sink/kafka).
type Kafka struct {
	Enable bool `yaml:"enable"`
	// Brokers are the bootstrap brokers, host:port each.
	Brokers []string `yaml:"brokers"`
	// Topic receives the records; it must exist (Sluice does not create
	// topics: their partition count is the operator's choice).
	Topic string `yaml:"topic"`
	// Format is KafkaFormatProto (the reference's Flow message) or
	// KafkaFormatJSON (the Flow message in Protobuf's JSON mapping).
	Format string `yaml:"format"`
	// MaxBufferedRecords bounds the records waiting for the brokers'
	// acknowledgement; past it records are dropped and counted.
	MaxBufferedRecords int       `yaml:"maxBufferedRecords"`
	TLS                KafkaTLS  `yaml:"tls"`
	SASL               KafkaSASL `yaml:"sasl"`
}

// KafkaTLS is the `kafka.tls` (and `sluice.kafkaInput.tls`) section.
type KafkaTLS struct {
	Enable bool `yaml:"enable"`
	// CAFile verifies the brokers; empty means the system roots.
	CAFile string `yaml:"caFile"`
	// CertFile and KeyFile are a client pair, for brokers that require one.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
	// ServerName is checked against the brokers' certificates; empty means
	// each broker's host.
	ServerName string `yaml:"serverName"`
}

// KafkaSASL is the `kafka.sasl` (and `sluice.kafkaInput.sasl`) section.
type KafkaSASL struct {
	// Mechanism is empty (no SASL), SASLPlain, SASLScramSHA256 or
	// SASLScramSHA512.
	Mechanism string `yaml:"mechanism"`
	Username  string `yaml:"username"`
	// Password, or PasswordFile: a file holding it (a mounted Secret).
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"passwordFile"`
}

// KafkaInput is the `sluice.kafkaInput` section: records read from a
// Kafka topic in a consumer group, besides the collectors' (package
// kafkain).
type KafkaInput struct {
	Enable  bool     `yaml:"enable"`
	Brokers []string `yaml:"brokers"`
	Topic   string   `yaml:"topic"`
	// Group is the consumer group; replicas of one Aggregate tier share it.
	Group string `yaml:"group"`
	// SessionTimeout is how long the group waits for a replica that
	// stopped heartbeating (killed) before its partitions move; within
	// the brokers' group.min/max.session.timeout.ms. Default 45s, Kafka's.
	SessionTimeout Duration  `yaml:"sessionTimeout"`
	TLS            KafkaTLS  `yaml:"tls"`
	SASL           KafkaSASL `yaml:"sasl"`
}

// Defaults of the Kafka sections.
const (
	DefaultKafkaTopic              = "sluice-flows"
	DefaultKafkaGroup              = "sluice-aggregate"
	DefaultKafkaMaxBufferedRecords = 100000
	DefaultKafkaSessionTimeout     = 45 * time.Second
)

func (v *validator) kafka() {
	k := v.a.Kafka
	if !v.sink(SinkKafka, k.Enable, "the kafka sink") {
		return
	}
	v.kafkaClient("kafka", k.Brokers, k.Topic, k.TLS, k.SASL)
	v.oneOf("kafka.format", k.Format, KafkaFormatProto, KafkaFormatJSON)
	v.atLeast("kafka.maxBufferedRecords", k.MaxBufferedRecords, 1)
}

func (v *validator) kafkaInput() {
	k := v.a.Sluice.KafkaInput
	if !k.Enable {
		return
	}
	v.kafkaClient("sluice.kafkaInput", k.Brokers, k.Topic, k.TLS, k.SASL)
	if k.Group == "" {
		v.add("sluice.kafkaInput.group", "must not be empty")
	}
	v.minDuration("sluice.kafkaInput.sessionTimeout", k.SessionTimeout, time.Second)
}

// kafkaClient checks what the sink and the input share.
func (v *validator) kafkaClient(section string, brokers []string, topic string, t KafkaTLS, s KafkaSASL) {
	if len(brokers) == 0 {
		v.addNear(section+".brokers", section+".enable", "at least one broker (host:port) is required")
	}
	for i, b := range brokers {
		host, port, err := net.SplitHostPort(b)
		if err == nil && host == "" {
			err = fmt.Errorf("%q has no host", b)
		}
		if err == nil {
			if p, perr := strconv.Atoi(port); perr != nil || p < 1 || p > 65535 {
				err = fmt.Errorf("%q: the port must be from 1 to 65535", b)
			}
		}
		if err != nil {
			v.addErr(fmt.Sprintf("%s.brokers[%d]", section, i), err)
		}
	}
	if topic == "" {
		v.add(section+".topic", "must not be empty")
	}
	if t.Enable {
		v.pair(section+".tls", t.CertFile, t.KeyFile)
	}
	switch s.Mechanism {
	case "":
	case SASLPlain, SASLScramSHA256, SASLScramSHA512:
		if s.Username == "" {
			v.addNear(section+".sasl.username", section+".sasl.mechanism", "required with sasl.mechanism %s", s.Mechanism)
		}
		if s.Password != "" && s.PasswordFile != "" {
			v.add(section+".sasl.passwordFile", "set password or passwordFile, not both")
		}
	default:
		v.oneOf(section+".sasl.mechanism", s.Mechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
	}
}
