package interop

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/internal/testkit/s3server"
	"sluice/ring"
	"sluice/sink"
	"sluice/sink/s3"
)

// parquetColumn is what a column of the S3 sink's Parquet files must be,
// written here from the record model, independently of the sink's code:
// its name, its Arrow type once read, and its value for a record.
type parquetColumn struct {
	name string
	typ  arrow.Type
	val  func(f *flow.Flow, agg *flow.Aggregation) any
}

func ms(t time.Time) any {
	if t.IsZero() {
		return int64(0)
	}
	return t.UnixMilli()
}

func ip(a netip.Addr) any {
	if !a.IsValid() {
		return ""
	}
	return a.Unmap().String()
}

func i32[T ~uint8 | ~uint16](v T) any { return int32(v) }
func i64(v uint64) any                { return int64(v) }

var parquetColumns = []parquetColumn{
	{"flowStartSeconds", arrow.TIMESTAMP, func(f *flow.Flow, _ *flow.Aggregation) any { return ms(f.StartTime) }},
	{"flowEndSeconds", arrow.TIMESTAMP, func(f *flow.Flow, _ *flow.Aggregation) any { return ms(f.EndTime) }},
	{"flowEndSecondsFromSourceNode", arrow.TIMESTAMP, func(_ *flow.Flow, a *flow.Aggregation) any { return ms(a.EndFromSource) }},
	{"flowEndSecondsFromDestinationNode", arrow.TIMESTAMP, func(_ *flow.Flow, a *flow.Aggregation) any { return ms(a.EndFromDestination) }},
	{"flowEndReason", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.EndReason) }},
	{"sourceIP", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return ip(f.SourceIP) }},
	{"destinationIP", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return ip(f.DestinationIP) }},
	{"sourceTransportPort", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.SourcePort) }},
	{"destinationTransportPort", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.DestinationPort) }},
	{"protocolIdentifier", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.Protocol) }},
	{"packetTotalCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.Stats.PacketTotalCount) }},
	{"octetTotalCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.Stats.OctetTotalCount) }},
	{"packetDeltaCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.Stats.PacketDeltaCount) }},
	{"octetDeltaCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.Stats.OctetDeltaCount) }},
	{"reversePacketTotalCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.ReverseStats.PacketTotalCount) }},
	{"reverseOctetTotalCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.ReverseStats.OctetTotalCount) }},
	{"reversePacketDeltaCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.ReverseStats.PacketDeltaCount) }},
	{"reverseOctetDeltaCount", arrow.INT64, func(f *flow.Flow, _ *flow.Aggregation) any { return i64(f.ReverseStats.OctetDeltaCount) }},
	{"sourcePodName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.SourcePodName }},
	{"sourcePodNamespace", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.SourcePodNamespace }},
	{"sourceNodeName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.SourceNodeName }},
	{"destinationPodName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.DestinationPodName }},
	{"destinationPodNamespace", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.DestinationPodNamespace }},
	{"destinationNodeName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.DestinationNodeName }},
	{"destinationClusterIP", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return ip(f.DestinationClusterIP) }},
	{"destinationServiceIP", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return ip(f.DestinationServiceIP) }},
	{"destinationServicePort", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.DestinationServicePort) }},
	{"destinationServicePortName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.DestinationServicePortName }},
	{"ingressNetworkPolicyName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.Ingress.Name }},
	{"ingressNetworkPolicyNamespace", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.Ingress.Namespace }},
	{"ingressNetworkPolicyRuleName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.Ingress.RuleName }},
	{"ingressNetworkPolicyRuleAction", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.Ingress.RuleAction) }},
	{"ingressNetworkPolicyType", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.Ingress.Type) }},
	{"egressNetworkPolicyName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.Egress.Name }},
	{"egressNetworkPolicyNamespace", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.Egress.Namespace }},
	{"egressNetworkPolicyRuleName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.Egress.RuleName }},
	{"egressNetworkPolicyRuleAction", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.Egress.RuleAction) }},
	{"egressNetworkPolicyType", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.Egress.Type) }},
	{"tcpState", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.TCPState }},
	{"flowType", arrow.INT32, func(f *flow.Flow, _ *flow.Aggregation) any { return i32(f.FlowType) }},
	{"sourcePodLabels", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.SourcePodLabels }},
	{"destinationPodLabels", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.DestinationPodLabels }},
	{"throughput", arrow.INT64, func(_ *flow.Flow, a *flow.Aggregation) any { return i64(a.Throughput) }},
	{"reverseThroughput", arrow.INT64, func(_ *flow.Flow, a *flow.Aggregation) any { return i64(a.ReverseThroughput) }},
	{"throughputFromSourceNode", arrow.INT64, func(_ *flow.Flow, a *flow.Aggregation) any { return i64(a.ThroughputFromSource) }},
	{"throughputFromDestinationNode", arrow.INT64, func(_ *flow.Flow, a *flow.Aggregation) any { return i64(a.ThroughputFromDestination) }},
	{"reverseThroughputFromSourceNode", arrow.INT64, func(_ *flow.Flow, a *flow.Aggregation) any { return i64(a.ReverseThroughputFromSource) }},
	{"reverseThroughputFromDestinationNode", arrow.INT64, func(_ *flow.Flow, a *flow.Aggregation) any { return i64(a.ReverseThroughputFromDestination) }},
	{"clusterUUID", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.ClusterID }},
	{"timeInserted", arrow.TIMESTAMP, nil}, // the time of writing: checked against the run's bounds
	{"egressName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.EgressName }},
	{"egressIP", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return ip(f.EgressIP) }},
	{"egressNodeName", arrow.STRING, func(f *flow.Flow, _ *flow.Aggregation) any { return f.EgressNodeName }},
}

