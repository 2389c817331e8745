package kafka

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"sluice/certs"
	"sluice/config"
	"sluice/flow"
	"sluice/flow/flowkey"
	"sluice/flow/flowpb"
	"sluice/flow/flowproto"
	"sluice/flow/flowtest"
	"sluice/internal/kafkatest"
	"sluice/internal/testkit"
	"sluice/kafkaclient"
	"sluice/ring"
	"sluice/sink"
)

// consume reads n records of topic from the start.
func consume(t *testing.T, brokers []string, topic string, n int, extra ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d records of %d from %s before the deadline", len(out), n, topic)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Logf("fetch %s/%d: %v", topic, p, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

type run struct {
	s    *Sink
	buf  *ring.Buffer[*flow.Flow]
	m    *sink.Metrics
	stop context.CancelFunc
	done chan error
}

func start(t *testing.T, o Options, bufSize int) *run {
	t.Helper()
	r := &run{m: sink.NewMetrics(nil), buf: ring.New[*flow.Flow](bufSize), done: make(chan error, 1)}
	o.Metrics = r.m
	var err error
	if r.s, err = New(o); err != nil {
		t.Fatal(err)
	}
	c := r.buf.Consumer()
	ctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	go func() { r.done <- r.s.Run(ctx, c); c.Close() }()
	t.Cleanup(func() {
		stop()
		<-r.done
	})
	return r
}

func TestWritesKeyedFlowMessages(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{})
	opts, err := kafkaclient.Options(k.Addrs(), config.KafkaTLS{}, config.KafkaSASL{})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, Options{Client: opts, Topic: "flows"}, 1024)
	const n = 200
	want := map[string]*flow.Flow{}
	for i := range n {
		f := flowtest.Full(i, false)
		f.ClusterID = "" // not in the Protobuf message
		f.Present.Clear(flow.ClusterID)
		f.Unknown = nil
		want[f.Origin.ID] = f
		r.buf.Produce(f)
	}
	testkit.WaitFor(t, "every record acknowledged", func() bool {
		e, _ := r.m.Totals("kafka")
		return e == n
	})
	recs := consume(t, k.Addrs(), "flows", n)
	parts := map[int32]int{}
	for _, rec := range recs {
		var p flowpb.Flow
		if err := proto.Unmarshal(rec.Value, &p); err != nil {
			t.Fatalf("value is not a Flow message: %v", err)
		}
		var got flow.Flow
		if _, err := flowproto.ToFlow(&p, &got); err != nil {
			t.Fatal(err)
		}
		w := want[got.Origin.ID]
		if w == nil {
			t.Fatalf("unexpected record %q", got.Origin.ID)
		}
		if !bytes.Equal(rec.Key, flowkey.Append(nil, w)) {
			t.Errorf("%s: key %x, want the flow key %x", got.Origin.ID, rec.Key, flowkey.Append(nil, w))
		}
		if got.SourceIP != w.SourceIP || got.DestinationPort != w.DestinationPort || got.Stats != w.Stats ||
			got.SourcePodName != w.SourcePodName || !got.EndTime.Equal(w.EndTime) {
			t.Errorf("%s: decoded %+v\nwant %+v", got.Origin.ID, got, *w)
		}
		delete(want, got.Origin.ID)
		parts[rec.Partition]++
	}
	if len(want) != 0 {
		t.Errorf("%d records missing", len(want))
	}
	if len(parts) < 4 {
		t.Errorf("200 distinct flows landed on %d partitions of 12: %v", len(parts), parts)
	}
	_, dropped := r.m.Totals("kafka")
	for reason, d := range dropped {
		if d != 0 {
			t.Errorf("dropped %d (%s)", d, reason)
		}
	}
}

func TestJSONFormat(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 1, Partitions: 2})
	opts, _ := kafkaclient.Options(k.Addrs(), config.KafkaTLS{}, config.KafkaSASL{})
	r := start(t, Options{Client: opts, Topic: "flows", JSON: true}, 64)
	r.buf.Produce(flowtest.Full(7, false))
	rec := consume(t, k.Addrs(), "flows", 1)[0]
	var p flowpb.Flow
	if err := protojson.Unmarshal(rec.Value, &p); err != nil {
		t.Fatalf("value is not the Flow message in JSON: %v\n%s", err, rec.Value)
	}
	if p.GetId() != "flow-7" || !json.Valid(rec.Value) {
		t.Errorf("id %q", p.GetId())
	}
}

func TestSASLSCRAM(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 1, Partitions: 1, SASL: "sluice:s3cret"})
	opts, err := kafkaclient.Options(k.Addrs(), config.KafkaTLS{}, config.KafkaSASL{Mechanism: config.SASLScramSHA512, Username: "sluice", Password: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, Options{Client: opts, Topic: "flows"}, 64)
	r.buf.Produce(flowtest.Full(1, false))
	testkit.WaitFor(t, "the record acknowledged over SCRAM-SHA-512", func() bool {
		e, _ := r.m.Totals("kafka")
		return e == 1
	})
	plainOpts, _ := kafkaclient.Options(k.Addrs(), config.KafkaTLS{}, config.KafkaSASL{Mechanism: config.SASLPlain, Username: "sluice", Password: "s3cret"})
	consume(t, k.Addrs(), "flows", 1, plainOpts[1:]...)
}

