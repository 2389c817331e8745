package flowjson_test

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/flowjson"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

func TestAppendObject(t *testing.T) {
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ex, err := ipfixmap.NewExporter(tb, ipfixmap.ExportOptions{Names: true, Aggregate: true}, false, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	r := flowjson.New(ex)
	for _, src := range []string{"10.0.0.1", "fd00::1"} {
		f := &flow.Flow{StartTime: time.Unix(100, 0), EndTime: time.Unix(160, 0),
			SourceIP: netip.MustParseAddr(src), SourcePort: 4242, Protocol: 6,
			SourcePodName: "a\"b", Stats: flow.Stats{OctetTotalCount: 1 << 40},
			Aggregation: &flow.Aggregation{Throughput: 12345}}
		f.DestinationIP = f.SourceIP.Next()
		b, err := r.AppendObject([]byte("x"), f)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b[1:], &m); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		addrKey := "sourceIPv4Address"
		if f.SourceIP.Is6() {
			addrKey = "sourceIPv6Address"
		}
		if m[addrKey] != src || m["sourceTransportPort"] != float64(4242) || m["sourcePodName"] != "a\"b" ||
			m["octetTotalCount"] != float64(1<<40) || m["throughput"] != float64(12345) || m["flowStartSeconds"] == nil {
			t.Errorf("%s: %v", src, m)
		}
	}
}
