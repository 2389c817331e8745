package flowsrc_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"sluice/config"
	"sluice/demo"
	"sluice/internal/testkit/chserver"
	"sluice/policy/flowsrc"
	"sluice/policy/observed"
)

func fold(t *testing.T, src flowsrc.Source, since time.Time) *observed.Set {
	t.Helper()
	set := observed.NewSet(0)
	if err := src.Read(context.Background(), since, func(r *flowsrc.Record) error { set.Add(r); return nil }); err != nil {
		t.Fatal(err)
	}
	return set
}

// TestClickHouseSource: a demo run writes the same records to its flow
// log and to a real clickhouse-server; read back from the flows table
// they fold into the same connections, with the same allowed and denied
// counts and times, as the flow log's.
func TestClickHouseSource(t *testing.T) {
	srv := chserver.Start(t, chserver.Options{})
	out := t.TempDir()
	var stdout bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := demo.Run(ctx, demo.Options{Mode: config.ModeAggregate, Duration: 6 * time.Second, Rate: 150, Stdout: &stdout,
		Seed: 3, Out: out, ClickHouseURL: "tcp://" + srv.Addr})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, stdout.String())
	}
	if sum.SinkExported[config.SinkFlowLogger] == 0 {
		t.Fatal("the demo logged no record")
	}
	logSet := fold(t, &flowsrc.File{Path: filepath.Join(out, "flows.log")}, time.Time{})
	src, err := flowsrc.Open("tcp://" + srv.Addr + "/default")
	if err != nil {
		t.Fatal(err)
	}
	chSet := fold(t, src, time.Time{})
	if chSet.Records != logSet.Records || chSet.Len() != logSet.Len() {
		t.Fatalf("ClickHouse: %d records, %d connections; the flow log: %d, %d", chSet.Records, chSet.Len(), logSet.Records, logSet.Len())
	}
	denied := 0
	lc := logSet.Conns()
	for i, c := range chSet.Conns() {
		l := lc[i]
		if c.Key != l.Key || c.Allowed != l.Allowed || c.Denied != l.Denied || !c.First.Equal(l.First) || !c.Last.Equal(l.Last) ||
			c.SrcPod != l.SrcPod || c.DstPod != l.DstPod || c.ServicePortName != l.ServicePortName || c.ClusterIP != l.ClusterIP {
			t.Errorf("connection %d:\nClickHouse %+v\nflow log   %+v", i, c, l)
		}
		if c.Denied > 0 {
			denied++
		}
	}
	if denied == 0 {
		t.Error("no denied connection read back; the demo's denied routes should show")
	}
	// --since: nothing ended in the future.
	if n := fold(t, src, time.Now().Add(time.Hour)).Records; n != 0 {
		t.Errorf("since an hour ahead: %d records", n)
	}
	for _, bad := range []string{"tcp://" + srv.Addr + "/nosuchdb", "tls://127.0.0.1:1/default"} {
		s, err := flowsrc.Open(bad)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Read(context.Background(), time.Time{}, func(*flowsrc.Record) error { return nil }); err == nil {
			t.Errorf("%s: read without error", bad)
		}
	}
}
