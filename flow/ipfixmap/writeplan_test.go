package ipfixmap_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// exportVariants are every combination of ExportOptions.
func exportVariants() []ipfixmap.ExportOptions {
	var out []ipfixmap.ExportOptions
	for m := range 16 {
		out = append(out, ipfixmap.ExportOptions{Names: m&1 != 0, UIDs: m&2 != 0, Proxy: m&4 != 0, Aggregate: m&8 != 0})
	}
	return out
}

// TestWritePlanCoversBase checks that the write plans write every element
// of the base templates themselves, so that TestWritePlanMatchesPut
// compares them with put for all of them.
func TestWritePlanCoversBase(t *testing.T) {
	tb := table(t)
	for _, o := range exportVariants() {
		ex, err := ipfixmap.NewExporter(tb, o, true, ipfix.MinDataSetID)
		if err != nil {
			t.Fatal(err)
		}
		for _, family := range []int{4, 6} {
			if left := ipfixmap.PlanLeftToPut(ex, family); len(left) != 0 {
				t.Errorf("%+v IPv%d: the plan leaves %v to put", o, family, left)
			}
		}
	}
}

// TestWritePlanMatchesPut writes many varied records with write plans and
// with every element's put (as before plans), and checks that the
// messages are the same octets, and the errors the same errors.
func TestWritePlanMatchesPut(t *testing.T) {
	tb := table(t)
	rng := rand.New(rand.NewPCG(30, 1205))
	for _, o := range exportVariants() {
		for _, passThrough := range []bool{false, true} {
			t.Run(fmt.Sprintf("%+v/passThrough=%v", o, passThrough), func(t *testing.T) {
				plan, err := ipfixmap.NewExporter(tb, o, passThrough, 300)
				if err != nil {
					t.Fatal(err)
				}
				ref, err := ipfixmap.NewExporter(tb, o, passThrough, 300)
				if err != nil {
					t.Fatal(err)
				}
				ipfixmap.DisableWritePlan(ref)
				var got, want [][]byte
				encPlan := testEncoder(t, &got)
				encRef := testEncoder(t, &want)
				for i := range 600 {
					f := randomFlow(rng, i)
					errPlan := writeOne(plan, encPlan, &f)
					errRef := writeOne(ref, encRef, &f)
					if fmt.Sprint(errPlan) != fmt.Sprint(errRef) {
						t.Fatalf("record %d: error %v with the plan, %v with put", i, errPlan, errRef)
					}
					// Flush often, so that a difference names few records.
					if i%7 == 0 {
						encPlan.Flush()
						encRef.Flush()
					}
				}
				encPlan.Flush()
				encRef.Flush()
				// All but the records with a long string.
				if n := ipfixmap.Planned(plan); n < 500 {
					t.Errorf("the plan wrote %d records of 600", n)
				}
				if n := ipfixmap.Planned(ref); n != 0 {
					t.Errorf("the disabled plan wrote %d records", n)
				}
				if len(got) != len(want) {
					t.Fatalf("%d messages with the plan, %d with put", len(got), len(want))
				}
				for i := range got {
					if !bytes.Equal(got[i], want[i]) {
						t.Fatalf("message %d differs at octet %d:\nplan %x\nput  %x", i, firstDiff(got[i], want[i]), got[i], want[i])
					}
				}
			})
		}
	}
}

