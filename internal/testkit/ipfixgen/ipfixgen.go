// Package ipfixgen encodes flow records as an Antrea agent (v2.7 element
// set) would send them over IPFIX, for tests that play an exporter.
package ipfixgen

import (
	"testing"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/ipfix"
)

// Messages returns the IPFIX messages (template first) that carry flows
// in observation domain domain, as one byte stream.
func Messages(tb testing.TB, domain uint32, flows []flow.Flow) []byte {
	tb.Helper()
	table, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	names, err := ipfixmap.AgentElements("v2.7", 4)
	if err != nil {
		tb.Fatal(err)
	}
	els, err := table.Elements(names)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl, err := ipfixmap.TemplateOf(256, els)
	if err != nil {
		tb.Fatal(err)
	}
	var out []byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { out = append(out, m...); return nil })
	if err != nil {
		tb.Fatal(err)
	}
	enc.AddTemplate(domain, tmpl)
	for i := range flows {
		if err := ipfixmap.WriteRecord(enc.Begin(domain, tmpl), els, &flows[i]); err != nil {
			tb.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return out
}
