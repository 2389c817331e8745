package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
	"sluice/proxy"
	"sluice/ring"
)

// fwTemplate is a received template to try the fast path on, and whether
// it must take it (with pass-through on and off).
type fwTemplate struct {
	name             string
	fields           []ipfix.Field
	fastPT, fastNoPT bool
}

func fwTemplates(t testing.TB, rng *rand.Rand) []fwTemplate {
	reg := ipfix.DefaultRegistry()
	fields := func(names ...string) []ipfix.Field {
		var fs []ipfix.Field
		for _, n := range names {
			ie, ok := reg.ByName(n)
			if !ok {
				t.Fatalf("no element %s", n)
			}
			fs = append(fs, ipfix.Field{IE: ie})
		}
		return fs
	}
	agent := func(v string, family int) []string {
		names, err := ipfixmap.AgentElements(v, family)
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	var out []fwTemplate
	for _, v := range ipfixmap.AgentVersions() {
		for _, fam := range []int{4, 6} {
			legacy := v == "v1.15" || v == "v2.0" // appProtocolName, httpVals
			out = append(out, fwTemplate{fmt.Sprintf("agent %s IPv%d", v, fam), fields(agent(v, fam)...), !legacy, true})
		}
	}
	v27 := agent("v2.7", 4)
	out = append(out,
		fwTemplate{"v2.7 + what Proxy mode adds, sent by the exporter", fields(append(slicesClone(v27),
			"flowDirection", "sourcePodLabels", "destinationPodLabels", "clusterId",
			"originalObservationDomainId", "originalExporterIPv4Address")...), true, true},
		fwTemplate{"v2.7 + UIDs (not exported with UIDs off)", fields(append(slicesClone(v27), "sourcePodUUID", "destinationNodeUUID")...), true, true},
		fwTemplate{"flowStartMilliseconds for flowStartSeconds", fields(append([]string{"flowStartMilliseconds"}, v27[1:]...)...), false, false},
		fwTemplate{"start in seconds and milliseconds", fields(append(slicesClone(v27), "flowStartMilliseconds")...), false, false},
		fwTemplate{"mixed families", fields(append(slicesClone(v27[:11]), append([]string{"destinationIPv6Address"}, v27[12:]...)...)...), false, false},
		fwTemplate{"an element twice", fields(append(slicesClone(v27), "sourcePodName")...), false, false},
		fwTemplate{"no addresses at all", fields("flowStartSeconds", "flowEndSeconds", "sourcePodName", "flowType"), true, true},
	)
	// A reduced-size counter.
	red := fields(v27...)
	red[9].Length = 4 // octetDeltaCount
	out = append(out, fwTemplate{"reduced-size octetDeltaCount", red, false, false})
	// The future: two Antrea elements and one of another enterprise that
	// Sluice does not know.
	fut := fields(v27...)
	for _, x := range []ipfix.Field{{EnterpriseID: ipfix.EnterpriseAntrea, ID: 173, Length: 4}, {EnterpriseID: ipfix.EnterpriseAntrea, ID: 174, Length: ipfix.VariableLength}, {EnterpriseID: 99, ID: 7, Length: 2}} {
		x.IE = &ipfix.InfoElement{Name: fmt.Sprintf("%d:%d", x.EnterpriseID, x.ID), EnterpriseID: x.EnterpriseID, ID: x.ID, Type: ipfix.OctetArray, Length: x.Length}
		fut = append(fut, x)
	}
	out = append(out, fwTemplate{"future exporter", fut, false, true})
	// Random subsets of v2.7 in random orders.
	for i := range 40 {
		names := slicesClone(agent("v2.7", 4+2*(i%2)))
		rng.Shuffle(len(names), func(a, b int) { names[a], names[b] = names[b], names[a] })
		var keep []string
		for _, n := range names {
			if rng.IntN(10) < 7 || strings.HasPrefix(n, "source") && strings.HasSuffix(n, "Address") {
				keep = append(keep, n)
			}
		}
		out = append(out, fwTemplate{fmt.Sprintf("random subset %d", i), fields(keep...), true, true})
	}
	return out
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

var (
	fwPodIPs = []string{"10.244.1.5", "10.244.2.7", "10.244.3.9", "fd00::5", "fd00::7", "fd00::9"}
	fwOther  = []string{"10.0.0.1", "0.0.0.0", "192.168.7.7", "fd00::1", "::", "2001:db8::1", "::ffff:10.244.1.5", "::ffff:10.9.9.9"}
	fwNames  = []string{"", "", "cart-1", "db-0", "web-2", "shop", "node-a", "node-b", "ESTABLISHED", "名前", strings.Repeat("x", 300)}
	fwEgress = []string{"", "", "10.1.2.3", "FD00::1", "fd00::1", "not-an-ip", "010.1.2.3", "::ffff:10.1.2.3"}
)

// fwStore knows Pods at the first addresses of fwPodIPs, one without
// labels, one on no Node.
func fwStore() enrich.Store {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ip := netip.MustParseAddr
	return enrich.NewStatic([]enrich.Pod{
		{Namespace: "shop", Name: "cart-1", NodeName: "node-a", Labels: map[string]string{"app": "cart", "tier": "web"},
			IPs: []netip.Addr{ip("10.244.1.5"), ip("fd00::5")}, Created: t0},
		{Namespace: "shop", Name: "db-0", NodeName: "node-b", IPs: []netip.Addr{ip("10.244.2.7"), ip("fd00::7")}, Created: t0},
		{Namespace: "ops", Name: "web-2", Labels: map[string]string{"app": strings.Repeat("w", 60)},
			IPs: []netip.Addr{ip("10.244.3.9"), ip("fd00::9")}, Created: t0},
	}, nil, nil)
}

// fwWrite writes a random record of t: values drawn so that Pods are
// often known, names often empty, and every kind of value appears.
func fwWrite(rng *rand.Rand, b ipfix.RecordBuilder, t *ipfix.Template) error {
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	for i := range t.Fields {
		f := &t.Fields[i]
		switch f.Type {
		case ipfix.Unsigned8, ipfix.Unsigned16, ipfix.Unsigned32, ipfix.Unsigned64:
			v := rng.Uint64()
			if f.IE.Name == "flowType" {
				v = uint64(rng.IntN(6))
			} else if f.Length < 8 {
				v &= 1<<(8*f.Length) - 1
			}
			b = b.Uint(v)
		case ipfix.IPv4Address, ipfix.IPv6Address:
			var a netip.Addr
			for !a.IsValid() || a.Is4() != (f.Type == ipfix.IPv4Address) {
				a = netip.MustParseAddr(pick(append(fwPodIPs, fwOther...)))
			}
			b = b.Addr(a)
		case ipfix.DateTimeSeconds:
			b = b.Time(time.Unix(1_767_000_000+rng.Int64N(1000), 0))
		case ipfix.DateTimeMilliseconds:
			b = b.Time(time.UnixMilli(1_767_000_000_000 + rng.Int64N(1_000_000)))
		case ipfix.String:
			if f.IE.Name == "egressIP" {
				b = b.String(pick(fwEgress))
			} else {
				b = b.String(pick(fwNames))
			}
		default:
			n := int(f.Length)
			if f.Variable() {
				n = rng.IntN(5)
			}
			v := make([]byte, n)
			for j := range v {
				v[j] = byte(rng.Uint32())
			}
			b = b.Bytes(v)
		}
	}
	return b.End()
}

// TestForwardMatchesProcess checks the fast path against the normal one:
// for every received template and option the fast path takes, each
// forwarded record is the same template and the same octets as the record
// normalized, enriched by Process and written by the Exporter.
func TestForwardMatchesProcess(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	templates := fwTemplates(t, rng)
	origins := []flow.Origin{
		{ObservationDomainID: 7, Exporter: netip.MustParseAddr("192.0.2.1")},
		{ObservationDomainID: 0xfeedbeef, Exporter: netip.MustParseAddr("2001:db8::9")},
		{ObservationDomainID: 1, Exporter: netip.MustParseAddr("::ffff:192.0.2.4")},
		{ObservationDomainID: 2},
	}
	compared := 0
	for _, pt := range []bool{true, false} {
		for _, labels := range []bool{true, false} {
			for _, cluster := range []string{"", "c-9"} {
				for _, st := range []enrich.Store{nil, fwStore()} {
					opts := proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: st, PodLabels: labels, ClusterID: cluster})}
					name := fmt.Sprintf("passThrough=%v labels=%v cluster=%q store=%v", pt, labels, cluster, st != nil)
					compared += fwCompare(t, name, rng, table, templates, origins, opts, pt)
				}
			}
		}
	}
	if compared < 50_000 {
		t.Errorf("only %d records compared", compared)
	}
}