// TestWritePlanForeignTemplate checks that a template of another
// Exporter (the same shape) is written with put, as before.
func TestWritePlanForeignTemplate(t *testing.T) {
	tb := table(t)
	o := ipfixmap.ExportOptions{Names: true, Proxy: true}
	a, _ := ipfixmap.NewExporter(tb, o, false, 300)
	b, _ := ipfixmap.NewExporter(tb, o, false, 300)
	ipfixmap.DisableWritePlan(b)
	f := fullFlow(4)
	ta, _, _ := a.Template(&f)
	var got, want [][]byte
	ea, eb := testEncoder(t, &got), testEncoder(t, &want)
	ea.AddTemplate(1, ta)
	eb.AddTemplate(1, ta)
	// A template of b's is not a's: a writes it with put.
	tForeign, _, _ := b.Template(&f)
	if err := a.Write(ea.Begin(1, tForeign), tForeign, &f); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(eb.Begin(1, tForeign), tForeign, &f); err != nil {
		t.Fatal(err)
	}
	ea.Flush()
	eb.Flush()
	if len(got) != 1 || !bytes.Equal(got[0], want[0]) {
		t.Fatalf("foreign template:\n%x\n%x", got, want)
	}
	// A record of the other family's template fails as it did.
	f6 := fullFlow(6)
	errA := a.Write(ea.Begin(1, ta), ta, &f6)
	errB := b.Write(eb.Begin(1, ta), ta, &f6)
	if fmt.Sprint(errA) != fmt.Sprint(errB) {
		t.Fatalf("wrong family: %v with the plan, %v with put", errA, errB)
	}
}