// TestConfirmWaitsForKafka: with the brokers down, what the sink read is
// not written (a gRPC stream waiting for it is not confirmed); once the
// brokers are back it is, and nothing is lost.
func TestConfirmWaitsForKafka(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 3, Partitions: 6, Persist: true})
	opts, _ := kafkaclient.Options(k.Addrs(), config.KafkaTLS{}, config.KafkaSASL{})
	r := start(t, Options{Client: opts, Topic: "flows"}, 1024)
	r.buf.Produce(flowtest.Full(0, false))
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	if err := r.buf.WaitWritten(ctx, r.buf.Produced()); err != nil {
		t.Fatalf("first record never confirmed: %v", err)
	}
	cancel()

	k.Stop()
	for i := 1; i <= 50; i++ {
		r.buf.Produce(flowtest.Full(i, false))
	}
	pos := r.buf.Produced()
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if err := r.buf.WaitWritten(short, pos); err == nil {
		t.Fatal("records confirmed while every broker was down")
	}
	cancel()

	rctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	k.Restart(rctx)
	if err := r.buf.WaitWritten(rctx, pos); err != nil {
		t.Fatalf("records not confirmed after the brokers came back: %v", err)
	}
	e, dropped := r.m.Totals("kafka")
	if e != 51 {
		t.Errorf("exported %d, want 51 (dropped %v)", e, dropped)
	}
	recs := consume(t, k.Addrs(), "flows", 51)
	seen := map[string]bool{}
	for _, rec := range recs {
		var p flowpb.Flow
		if err := proto.Unmarshal(rec.Value, &p); err != nil {
			t.Fatal(err)
		}
		seen[p.GetId()] = true
	}
	for i := range 51 {
		if !seen[fmt.Sprintf("flow-%d", i)] {
			t.Errorf("flow-%d is not on the topic", i)
		}
	}
}

// TestBoundedWhileDown: with the brokers down, the client holds at most
// MaxBuffered records and the ring its capacity; the rest is dropped and
// counted, and what was kept is delivered once the brokers are back.
func TestBoundedWhileDown(t *testing.T) {
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 1, Partitions: 3, Persist: true})
	opts, _ := kafkaclient.Options(k.Addrs(), config.KafkaTLS{}, config.KafkaSASL{})
	k.Stop()
	r := start(t, Options{Client: opts, Topic: "flows", MaxBuffered: 16}, 32)
	const n = 500
	for i := range n {
		r.buf.Produce(flowtest.Full(i, false))
	}
	testkit.WaitFor(t, "the client's buffer full", func() bool {
		return r.s.cl.BufferedProduceRecords() == 16
	})
	if b := r.s.cl.BufferedProduceRecords(); b > 16 {
		t.Fatalf("the client holds %d records, over its bound of 16", b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	k.Restart(ctx)
	testkit.WaitFor(t, "every record exported or counted as dropped", func() bool {
		e, d := r.m.Totals("kafka")
		return e+d[sink.ReasonBufferFull] == n
	})
	e, d := r.m.Totals("kafka")
	if d[sink.ReasonBufferFull] == 0 || e < 16 {
		t.Errorf("exported %d, dropped %v: want some of each", e, d)
	}
	t.Logf("brokers down: %d of %d records kept and delivered, %d dropped (buffer-full)", e, n, d[sink.ReasonBufferFull])
}

// TestMutualTLS: brokers that require client certificates take the
// records of a sink given the CA and a client pair (kafka.tls.*); a
// client without a certificate is refused.
func TestMutualTLS(t *testing.T) {
	b, err := certs.Ensure(t.TempDir(), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := b.Paths
	k := kafkatest.Start(t, kafkatest.Options{Brokers: 1, Partitions: 1, TLSCert: p.ServerCert, TLSKey: p.ServerKey, ClientCA: p.CACert})
	opts, err := kafkaclient.Options(k.Addrs(), config.KafkaTLS{Enable: true, CAFile: p.CACert, CertFile: p.ClientCert, KeyFile: p.ClientKey},
		config.KafkaSASL{})
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, Options{Client: opts, Topic: "flows"}, 64)
	r.buf.Produce(flowtest.Full(1, false))
	testkit.WaitFor(t, "the record acknowledged over mutual TLS", func() bool {
		e, _ := r.m.Totals("kafka")
		return e == 1
	})

	noCert, _ := kafkaclient.Options(k.Addrs(), config.KafkaTLS{Enable: true, CAFile: p.CACert}, config.KafkaSASL{})
	cl, err := kgo.NewClient(append(noCert, kgo.DefaultProduceTopic("flows"), kgo.RecordDeliveryTimeout(3*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err == nil {
		t.Error("a client without a certificate wrote to the brokers")
	}
}