func fwCompare(t *testing.T, name string, rng *rand.Rand, table *ipfixmap.Table, templates []fwTemplate,
	origins []flow.Origin, opts proxy.Options, passThrough bool) int {
	t.Helper()
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, passThrough, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	p := proxy.New(opts)
	fw, err := proxy.NewForwarding(p, table, ex)
	if err != nil || fw == nil {
		t.Fatalf("%s: NewForwarding: %v, %v", name, fw, err)
	}
	fwd := fw.NewForwarder()
	norm := ipfixmap.NewNormalizer(table)
	rb, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for ti, tt := range templates {
		tmpl, err := ipfix.NewTemplate(uint16(300+ti), tt.fields)
		if err != nil {
			t.Fatalf("%s: %s: %v", tt.name, name, err)
		}
		if err := enc.AddTemplate(1, tmpl); err != nil {
			t.Fatal(err)
		}
		for range 100 {
			if err := fwWrite(rng, enc.Begin(1, tmpl), tmpl); err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
		}
		if err := enc.Flush(); err != nil {
			t.Fatal(err)
		}
		wantFast := tt.fastNoPT
		if passThrough {
			wantFast = tt.fastPT
		}
		sess := ipfix.NewSession(ipfix.SessionOptions{})
		dec := ipfix.NewDecoder(sess)
		for _, m := range msgs {
			if err := dec.Reset(m, time.Now()); err != nil {
				t.Fatal(err)
			}
			for dec.Next() {
				r := dec.Record()
				o := origins[rng.IntN(len(origins))]
				_, got, ok := fwd.Forward(r, &o, nil, nil)
				// An IPv4-mapped address in an IPv6 field sends a record
				// the normal way (see fplan.v6).
				if want := wantFast && !mappedV6(r); ok != want {
					t.Fatalf("%s, %s: fast path %v, want %v", name, tt.name, ok, want)
				}
				if !ok {
					continue
				}
				if err := fwCheck(r, o, got, norm, p, ex, rb); err != nil {
					t.Fatalf("%s, %s: %v", name, tt.name, err)
				}
				compared++
			}
			if err := dec.Err(); err != nil {
				t.Fatal(err)
			}
		}
		msgs = msgs[:0]
	}
	return compared
}

