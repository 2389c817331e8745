package kafka

import (
	"sluice/config"
	"sluice/kafkaclient"
	"sluice/sink"
)

// Factory is the kafka sink, in either mode.
func Factory() sink.Factory {
	return sink.Factory{Key: config.SinkKafka, Proxy: true, New: newFromConfig}
}

func newFromConfig(env sink.Env) (sink.Sink, error) {
	cfg := env.Config
	k := cfg.Kafka
	opts, err := kafkaclient.Options(k.Brokers, k.TLS, k.SASL)
	if err != nil {
		return nil, cfg.KeyError("kafka", err)
	}
	s, err := New(Options{Client: opts, Topic: k.Topic, JSON: k.Format == config.KafkaFormatJSON,
		MaxBuffered: k.MaxBufferedRecords, Log: env.Log, Metrics: env.Metrics, Registry: env.Registry, Name: config.SinkKafka})
	if err != nil {
		return nil, cfg.KeyError("kafka", err)
	}
	return s, nil
}
