package policy_test

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"testing"
	"time"

	"sluice/flow"
	"sluice/policy/flowsrc"
	"sluice/policy/observed"
	"sluice/policy/recommend"
	"sluice/policy/verify"
	"sluice/sink/flowlog"
	"sluice/traceflow/cluster"
)

// benchRecords is the size of the benchmark's flow log.
const benchRecords = 1_000_000

// benchBlock is a block of flow log lines over the example cluster: every
// Pod to every Pod and to outside addresses on the demo's ports, with
// varying source ports; repeated, it makes a log of a million records of
// a few thousand distinct connections.
func benchBlock(b *testing.B, objs []cluster.Object) []byte {
	st, probs := cluster.Build(objs)
	if err := probs.Err(); err != nil {
		b.Fatal(err)
	}
	var ips []netip.Addr
	for _, p := range st.Pods {
		if !p.HostNetwork {
			ips = append(ips, p.IPs[0])
		}
	}
	ports := []uint16{53, 443, 5432, 6379, 8080, 8443, 9000, 9200}
	t0 := time.Now().Add(-time.Hour)
	var buf bytes.Buffer
	n := 0
	for _, s := range ips {
		for di := 0; di <= len(ips); di++ {
			d := netip.AddrFrom4([4]byte{198, 51, 100, byte(n % 250)})
			if di < len(ips) {
				d = ips[di]
			}
			for _, p := range ports {
				f := flow.Flow{StartTime: t0, EndTime: t0.Add(time.Minute), SourceIP: s, DestinationIP: d,
					SourcePort: uint16(30000 + n%30000), DestinationPort: p, Protocol: 6}
				if p == 53 {
					f.Protocol = 17
				}
				if pod := st.PodByIP(s); pod != nil {
					f.SourcePodName, f.SourcePodNamespace = pod.Name, pod.Namespace
				}
				if pod := st.PodByIP(d); pod != nil {
					f.DestinationPodName, f.DestinationPodNamespace = pod.Name, pod.Namespace
				}
				buf.Write(flowlog.AppendLine(nil, &f, true))
				buf.WriteByte('\n')
				n++
			}
		}
	}
	return bytes.Repeat(buf.Bytes(), 2)
}

// repeatReader yields block until lines lines were read.
type repeatReader struct {
	block      []byte
	lines, per int
	off        int
	done       int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.done*r.per >= r.lines {
		return 0, io.EOF
	}
	n := copy(p, r.block[r.off:])
	r.off += n
	if r.off == len(r.block) {
		r.off = 0
		r.done++
	}
	return n, nil
}

// BenchmarkVerifyMillionRecords: a million flow log records of a few
// thousand distinct connections, read, folded and verified against the
// example cluster's recommended policies.
func BenchmarkVerifyMillionRecords(b *testing.B) {
	objs := demoObjects(b)
	block := benchBlock(b, objs)
	per := bytes.Count(block, []byte{'\n'})
	before := buildModel(b, objs)
	read := func() *observed.Set {
		set := observed.NewSet(0)
		r := &repeatReader{block: block, lines: benchRecords, per: per}
		err := flowsrc.ReadLog(context.Background(), r, "bench", time.Time{}, func(rec *flowsrc.Record) error { set.Add(rec); return nil })
		if err != nil {
			b.Fatal(err)
		}
		return set
	}
	set := read()
	conns := set.Conns()
	res, err := recommend.Recommend(context.Background(), before, objs, conns, recommend.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var yb bytes.Buffer
	res.WriteYAML(&yb)
	cands, err := cluster.ParseObjects(yb.Bytes(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		set := read()
		after := buildModel(b, cluster.Overlay(objs, cands))
		rep, err := verify.Verify(context.Background(), before, after, cands, set.Conns(), verify.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if rep.Records < benchRecords || rep.Blocks() {
			b.Fatalf("%d records, blocks %d", rep.Records, len(rep.NewlyBlocked))
		}
	}
	b.ReportMetric(float64(set.Records), "records/op")
	b.ReportMetric(float64(set.Len()), "distinct/op")
}

// BenchmarkReadFold is the reading and folding part alone.
func BenchmarkReadFold(b *testing.B) {
	objs := demoObjects(b)
	block := benchBlock(b, objs)
	per := bytes.Count(block, []byte{'\n'})
	for b.Loop() {
		set := observed.NewSet(0)
		r := &repeatReader{block: block, lines: benchRecords, per: per}
		if err := flowsrc.ReadLog(context.Background(), r, "bench", time.Time{}, func(rec *flowsrc.Record) error { set.Add(rec); return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyConnections is the replay alone: the distinct
// connections of the million-record log, each through the model with and
// without the recommendations, and the surface.
func BenchmarkVerifyConnections(b *testing.B) {
	objs := demoObjects(b)
	block := benchBlock(b, objs)
	set := observed.NewSet(0)
	if err := flowsrc.ReadLog(context.Background(), bytes.NewReader(block), "bench", time.Time{}, func(rec *flowsrc.Record) error { set.Add(rec); return nil }); err != nil {
		b.Fatal(err)
	}
	conns := set.Conns()
	before := buildModel(b, objs)
	res, err := recommend.Recommend(context.Background(), before, objs, conns, recommend.Options{})
	if err != nil {
		b.Fatal(err)
	}
	var yb bytes.Buffer
	res.WriteYAML(&yb)
	cands, err := cluster.ParseObjects(yb.Bytes(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	after := buildModel(b, cluster.Overlay(objs, cands))
	for b.Loop() {
		if _, err := verify.Verify(context.Background(), before, after, cands, conns, verify.Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(conns)), "distinct/op")
}