// mappedV6 reports whether r has an IPv4-mapped address in an IPv6 field.
func mappedV6(r *ipfix.Record) bool {
	for i := range r.NumFields() {
		if r.Field(i).Type == ipfix.IPv6Address {
			if a, err := r.Addr(i); err == nil && a.Is4In6() {
				return true
			}
		}
	}
	return false
}

// fwCheck compares the fast path's record got with what the normal path
// makes of r.
func fwCheck(r *ipfix.Record, o flow.Origin, got []ipfix.EncodedRecord, norm *ipfixmap.Normalizer, p *proxy.Proxy,
	ex *ipfixmap.Exporter, rb *ipfix.Encoder) error {
	var f flow.Flow
	norm.Normalize(r, &f)
	f.Origin = o
	p.Process(&f)
	wt, _, err := ex.Template(&f)
	if err != nil {
		return err
	}
	want, err := rb.EncodeRecord(wt, func(b ipfix.RecordBuilder) error { return ex.Write(b, wt, &f) })
	if err != nil {
		return fmt.Errorf("the normal path fails: %w", err)
	}
	if len(got) != 1 || got[0].Template != wt || !bytes.Equal(got[0].Data, want) {
		return fmt.Errorf("the fast path differs:\nfast   %x (template %d)\nnormal %x (template %d)\nrecord %+v",
			got[0].Data, got[0].Template.ID, want, wt.ID, f)
	}
	return nil
}