func testEncoder(t *testing.T, msgs *[][]byte) *ipfix.Encoder {
	t.Helper()
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{Now: func() time.Time { return time.Unix(1_790_000_000, 0) }},
		func(m []byte) error { *msgs = append(*msgs, bytes.Clone(m)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

func writeOne(ex *ipfixmap.Exporter, enc *ipfix.Encoder, f *flow.Flow) error {
	domain := f.Origin.ObservationDomainID % 3
	tmpl, isNew, err := ex.Template(f)
	if err != nil {
		return err
	}
	if isNew {
		if err := enc.AddTemplate(domain, tmpl); err != nil {
			return err
		}
	}
	return ex.Write(enc.Begin(domain, tmpl), tmpl, f)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// randomFlow sets every field to a random value, mostly non-zero: both IP
// families, mixed ones, IPv4-mapped and absent addresses, empty, short
// and long strings, zero and non-zero times, with and without an
// Aggregation, unknown elements and the legacy L7 ones.
func randomFlow(rng *rand.Rand, i int) flow.Flow {
	long := i%10 == 9
	u8 := func() uint8 { return uint8(1 + rng.IntN(255)) }
	u16 := func() uint16 { return uint16(1 + rng.IntN(65535)) }
	u64 := func() uint64 { return rng.Uint64() | 1 }
	str := func() string {
		switch rng.IntN(8) {
		case 0:
			return ""
		case 1:
			if long {
				// A 3-octet length prefix past 254 (the plan
				// leaves the record to put).
				return strings.Repeat("x", 250+rng.IntN(300))
			}
			return strings.Repeat("y", 254) // the longest 1-octet prefix
		}
		b := make([]byte, 1+rng.IntN(40))
		for j := range b {
			b[j] = byte(' ' + rng.IntN(95))
		}
		return string(b)
	}
	uid := func() flow.UID {
		var u flow.UID
		for j := range u {
			u[j] = byte(rng.IntN(256))
		}
		u[0] |= 1
		return u
	}
	tm := func() time.Time {
		if rng.IntN(10) == 0 {
			return time.Time{}
		}
		return time.Unix(1_600_000_000+rng.Int64N(400_000_000), rng.Int64N(1e9))
	}
	addr4 := func() netip.Addr {
		return netip.AddrFrom4([4]byte{byte(1 + rng.IntN(254)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(1 + rng.IntN(254))})
	}
	addr6 := func() netip.Addr {
		var b [16]byte
		for j := range b {
			b[j] = byte(rng.IntN(256))
		}
		b[0] = 0xfd
		return netip.AddrFrom16(b)
	}
	// The record's family: 4, 6, or IPv4 with one IPv6 address (a mixed
	// record, written IPv6 with its IPv4 addresses mapped).
	mode := i % 3
	addr := func() netip.Addr {
		switch r := rng.IntN(12); {
		case r == 0:
			return netip.Addr{}
		case r == 1:
			return netip.AddrFrom16(addr4().As16()) // IPv4-mapped
		case mode == 1:
			return addr6()
		default:
			return addr4()
		}
	}
	f := flow.Flow{
		StartTime: tm(), EndTime: tm(), EndReason: u8(),
		SourceIP: addr(), DestinationIP: addr(), Protocol: u8(), SourcePort: u16(), DestinationPort: u16(),
		TCPState:           str(),
		Stats:              flow.Stats{PacketTotalCount: u64(), PacketDeltaCount: u64(), OctetTotalCount: u64(), OctetDeltaCount: u64()},
		ReverseStats:       flow.Stats{PacketTotalCount: u64(), PacketDeltaCount: u64(), OctetTotalCount: u64(), OctetDeltaCount: u64()},
		FlowType:           u8(),
		SourcePodNamespace: str(), SourcePodName: str(), SourcePodUID: uid(), SourcePodLabels: str(),
		SourceNodeName: str(), SourceNodeUID: uid(),
		DestinationPodNamespace: str(), DestinationPodName: str(), DestinationPodUID: uid(), DestinationPodLabels: str(),
		DestinationNodeName: str(), DestinationNodeUID: uid(),
		DestinationClusterIP: addr(), DestinationServiceIP: addr(), DestinationServicePort: u16(),
		DestinationServicePortName: str(), DestinationServiceUID: uid(),
		Ingress:    flow.Policy{Type: u8(), Namespace: str(), Name: str(), UID: uid(), RuleName: str(), RuleAction: u8()},
		Egress:     flow.Policy{Type: u8(), Namespace: str(), Name: str(), UID: uid(), RuleName: str(), RuleAction: u8()},
		EgressName: str(), EgressNodeName: str(), EgressNodeUID: uid(), EgressUID: uid(),
		FlowDirection: u8(), ProxySnatIP: addr(), ProxySnatPort: u16(), ClusterID: str(),
	}
	if mode == 2 {
		f.DestinationServiceIP = addr6()
	}
	switch rng.IntN(3) {
	case 0:
		f.EgressIP = addr4()
	case 1:
		f.EgressIP = addr6()
	}
	f.Origin = flow.Origin{ObservationDomainID: rng.Uint32() | 1}
	switch rng.IntN(4) {
	case 0:
		f.Origin.Exporter = addr4()
	case 1:
		f.Origin.Exporter = addr6()
	case 2:
		f.Origin.Exporter = netip.AddrFrom16(addr4().As16())
	}
	if rng.IntN(4) != 0 {
		f.Aggregation = &flow.Aggregation{
			EndFromSource: tm(), EndFromDestination: tm(),
			StatsFromSource:             flow.Stats{PacketTotalCount: u64(), PacketDeltaCount: u64(), OctetTotalCount: u64(), OctetDeltaCount: u64()},
			ReverseStatsFromSource:      flow.Stats{PacketTotalCount: u64(), PacketDeltaCount: u64(), OctetTotalCount: u64(), OctetDeltaCount: u64()},
			StatsFromDestination:        flow.Stats{PacketTotalCount: u64(), PacketDeltaCount: u64(), OctetTotalCount: u64(), OctetDeltaCount: u64()},
			ReverseStatsFromDestination: flow.Stats{PacketTotalCount: u64(), PacketDeltaCount: u64(), OctetTotalCount: u64(), OctetDeltaCount: u64()},
			Throughput:                  u64(), ReverseThroughput: u64(),
			ThroughputFromSource: u64(), ReverseThroughputFromSource: u64(),
			ThroughputFromDestination: u64(), ReverseThroughputFromDestination: u64(),
		}
	}
	// The legacy L7 elements and unknown ones, for pass-through.
	if rng.IntN(3) == 0 {
		f.AppProtocolName, f.HTTPVals = str(), str()
		f.Present.Set(flow.AppProtocolName)
		f.Present.Set(flow.HTTPVals)
	}
	if rng.IntN(3) == 0 {
		f.Unknown = append(f.Unknown, flow.Element{EnterpriseID: 4242, ID: uint16(1 + rng.IntN(3)), Length: ipfix.VariableLength, Value: []byte(str())})
		if rng.IntN(2) == 0 {
			f.Unknown = append(f.Unknown, flow.Element{EnterpriseID: 0, ID: 300, Length: 4, Value: []byte{1, 2, 3, 4}})
		}
	}
	return f
}
