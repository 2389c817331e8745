package ipfixmap_test

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"

	"sluice/flow"
	"sluice/flow/flowtest"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// TestBaseTemplateAgreesWithTemplate: BaseTemplate gives a record the
// template Template gives it exactly when that is its family's base
// template, and WriteBase writes it as Write does; a template that is not
// the base one of the record's family is refused. Other goroutines use
// BaseTemplate and WriteBase while Template makes pass-through templates
// (the race detector checks that they share nothing mutable).
func TestBaseTemplateAgreesWithTemplate(t *testing.T) {
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ip6 := func(f *flow.Flow) {
		f.SourceIP, f.DestinationIP = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	}
	noL7 := func(f *flow.Flow) {
		f.Present.Clear(flow.AppProtocolName)
		f.Present.Clear(flow.HTTPVals)
	}
	unknown := func(f *flow.Flow) {
		f.Unknown = []flow.Element{{EnterpriseID: 56506, ID: 990, Length: 2, Value: []byte{7, 7}}}
	}
	cases := []struct {
		name   string
		edit   []func(*flow.Flow)
		passed bool // something to pass through
	}{
		{"IPv4", []func(*flow.Flow){noL7}, false},
		{"IPv6", []func(*flow.Flow){noL7, ip6}, false},
		{"L7 elements", nil, true},
		{"an unknown element", []func(*flow.Flow){noL7, unknown}, true},
		{"IPv6 with an unknown element", []func(*flow.Flow){noL7, ip6, unknown}, true},
	}
	for _, passThrough := range []bool{true, false} {
		ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, passThrough, ipfix.MinDataSetID)
		if err != nil {
			t.Fatal(err)
		}
		enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
		for i, c := range cases {
			f := flowtest.Full(i, false)
			for _, e := range c.edit {
				e(f)
			}
			want, _, err := ex.Template(f)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := ex.BaseTemplate(f)
			isBase := want == ex.Base(4) || want == ex.Base(6)
			if ok != isBase || ok == (c.passed && passThrough) || ok && got != want {
				t.Fatalf("passThrough %v, %s: BaseTemplate %v (%v), Template %d (base: %v)", passThrough, c.name, got, ok, want.ID, isBase)
			}
			if !ok {
				continue
			}
			wantData, err := enc.EncodeRecord(want, func(b ipfix.RecordBuilder) error { return ex.Write(b, want, f) })
			if err != nil {
				t.Fatal(err)
			}
			wantData = bytes.Clone(wantData)
			gotData, err := enc.EncodeRecord(got, func(b ipfix.RecordBuilder) error { return ex.WriteBase(b, got, f) })
			if err != nil || !bytes.Equal(gotData, wantData) {
				t.Fatalf("passThrough %v, %s: WriteBase % x (%v), Write % x", passThrough, c.name, gotData, err, wantData)
			}
			other := ex.Base(4)
			if got == other {
				other = ex.Base(6)
			}
			if _, err := enc.EncodeRecord(other, func(b ipfix.RecordBuilder) error { return ex.WriteBase(b, other, f) }); err == nil {
				t.Fatalf("%s: WriteBase wrote it with the other family's template", c.name)
			}
		}
	}

	// Concurrent use: BaseTemplate and WriteBase on two goroutines while
	// Template makes a template for each new set of passed-through
	// elements.
	ex, err := ipfixmap.NewExporter(table, ipfixmap.ExportOptions{Names: true, Proxy: true}, true, ipfix.MinDataSetID)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 2 {
		wg.Go(func() {
			enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func([]byte) error { return nil })
			f := flowtest.Full(g, false)
			noL7(f)
			for {
				select {
				case <-stop:
					return
				default:
				}
				tm, ok := ex.BaseTemplate(f)
				if !ok {
					t.Error("a record with nothing to pass through has no base template")
					return
				}
				if _, err := enc.EncodeRecord(tm, func(b ipfix.RecordBuilder) error { return ex.WriteBase(b, tm, f) }); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for id := range uint16(200) {
		f := flowtest.Full(int(id), false)
		f.Unknown = []flow.Element{{EnterpriseID: 56506, ID: 1000 + id, Length: 1, Value: []byte{1}}}
		if _, isNew, err := ex.Template(f); err != nil || !isNew {
			t.Fatalf("template %d: new %v, %v", id, isNew, err)
		}
	}
	close(stop)
	wg.Wait()
}