// FuzzForward feeds the fast path whatever records a message decodes to:
// it must not panic, and what it forwards must be what the normal path
// makes of the record.
func FuzzForward(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 5))
	tt := fwTemplates(f, rng)
	for i, x := range tt[:12] {
		tmpl, err := ipfix.NewTemplate(uint16(256+i), x.fields)
		if err != nil {
			f.Fatal(err)
		}
		var msg []byte
		enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msg = append(msg, m...); return nil })
		if err != nil {
			f.Fatal(err)
		}
		if err := enc.AddTemplate(1, tmpl); err != nil {
			f.Fatal(err)
		}
		for range 2 {
			if err := fwWrite(rng, enc.Begin(1, tmpl), tmpl); err != nil {
				f.Fatal(err)
			}
		}
		if err := enc.Flush(); err != nil {
			f.Fatal(err)
		}
		f.Add(msg)
	}
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		f.Fatal(err)
	}
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
	if err != nil {
		f.Fatal(err)
	}
	p := proxy.New(proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: fwStore(), PodLabels: true, ClusterID: "c-9"})})
	fw, err := proxy.NewForwarding(p, table, ex)
	if err != nil {
		f.Fatal(err)
	}
	rb, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	if err != nil {
		f.Fatal(err)
	}
	o := flow.Origin{ObservationDomainID: 9, Exporter: netip.MustParseAddr("192.0.2.1")}
	f.Fuzz(func(t *testing.T, stream []byte) {
		fwd := fw.NewForwarder()
		norm := ipfixmap.NewNormalizer(table)
		dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
		// The stream is cut into messages by their length fields. Records
		// can be a single octet: at most a few hundred are checked, so
		// that an execution stays short.
		checked := 0
		for len(stream) >= 4 && checked < 300 {
			n := int(stream[2])<<8 | int(stream[3])
			if n < 4 || n > len(stream) {
				return
			}
			msg := stream[:n]
			stream = stream[n:]
			if dec.Reset(msg, time.Unix(1_767_000_000, 0)) != nil {
				return
			}
			for checked < 300 && dec.Next() {
				checked++
				r := dec.Record()
				_, got, ok := fwd.Forward(r, &o, nil, nil)
				if !ok {
					continue
				}
				if err := fwCheck(r, o, got, norm, p, ex, rb); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// TestForwardingNotWithUIDs: the fast path does not fill UIDs, so with
// them on there is none.
func TestForwardingNotWithUIDs(t *testing.T) {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, UIDs: true, Proxy: true}, true, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := proxy.NewForwarding(proxy.New(proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: fwStore(), UIDs: true})}), table, ex)
	if err != nil || fw != nil {
		t.Errorf("NewForwarding with UIDs: %v, %v; want none", fw, err)
	}
}