// value reads row i of an Arrow column as int64, int32 or string.
func value(t *testing.T, col arrow.Array, i int) any {
	switch c := col.(type) {
	case *array.Timestamp:
		return int64(c.Value(i))
	case *array.Int64:
		return c.Value(i)
	case *array.Int32:
		return c.Value(i)
	case *array.String:
		return c.Value(i)
	}
	t.Fatalf("column of type %s", col.DataType())
	return nil
}

// TestS3ParquetReadByArrow: the S3 sink's Parquet files, uploaded to a real
// S3-compatible server (versitygw) and read back by Apache Arrow's Parquet
// reader (pqarrow, an implementation independent of the writer's), hold
// every record: the column names, types (timestamps in milliseconds, UTC)
// and every value as the record model says, null nowhere.
func TestS3ParquetReadByArrow(t *testing.T) {
	srv := s3server.Start(t)
	srv.MakeBucket("flows")
	m := sink.NewMetrics(nil)
	s, err := s3.New(s3.Options{Endpoint: srv.Addr, Bucket: "flows", Prefix: "pq",
		Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, ""), Format: s3.FormatParquet, Compress: true,
		MaxRecordsPerFile: 1500, UploadInterval: time.Hour, Metrics: m, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var sent []*flow.Flow
	for i := range 2000 {
		f := flowtest.Full(i, i%3 != 0) // a third not aggregated (Proxy mode's records)
		f.SourcePort = uint16(i)
		switch i % 7 {
		case 1: // few fields known
			*f = flow.Flow{StartTime: f.StartTime, SourcePort: f.SourcePort, Protocol: 17,
				SourceIP: netip.MustParseAddr("fd00::1"), DestinationIP: netip.MustParseAddr("::ffff:10.1.2.3")}
		case 2:
			f.Stats.OctetTotalCount = 1<<62 + uint64(i)
			f.SourcePodLabels = `{"a":"b,c","d":"'e'"}`
		}
		sent = append(sent, f)
	}
	buf := ring.New[*flow.Flow](4096)
	c := buf.Consumer()
	from := time.Now()
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background(), c) }()
	buf.Produce(sent...)
	buf.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	to := time.Now()

	objs := srv.Objects("flows", "pq/")
	if len(objs) != 2 {
		t.Fatalf("%d objects, want 2", len(objs))
	}
	seen := make([]bool, len(sent))
	for _, o := range objs {
		pf, err := file.NewParquetReader(bytes.NewReader(o.Data))
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		tbl, err := fr.ReadTable(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", o.Key, err)
		}
		schema := tbl.Schema()
		if schema.NumFields() != len(parquetColumns) {
			t.Fatalf("%s: %d columns, want %d: %s", o.Key, schema.NumFields(), len(parquetColumns), schema)
		}
		cols := make([]arrow.Array, len(parquetColumns))
		for j, pc := range parquetColumns {
			fld := schema.Field(j)
			if fld.Name != pc.name || fld.Type.ID() != pc.typ || fld.Nullable {
				t.Fatalf("%s: column %d is %s %s (nullable %v), want %s %s, required", o.Key, j, fld.Name, fld.Type,
					fld.Nullable, pc.name, pc.typ)
			}
			if ts, ok := fld.Type.(*arrow.TimestampType); ok && (ts.Unit != arrow.Millisecond || ts.TimeZone != "UTC") {
				t.Fatalf("%s: column %s is %s, want milliseconds UTC", o.Key, pc.name, ts)
			}
			arr, err := array.Concatenate(tbl.Column(j).Data().Chunks(), memory.DefaultAllocator)
			if err != nil {
				t.Fatal(err)
			}
			defer arr.Release()
			cols[j] = arr
			if cols[j].NullN() != 0 {
				t.Fatalf("%s: %d nulls in %s", o.Key, cols[j].NullN(), pc.name)
			}
		}
		for i := 0; i < int(tbl.NumRows()); i++ {
			port := value(t, cols[7], i).(int32)
			f := sent[port]
			if seen[port] {
				t.Fatalf("record %d twice", port)
			}
			seen[port] = true
			agg := f.Aggregation
			if agg == nil {
				agg = &flow.Aggregation{}
			}
			for j, pc := range parquetColumns {
				got := value(t, cols[j], i)
				if pc.val == nil {
					if ms := got.(int64); ms < from.UnixMilli() || ms > to.UnixMilli() {
						t.Fatalf("record %d: %s = %d, not within [%d, %d]", port, pc.name, ms, from.UnixMilli(), to.UnixMilli())
					}
					continue
				}
				if want := pc.val(f, agg); fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprintf("%T", got) != fmt.Sprintf("%T", want) {
					t.Fatalf("record %d: %s = %v (%T), want %v (%T)", port, pc.name, got, got, want, want)
				}
			}
		}
		tbl.Release()
	}
	for i, ok := range seen {
		if !ok {
			t.Fatalf("record %d missing", i)
		}
	}
	t.Logf("%d records in %d Parquet objects (%d and %d octets) read back by pqarrow", len(sent), len(objs),
		len(objs[0].Data), len(objs[1].Data))
}
