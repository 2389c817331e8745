package ipfixsend

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/exporter/attribution"
	"sluice/exporter/record"
	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

var sharedPods = []*enrich.Pod{{Namespace: "ns-a", Name: "a"}, {Namespace: "ns-a", Name: "b"}, {Namespace: "ns-c", Name: "c"}}

// randomRecord is a record as the store makes them, with a random share
// of everything optional: Pods, Service port, SNAT, verdict parts, IPv6,
// IPv4-mapped addresses.
func randomRecord(rng *rand.Rand) record.Record {
	addr := func(six bool) netip.Addr {
		if six {
			var b [16]byte
			b[0], b[1], b[15] = 0xfd, 0, byte(rng.IntN(256))
			return netip.AddrFrom16(b)
		}
		a := netip.AddrFrom4([4]byte{10, byte(rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		if rng.IntN(8) == 0 {
			return netip.AddrFrom16(a.As16()) // IPv4-mapped, as some sources give them
		}
		return a
	}
	six := rng.IntN(4) == 0
	r := record.Record{Start: rng.Int64N(1 << 61), End: rng.Int64N(1 << 61), Src: record.AddrFrom(addr(six)), Dst: record.AddrFrom(addr(six)),
		SrcPort: uint16(rng.Uint32()), DstPort: uint16(rng.Uint32()), Proto: []uint8{6, 17, 132}[rng.IntN(3)],
		EndReason: uint8(1 + rng.IntN(3)), TCPState: uint8(rng.IntN(12)), FlowType: uint8(1 + rng.IntN(4))}
	m := &record.Meta{Node: "node-1"}
	for i := range r.Counts {
		r.Counts[i] = rng.Uint64() >> rng.IntN(64)
	}
	if rng.IntN(2) == 0 {
		m.SrcPod = &enrich.Pod{Namespace: "ns-a", Name: fmt.Sprint("client-", rng.IntN(100))}
	} else if rng.IntN(2) == 0 {
		m.SrcPod = sharedPods[rng.IntN(len(sharedPods))] // the metadata cache's hits
	}
	if rng.IntN(2) == 0 {
		m.DstPod = &enrich.Pod{Namespace: "ns-b", Name: "server"}
	}
	if rng.IntN(3) == 0 {
		m.SnatIP, m.SnatPort = addr(six && rng.IntN(2) == 0), uint16(rng.Uint32())
	}
	if rng.IntN(3) == 0 {
		m.ServiceIP, m.ServicePort, m.ServicePortName = addr(six && rng.IntN(2) == 0), uint16(rng.Uint32()), "ns-b/svc:http"
	} else if rng.IntN(4) == 0 {
		m.ServiceIP, m.ServicePort = addr(false), 80 // no port name: not written
	}
	if rng.IntN(8) != 0 { // else no metadata at all
		r.Meta = m
	}
	if rng.IntN(2) == 0 {
		v := &attribution.Verdict{Egress: flow.Policy{Type: 1, Namespace: "ns-a", Name: "out", RuleName: "rule-1", RuleAction: flow.ActionAllow},
			Ingress:    flow.Policy{Type: 3, Name: "acnp-deny", RuleName: "drop-all", RuleAction: flow.ActionDrop},
			EgressName: "egress-1", EgressNode: "node-2"}
		if rng.IntN(2) == 0 {
			v.EgressIP = netip.MustParseAddr("192.168.7.1")
			if rng.IntN(2) == 0 {
				v.EgressIPText = v.EgressIP.String()
			}
		}
		r.Verdict, r.Attr = v, uint8(rng.IntN(8))
	}
	return r
}

// TestRecordsEncodeAsTheirFlows checks, for every agent profile, that a
// record written directly is the same octets as the flow.Flow it stands
// for written through ipfixmap.PutValues.
func TestRecordsEncodeAsTheirFlows(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, profile := range ipfixmap.AgentVersions() {
		for _, extra := range [][]flow.Element{nil, {{EnterpriseID: ipfix.EnterpriseAntrea, ID: 240, Value: []byte{1, 2}}}} {
			s, err := New(Options{Address: "127.0.0.1:1", Proto: "tcp", Profile: profile, Extra: extra, ObservationDomainID: 7})
			if err != nil {
				t.Fatal(err)
			}
			for i := range s.plan {
				if s.plan[i] == nil || s.plan[i][0] != opHeadRun || s.meta[i] == nil {
					t.Fatalf("%s: template %d has no record plan, or not the head run's: %v", profile, i, s.plan[i])
				}
				if profile == ipfixmap.NewestAgent && s.blocks[i] == nil {
					t.Fatalf("%s: template %d has no block plan: %v", profile, i, s.plan[i])
				}
			}
			encode := func(write func() error) []byte {
				var out []byte
				enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{Now: func() time.Time { return time.Unix(1e9, 0) }},
					func(m []byte) error { out = append(out, m...); return nil })
				if err != nil {
					t.Fatal(err)
				}
				s.enc = enc
				if err := write(); err != nil {
					t.Fatal(err)
				}
				if err := enc.Flush(); err != nil {
					t.Fatal(err)
				}
				return out
			}
			plans, metas, blocks := s.plan, s.meta, s.blocks
			for n := range 1500 {
				switch n {
				case 500: // then without the block plans: the meta run cached, the rest element by element
					s.blocks = [2]*blockPlan{}
				case 1000: // the last third element by element, no runs
					s.plan = [2][]fieldOp{elementOps(s.els[0]), elementOps(s.els[1])}
					s.meta = [2]*metaCache{}
				}
				r := randomRecord(rng)
				got := encode(func() error { return s.writeRecord(&r) })
				// Again: from the caches' entries this time.
				again := encode(func() error { return s.writeRecord(&r) })
				want := encode(func() error {
					var f flow.Flow
					r.Flow(&f)
					return s.write(&f)
				})
				if !bytes.Equal(again, got) {
					t.Fatalf("%s (record %d): record %+v\nencodes as %x\nthen as %x", profile, n, r, got, again)
				}
				if !bytes.Equal(got, want) {
					var f flow.Flow
					r.Flow(&f)
					t.Fatalf("%s (record %d): record %+v\nencodes as %x\nits flow as %x", profile, n, r, got, want)
				}
			}
			s.plan, s.meta, s.blocks = plans, metas, blocks
		}
	}
}

// BenchmarkEncode50k encodes 50,000 records with the v2.7 template into
// messages that are then discarded: "record" writes them directly,
// "flow" converts each to a flow.Flow and writes it with
// ipfixmap.PutValues (the path every record took before records).
func BenchmarkEncode50k(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	recs := make([]record.Record, 50_000)
	pods := []*enrich.Pod{{Namespace: "bench", Name: "client-1"}, {Namespace: "bench", Name: "client-2"}}
	verdicts := []*attribution.Verdict{randomRecord(rng).Verdict, randomRecord(rng).Verdict}
	for i := range recs {
		r := randomRecord(rng)
		r.Src, r.Dst = record.AddrFrom(r.Src.Addr().Unmap()), record.AddrFrom(r.Dst.Addr().Unmap())
		if !r.Src.Is4() || !r.Dst.Is4() {
			r.Src = record.AddrFrom(netip.AddrFrom4([4]byte{10, 10, 0, byte(i)}))
			r.Dst = record.AddrFrom(netip.AddrFrom4([4]byte{10, 20, 0, byte(i)}))
		}
		m := record.Meta{Node: "node-1", SrcPod: pods[i%2]}
		if r.Meta != nil {
			m.ServicePort, m.ServicePortName = r.Meta.ServicePort, r.Meta.ServicePortName
		}
		r.Meta = &m
		if r.Verdict != nil { // verdicts are shared by the connections of a key
			r.Verdict = verdicts[i%2]
		}
		recs[i] = r
	}
	for _, path := range []string{"record", "flow"} {
		b.Run(path, func(b *testing.B) {
			s, err := New(Options{Address: "127.0.0.1:1", Proto: "tcp", ObservationDomainID: 7})
			if err != nil {
				b.Fatal(err)
			}
			octets := 0
			if s.enc, err = ipfix.NewEncoder(ipfix.EncoderOptions{OneSetPerMessage: true}, func(m []byte) error {
				octets += len(m)
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			var f flow.Flow
			for b.Loop() {
				for i := range recs {
					r := &recs[i]
					if path == "record" {
						err = s.writeRecord(r)
					} else {
						r.Flow(&f)
						err = s.write(&f)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				_ = s.enc.Flush()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(recs)), "ns/record")
		})
	}
}

// TestUnixSeconds checks unixSeconds against time's, both sides of 1970.
func TestUnixSeconds(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, ns := range []int64{0, 1, -1, 999_999_999, 1e9, -1e9, -1e9 - 1, 1<<62 + 7, -(1 << 62) - 7, rng.Int64(), -rng.Int64()} {
		if got, want := unixSeconds(ns), time.Unix(0, ns).Unix(); got != want {
			t.Errorf("%d ns: %d s, want %d", ns, got, want)
		}
	}
}