// TestFastPathMemoryDoesNotGrowWithConnections is the memory test of
// proxy_test.go for the fast path: a million distinct connections,
// decoded, forwarded into pooled arenas, through Forwarding.Run and a ring to a
// consumer that releases them; the heap afterwards holds only what the
// bounded ring retains.
func TestFastPathMemoryDoesNotGrowWithConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("a million records")
	}
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	p := proxy.New(proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: fwStore(), PodLabels: true, ClusterID: "c"})})
	fw, err := proxy.NewForwarding(p, table, ex)
	if err != nil {
		t.Fatal(err)
	}
	in := make(chan flow.Batch, 16)
	out := ring.New[ipfix.EncodedRecord](1024)
	c := out.Consumer()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fw.Run(context.Background(), in, out, func(err error) { t.Error(err) })
	}()
	consumed := make(chan int)
	go func() {
		n := 0
		var buf []ipfix.EncodedRecord
		for {
			var ok bool
			buf, ok = c.Next(context.Background(), buf[:0], 256)
			if !ok {
				break
			}
			for _, r := range buf {
				r.Arena.Release(1)
			}
			n += len(buf)
		}
		consumed <- n + int(c.Lost)
	}()
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	var msg []byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msg = append(msg[:0], m...); return nil })
	if err != nil {
		t.Fatal(err)
	}
	dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	enc.AddTemplate(1, tmpl)
	enc.Flush()
	if err := dec.Reset(msg, time.Now()); err != nil {
		t.Fatal(err)
	}
	for dec.Next() {
	}
	fwd := fw.NewForwarder()
	var pool ipfix.ArenaPool
	o := flow.Origin{ObservationDomainID: 1, Exporter: netip.MustParseAddr("192.0.2.1")}
	before := heapAlloc()
	const total = 1_000_000
	for i := 0; i < total; i += 100 {
		for j := range 100 {
			f := ipfixtest.SampleFlow(i + j)
			k := i + j
			f.Src = netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)})
			f.SrcPort = uint16(k)
			if err := ipfixtest.WriteAntreaV27(enc, 1, tmpl, f); err != nil {
				t.Fatal(err)
			}
		}
		enc.Flush()
		if err := dec.Reset(msg, time.Now()); err != nil {
			t.Fatal(err)
		}
		a := pool.Get(len(msg) * 2)
		var b flow.Batch
		for dec.Next() {
			var ok bool
			if a.Buf, b.Encoded, ok = fwd.Forward(dec.Record(), &o, a.Buf, b.Encoded); !ok {
				t.Fatal("a v2.7 record did not take the fast path")
			}
		}
		for r := range b.Encoded {
			b.Encoded[r].Arena = a
		}
		a.Hold(len(b.Encoded))
		in <- b
	}
	endMemoryRun(t, in, done, out.Close, consumed, before, total)
}

// TestForwardLongLengthPrefix: a short value whose length the exporter
// wrote in three octets (RFC 7011 §7 allows it) sends its record the
// normal way, which writes the prefix in one; a record without one is
// copied. Both give the same octets as the normal path.
func TestForwardLongLengthPrefix(t *testing.T) {
	reg := ipfix.DefaultRegistry()
	table, err := ipfixmap.NewTable(reg)
	if err != nil {
		t.Fatal(err)
	}
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	p := proxy.New(proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{ClusterID: "c-9"})})
	fw, err := proxy.NewForwarding(p, table, ex)
	if err != nil {
		t.Fatal(err)
	}
	fwd := fw.NewForwarder()
	rb, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
	// Template 256: sourceIPv4Address, tcpState, flowType.
	ip, _ := reg.ByName("sourceIPv4Address")
	st, _ := reg.ByName("tcpState")
	ft, _ := reg.ByName("flowType")
	tmpl, err := ipfix.TemplateOf(256, ip, st, ft)
	if err != nil {
		t.Fatal(err)
	}
	var tm []byte
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(b []byte) error { tm = append(tm, b...); return nil })
	enc.AddTemplate(1, tmpl)
	enc.Flush()
	// A message by hand: header, then a data set of two records, the
	// first with tcpState's 11 octets announced in three.
	m := []byte{0, 10, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1} // length set below
	data := []byte{1, 0, 0, 0}                                   // set 256, length set below
	data = append(data, 10, 244, 1, 5, 0xff, 0, 11)
	data = append(data, "ESTABLISHED"...)
	data = append(data, 2)
	data = append(data, 10, 244, 1, 6, 11)
	data = append(data, "ESTABLISHED"...)
	data = append(data, 2)
	data[3] = byte(len(data))
	m = append(m, data...)
	m[3] = byte(len(m))
	dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	for _, msg := range [][]byte{tm, m} {
		if err := dec.Reset(msg, time.Now()); err != nil {
			t.Fatal(err)
		}
		n := 0
		for dec.Next() {
			r := dec.Record()
			o := flow.Origin{ObservationDomainID: 1}
			_, got, ok := fwd.Forward(r, &o, nil, nil)
			if ok != (n == 1) {
				t.Errorf("record %d (long prefix: %v): fast path %v", n, n == 0, ok)
			}
			if ok {
				if err := fwCheck(r, o, got, ipfixmap.NewNormalizer(table), p, ex, rb); err != nil {
					t.Error(err)
				}
			}
			n++
		}
		if err := dec.Err(); err != nil {
			t.Fatal(err)
		}
		if len(msg) == len(m) && n != 2 {
			t.Fatalf("decoded %d records, want 2", n)
		}
	}
}

