package kafka

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protowire"

	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/flow/flowproto"
	"sluice/internal/kafkatest"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
)

// TestBadInput: a topic holding garbage, truncated messages and records
// of a newer schema (fields this version does not know) besides good
// records. The errors are counted, the rest is processed, the replica
// keeps running.
func TestBadInput(t *testing.T) {
	const n = 100
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 12})
	coll := stubcollector.New(t)
	agg := startAgg(t, "aggregate", aggregateYAML(k.Addrs(), coll.Addr()))

	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addrs()...), kgo.DefaultProduceTopic("flows"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	garbage := [][]byte{
		[]byte("not a flow"),
		{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		[]byte(`{"id": 5`), // JSON, cut short
	}
	for i, g := range garbage {
		recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprint(i)), Value: g})
	}
	newer := 0
	for i, c := range workload(0, n) {
		for _, h := range []struct {
			f   *connection
			src bool
		}{{&c, true}, {&c, false}} {
			f := &h.f.dst
			if h.src {
				f = &h.f.src
			}
			present(f)
			v, err := flowproto.AppendFlow(nil, f)
			if err != nil {
				t.Fatal(err)
			}
			if i%10 == 0 && h.src {
				// A newer schema: a field number this version does not
				// know, which must be skipped and counted.
				v = protowire.AppendTag(v, 900, protowire.BytesType)
				v = protowire.AppendString(v, "from the future")
				newer++
			}
			recs = append(recs, &kgo.Record{Key: flowkey.Append(nil, f), Value: v})
		}
		if i == n/2 {
			// Truncated: a good record cut in the middle.
			present(&c.src)
			v, _ := flowproto.AppendFlow(nil, &c.src)
			recs = append(recs, &kgo.Record{Key: flowkey.Append(nil, &c.src), Value: v[:len(v)/2]})
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, fmt.Sprintf("%d connections exported", n), func() bool {
		return coll.Len() >= n
	})
	testkit.WaitFor(t, "the refused records counted", func() bool {
		// The truncated record may still parse (cut between fields):
		// then it is a record with fewer fields, and taken.
		m := agg.metric(t, `sluice_kafka_input_records_invalid_total{reason="malformed"}`)
		return m >= float64(len(garbage)) && m+agg.metric(t, "sluice_kafka_input_records_total") == float64(len(recs))
	})
	if u := agg.metric(t, "sluice_kafka_input_records_unknown_fields_total"); u != float64(newer) {
		t.Errorf("%v records of a newer schema counted, want %d", u, newer)
	}
	got, dups := byConnection(t, coll.Records())
	if len(got) != n || dups != 0 {
		t.Errorf("%d connections exported (%d twice), want %d once each", len(got), dups, n)
	}
	for key, f := range got {
		if f.SourcePodName == "" || f.DestinationPodName == "" {
			t.Errorf("%s: not correlated", key)
		}
	}
	select {
	case <-agg.done:
		t.Fatal("the replica exited")
	default:
	}
	agg.mu.Lock()
	log := agg.raw.String()
	agg.mu.Unlock()
	if strings.Contains(log, "panic") {
		t.Error("the replica logged a panic")
	}
}

// present marks the fields an agent's template carries as present, as
// the IPFIX collector of an ingest replica would.
func present(f *flow.Flow) {
	for fl := flow.StartTime; fl <= flow.EgressUID; fl++ {
		if fl != flow.SourcePodLabels && fl != flow.DestinationPodLabels {
			f.Present.Set(fl)
		}
	}
}
