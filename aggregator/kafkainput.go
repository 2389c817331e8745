package aggregator

import (
	"context"
	"net/netip"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"sluice/aggregate"
	"sluice/config"
	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/kafkaclient"
	"sluice/kafkain"
)

// setupKafkaInput makes the Kafka input sluice.kafkaInput enables.
func (a *Aggregator) setupKafkaInput() error {
	k := a.cfg.Sluice.KafkaInput
	if !k.Enable {
		return nil
	}
	opts, err := kafkaclient.Options(k.Brokers, k.TLS, k.SASL)
	if err != nil {
		return a.cfg.KeyError("sluice.kafkaInput", err)
	}
	st := k.SessionTimeout.Duration
	opts = append(opts, kgo.SessionTimeout(st), kgo.HeartbeatInterval(min(3*time.Second, st/3)))
	o := kafkain.Options{Client: opts, Topic: k.Topic, Group: k.Group, Out: a.batches, Log: a.log, Registry: a.reg}
	if a.cfg.Mode == config.ModeAggregate {
		// A record is done once its flow was exported after it: the
		// input follows the exports (no fast path then, see
		// setupFastPath). A flow waits at most its inactive timeout after
		// its last record, or its retries for the other side.
		o.Exports = a.buf
		store := a.mode.(aggregateMode).Store
		o.Forget = func(ctx context.Context, keys map[string]bool) (int, error) {
			var kb []byte
			return store.Forget(ctx, func(src, dst netip.Addr, sport, dport uint16, proto uint8) bool {
				f := flow.Flow{SourceIP: src, DestinationIP: dst, SourcePort: sport, DestinationPort: dport, Protocol: proto}
				kb = flowkey.Append(kb[:0], &f)
				return keys[string(kb)]
			})
		}
		o.Horizon = a.cfg.InactiveFlowRecordTimeout.Duration +
			time.Duration(aggregate.MaxRetries+1)*a.cfg.ActiveFlowRecordTimeout.Duration
	}
	if a.kin, err = kafkain.New(o); err != nil {
		return a.cfg.KeyError("sluice.kafkaInput", err)
	}
	return nil
}

// closeKafkaInput commits what the drained sinks exported and leaves the
// group.
func (a *Aggregator) closeKafkaInput() {
	if a.kin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.Sluice.DrainTimeout.Duration)
	defer cancel()
	a.kin.Close(ctx)
}