// TestForwardDirectionFromReceived checks the fast path's flowDirection on
// inter-Node halves whose other Pod the store knows: decided on the record
// as the exporter sent it (egress for the source Node's half, ingress for
// the destination Node's), as the reference does, not on the Pod filled in.
func TestForwardDirectionFromReceived(t *testing.T) {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	p := proxy.New(proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: fwStore()})})
	fw, err := proxy.NewForwarding(p, table, ex)
	if err != nil || fw == nil {
		t.Fatalf("NewForwarding: %v, %v", fw, err)
	}
	fwd := fw.NewForwarder()
	reg := ipfix.DefaultRegistry()
	var fields []ipfix.Field
	for _, n := range []string{"flowStartSeconds", "sourceIPv4Address", "destinationIPv4Address", "sourcePodNamespace",
		"sourcePodName", "destinationPodNamespace", "destinationPodName", "flowType"} {
		ie, ok := reg.ByName(n)
		if !ok {
			t.Fatalf("no element %s", n)
		}
		fields = append(fields, ipfix.Field{IE: ie})
	}
	tmpl, err := ipfix.NewTemplate(300, fields)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2025, 6, 1, 0, 0, 0, 0, time.UTC)
	src, dst := netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("10.244.2.7")
	for _, c := range []struct {
		name             string
		srcPod, dstPod   string
		want             uint8
		wantSrc, wantDst string
	}{
		{"source Node's half", "cart-1", "", flow.DirectionEgress, "cart-1", "db-0"},
		{"destination Node's half", "", "db-0", flow.DirectionIngress, "cart-1", "db-0"},
	} {
		var msg []byte
		enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msg = bytes.Clone(m); return nil })
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.AddTemplate(1, tmpl); err != nil {
			t.Fatal(err)
		}
		ns := func(pod string) string {
			if pod == "" {
				return ""
			}
			return "shop"
		}
		b := enc.Begin(1, tmpl).Time(start).Addr(src).Addr(dst).String(ns(c.srcPod)).String(c.srcPod).
			String(ns(c.dstPod)).String(c.dstPod).Uint(uint64(flow.FlowTypeInterNode))
		if err := b.End(); err != nil {
			t.Fatal(err)
		}
		if err := enc.Flush(); err != nil {
			t.Fatal(err)
		}
		dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
		if err := dec.Reset(msg, time.Now()); err != nil {
			t.Fatal(err)
		}
		if !dec.Next() {
			t.Fatalf("%s: no record decoded: %v", c.name, dec.Err())
		}
		o := flow.Origin{ObservationDomainID: 7, Exporter: netip.MustParseAddr("192.0.2.1")}
		_, got, ok := fwd.Forward(dec.Record(), &o, nil, nil)
		if !ok || len(got) != 1 {
			t.Fatalf("%s: the fast path did not take the record (%v, %d records)", c.name, ok, len(got))
		}
		out := decodeEncoded(t, got[0])
		if out["flowDirection"] != fmt.Sprint(c.want) {
			t.Errorf("%s: flowDirection %s, want %d", c.name, out["flowDirection"], c.want)
		}
		if out["sourcePodName"] != c.wantSrc || out["destinationPodName"] != c.wantDst {
			t.Errorf("%s: Pods %q → %q, want %q → %q", c.name, out["sourcePodName"], out["destinationPodName"], c.wantSrc, c.wantDst)
		}
	}
}

// decodeEncoded decodes one forwarded record into its values by element
// name (numbers and strings as text).
func decodeEncoded(t *testing.T, r ipfix.EncodedRecord) map[string]string {
	t.Helper()
	var msg []byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { msg = bytes.Clone(m); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(1, r.Template); err != nil {
		t.Fatal(err)
	}
	if err := enc.AddEncoded(1, r.Template, r.Data); err != nil {
		t.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	dec := ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
	if err := dec.Reset(msg, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !dec.Next() {
		t.Fatalf("forwarded record does not decode: %v", dec.Err())
	}
	rec := dec.Record()
	out := map[string]string{}
	for i := range rec.NumFields() {
		f := rec.Field(i)
		switch f.Type {
		case ipfix.String:
			s, _ := rec.String(i)
			out[f.IE.Name] = s
		case ipfix.Unsigned8, ipfix.Unsigned16, ipfix.Unsigned32, ipfix.Unsigned64:
			v, _ := rec.Uint(i)
			out[f.IE.Name] = fmt.Sprint(v)
		}
	}
	return out
}

// TestRunFlowRecordsInArenas: flow records (gRPC's) go through Run into
// arenas it reuses once the consumer has released their records. Records
// the consumer still holds keep their octets while later batches are
// written, and every record is what the normal path writes, octet for
// octet; records given back to the batch's pool are zeroed.
func TestRunFlowRecordsInArenas(t *testing.T) {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	newEx := func() *ipfixmap.Exporter {
		ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
		if err != nil {
			t.Fatal(err)
		}
		return ex
	}
	opts := proxy.Options{Enricher: enrich.NewEnricher(enrich.EnricherOptions{Store: fwStore(), ClusterID: "c"})}
	fw, err := proxy.NewForwarding(proxy.New(opts), table, newEx())
	if err != nil || fw == nil {
		t.Fatal(fw, err)
	}
	const batches, per = 200, 97 // enough to fill several arenas
	// What the normal path writes for each record.
	want := make([][]byte, 0, batches*per)
	{
		p, ex, enc := proxy.New(opts), newEx(), newRecordEncoder(t)
		for i := range batches * per {
			want = append(want, normalWrite(t, p, ex, enc, flowtest.Full(i, false)).Data)
		}
	}
	in := make(chan flow.Batch)
	out := ring.New[ipfix.EncodedRecord](batches * per)
	c := out.Consumer()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go fw.Run(ctx, in, out, func(err error) { t.Error(err) })
	pool := flow.NewPool()
	var held []ipfix.EncodedRecord
	got := 0
	check := func(r ipfix.EncodedRecord, i int) {
		if !bytes.Equal(r.Data, want[i]) {
			t.Fatalf("record %d: % x, want % x", i, r.Data, want[i])
		}
	}
	for bi := range batches {
		b := flow.Batch{Pool: pool}
		for j := range per {
			b.Flows = append(b.Flows, flowtest.Full(bi*per+j, false))
		}
		flows := slices.Clone(b.Flows)
		in <- b
		var recs []ipfix.EncodedRecord
		for len(recs) < per {
			var ok bool
			if recs, ok = c.Next(ctx, recs, per-len(recs)); !ok {
				t.Fatal("the buffer closed")
			}
		}
		for _, f := range flows {
			if f.SourceIP.IsValid() || f.SourcePodName != "" {
				t.Fatal("a written record was not given back to the pool (zeroed)")
			}
		}
		for j, r := range recs {
			check(r, got+j)
		}
		// Every third batch is held until the end; the others are
		// released at once, so that arenas are reused meanwhile.
		if bi%3 == 0 {
			held = append(held, recs...)
		} else {
			recs[0].Arena.Release(len(recs))
		}
		got += per
	}
	for k, r := range held {
		check(r, (k/per)*3*per+k%per)
	}
}
