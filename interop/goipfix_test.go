package interop

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/exporter"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

const (
	interopRecords = 50
	interopDomain  = 42
)

// exportMode is how the go-ipfix exporter is driven.
type exportMode int

const (
	// buffered: BufferedIPFIXExporter with one reused record whose
	// values are overwritten per flow (what the Antrea agent does).
	buffered exportMode = iota
	// sendDataRecords: ExportingProcess.SendSet for the template and
	// SendDataRecords with one record object per flow.
	sendDataRecords
)

// exportWithGoIPFIX sends flows to addr with go-ipfix's exporter: the
// template, then the data records, then it closes the connection.
func exportWithGoIPFIX(t *testing.T, proto, addr string, ipv6 bool, mode exportMode, flows []antreaFlow) {
	t.Helper()
	in := exporter.ExporterInput{CollectorAddress: addr, CollectorProtocol: proto, ObservationDomainID: interopDomain}
	if proto == "udp" {
		in.PathMTU = 1500
	}
	ep, err := exporter.InitExportingProcess(in)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.CloseConnToCollector()

	tmplElems, err := goIPFIXElements(ipv6)
	if err != nil {
		t.Fatal(err)
	}
	tid := ep.NewTemplateID()
	switch mode {
	case buffered:
		bep := exporter.NewBufferedIPFIXExporter(ep)
		tmpl := entities.NewTemplateRecordFromElements(tid, tmplElems)
		if err := tmpl.PrepareRecord(); err != nil {
			t.Fatal(err)
		}
		if err := bep.AddRecord(tmpl); err != nil {
			t.Fatal(err)
		}
		elems, err := goIPFIXElements(ipv6)
		if err != nil {
			t.Fatal(err)
		}
		rec := entities.NewDataRecordFromElements(tid, elems)
		for i := range flows {
			setGoIPFIX(elems, &flows[i])
			if err := bep.AddRecord(rec); err != nil {
				t.Fatalf("record %d: %v", i, err)
			}
		}
		if err := bep.Flush(); err != nil {
			t.Fatal(err)
		}
	case sendDataRecords:
		set := entities.NewSet(false)
		if err := set.PrepareSet(entities.Template, entities.TemplateSetID); err != nil {
			t.Fatal(err)
		}
		if err := set.AddRecordV2(tmplElems, tid); err != nil {
			t.Fatal(err)
		}
		if _, err := ep.SendSet(set); err != nil {
			t.Fatal(err)
		}
		recs := make([]entities.Record, len(flows))
		for i := range flows {
			elems, err := goIPFIXElements(ipv6)
			if err != nil {
				t.Fatal(err)
			}
			setGoIPFIX(elems, &flows[i])
			recs[i] = entities.NewDataRecordFromElements(tid, elems)
		}
		n, _, err := ep.SendDataRecords(tid, recs, nil)
		if err != nil || n != len(recs) {
			t.Fatalf("SendDataRecords sent %d of %d records: %v", n, len(recs), err)
		}
	}
}

// checkTemplateFields checks that the decoded template announces the
// expected elements, in order, by enterprise number and element ID, at the
// lengths go-ipfix's registry gives them.
func checkTemplateFields(r *ipfix.Record, names []string) error {
	if r.NumFields() != len(names) {
		return fmt.Errorf("template %d has %d fields, want %d", r.Template.ID, r.NumFields(), len(names))
	}
	reg := ipfix.DefaultRegistry()
	for i, n := range names {
		ie := reg.MustByName(n)
		if idx := r.Template.Index(ie.EnterpriseID, ie.ID); idx != i {
			return fmt.Errorf("element %s (%d/%d) is at field %d, want %d", n, ie.EnterpriseID, ie.ID, idx, i)
		}
		f := r.Field(i)
		if f.Name() != n || f.IE != ie || f.Type != ie.Type {
			return fmt.Errorf("field %d resolves to %s of type %s, want %s of type %s", i, f.Name(), f.Type, n, ie.Type)
		}
		gie, err := goIPFIXLookup(reg, n)
		if err != nil {
			return err
		}
		if f.Length != gie.Len {
			return fmt.Errorf("field %d (%s) has length %d, go-ipfix's registry says %d", i, n, f.Length, gie.Len)
		}
	}
	return nil
}

// collected is what a Sluice collector decoded from one exporter.
type collected struct {
	values  [][]any
	seqOK   bool // every message's sequence number counted the records before it
	msgSeq  uint32
	domains map[uint32]bool
}

func (c *collected) add(d *ipfix.Decoder, names []string) error {
	// Every data message of these exporters holds records, so a new
	// sequence number marks the first record of a new message.
	if h := d.Header(); len(c.values) == 0 || h.SequenceNumber != c.msgSeq {
		c.msgSeq = h.SequenceNumber
		if h.SequenceNumber != uint32(len(c.values)) {
			c.seqOK = false
		}
	}
	r := d.Record()
	if err := checkTemplateFields(r, names); err != nil {
		return fmt.Errorf("record %d: %w", len(c.values), err)
	}
	vals, err := sluiceValues(r)
	if err != nil {
		return fmt.Errorf("record %d: %w", len(c.values), err)
	}
	c.values = append(c.values, vals)
	c.domains[d.Header().ObservationDomainID] = true
	return nil
}

func (c *collected) check(t *testing.T, names []string, flows []antreaFlow) {
	t.Helper()
	if len(c.values) != len(flows) {
		t.Errorf("decoded %d records, sent %d", len(c.values), len(flows))
	}
	if len(c.domains) != 1 || !c.domains[interopDomain] {
		t.Errorf("observation domains %v, want only %d", c.domains, interopDomain)
	}
	if !c.seqOK {
		t.Error("a message's sequence number did not count the data records sent before it")
	}
	bad := 0
	for i := range min(len(c.values), len(flows)) {
		for _, d := range diffValues(names, c.values[i], flows[i].values()) {
			if bad++; bad <= 20 {
				t.Errorf("record %d: %s", i, d)
			}
		}
	}
	if bad > 20 {
		t.Errorf("... %d differences in all", bad)
	}
}

// TestGoIPFIXExporterToSluice sends Antrea v2.7-shaped records with
// go-ipfix's exporter and decodes them with Sluice's codec, checking every
// field of every record against what was sent.
func TestGoIPFIXExporterToSluice(t *testing.T) {
	for _, tc := range []struct {
		proto string
		ipv6  bool
		mode  exportMode
	}{
		{"tcp", false, buffered},
		{"tcp", true, buffered},
		{"tcp", false, sendDataRecords},
		{"udp", false, buffered},
		{"udp", true, sendDataRecords},
	} {
		family := map[bool]string{false: "ipv4", true: "ipv6"}[tc.ipv6]
		mode := map[exportMode]string{buffered: "buffered", sendDataRecords: "senddatarecords"}[tc.mode]
		t.Run(tc.proto+"/"+family+"/"+mode, func(t *testing.T) {
			names := antreaNames(tc.ipv6)
			flows := sampleAntreaFlows(interopRecords, tc.ipv6)
			c := &collected{seqOK: true, domains: map[uint32]bool{}}
			if tc.proto == "tcp" {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				done := make(chan error, 1)
				go func() {
					done <- readTCP(ln, func(d *ipfix.Decoder) error { return c.add(d, names) })
				}()
				exportWithGoIPFIX(t, "tcp", ln.Addr().String(), tc.ipv6, tc.mode, flows)
				select {
				case err := <-done:
					if err != nil {
						t.Fatal(err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the Sluice collector did not see the end of the stream")
				}
			} else {
				pc, err := net.ListenPacket("udp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				defer pc.Close()
				done := make(chan error, 1)
				go func() { done <- readUDP(pc, len(flows), c, names) }()
				exportWithGoIPFIX(t, "udp", pc.LocalAddr().String(), tc.ipv6, tc.mode, flows)
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			c.check(t, names, flows)
		})
	}
}

// readUDP decodes datagrams from pc with Sluice until want records have
// arrived, as a UDP collector would: one session per exporter address,
// templates with the UDP lifetime.
func readUDP(pc net.PacketConn, want int, c *collected, names []string) error {
	if err := pc.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	sessions := map[string]*ipfix.Decoder{}
	buf := make([]byte, ipfix.MaxMessageLen)
	for len(c.values) < want {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("after %d records: %w", len(c.values), err)
		}
		d := sessions[from.String()]
		if d == nil {
			d = ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{TemplateTTL: ipfix.DefaultUDPTemplateTTL}))
			sessions[from.String()] = d
		}
		if err := d.Reset(buf[:n], time.Now()); err != nil {
			return err
		}
		for d.Next() {
			if err := c.add(d, names); err != nil {
				return err
			}
		}
		if err := d.Err(); err != nil {
			return err
		}
	}
	if len(sessions) != 1 {
		return fmt.Errorf("datagrams came from %d addresses, want 1", len(sessions))
	}
	return nil
}

// TestMain silences go-ipfix's logging before any test creates one of its
// processes.
func TestMain(m *testing.M) {
	loadGoIPFIXRegistry()
	os.Exit(m.Run())
}

// TestDiffValuesDetectsMismatch is the negative control of the interop
// checks: a record that differs from what was sent in any one field, or
// in the type or family of a value, must be reported.
func TestDiffValuesDetectsMismatch(t *testing.T) {
	names := antreaNames(false)
	f := sampleAntreaFlow(5, false)
	if d := diffValues(names, f.values(), f.values()); len(d) != 0 {
		t.Fatalf("identical records differ: %v", d)
	}
	for _, tc := range []struct {
		field int
		value any
	}{
		{0, f.FlowStart.Add(time.Second)},          // timestamp
		{2, uint64(f.FlowEndReason) + 1},           // u8 enum
		{7, f.Octets - 1},                          // counter
		{10, netip.AddrFrom16(f.Src.As16())},       // same address, other family
		{16, f.SrcPod + "x"},                       // string
		{41, netip.AddrFrom4([4]byte{0, 0, 0, 1})}, // zero address
		{22, uint16(f.DstSvcPort)},                 // right value, wrong Go type
	} {
		got := f.values()
		got[tc.field] = tc.value
		d := diffValues(names, got, f.values())
		if len(d) != 1 || !strings.HasPrefix(d[0], names[tc.field]+":") {
			t.Errorf("changing %s to %#v: differences %q, want exactly one on that field", names[tc.field], tc.value, d)
		}
	}
	if d := diffValues(names, f.values()[1:], f.values()); len(d) == 0 {
		t.Error("a record with a missing field was not reported")
	}
}

// sluiceMessages encodes flows with Sluice's encoder: the template alone in
// the first message, then data messages of at most maxSize octets. Each
// data message holds one data set: go-ipfix's collector reads only the
// first set of a message.
func sluiceMessages(tb testing.TB, flows []antreaFlow, ipv6 bool, maxSize int) (tmpl []byte, data [][]byte) {
	tb.Helper()
	t, err := ipfixtest.Template(ipfix.DefaultRegistry(), 256, antreaNames(ipv6))
	if err != nil {
		tb.Fatal(err)
	}
	var msgs [][]byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: maxSize},
		func(m []byte) error { msgs = append(msgs, bytes.Clone(m)); return nil })
	if err != nil {
		tb.Fatal(err)
	}
	if err := enc.AddTemplate(interopDomain, t); err != nil {
		tb.Fatal(err)
	}
	if err := enc.Flush(); err != nil {
		tb.Fatal(err)
	}
	for i := range flows {
		if err := writeSluice(enc, interopDomain, t, &flows[i]); err != nil {
			tb.Fatalf("flow %d: %v", i, err)
		}
	}
	if err := enc.Flush(); err != nil {
		tb.Fatal(err)
	}
	return msgs[0], msgs[1:]
}

// TestSluiceEncoderToGoIPFIX is the other direction: records encoded by
// Sluice, decoded by go-ipfix's collecting process, every field checked.
func TestSluiceEncoderToGoIPFIX(t *testing.T) {
	for _, tc := range []struct {
		proto   string
		ipv6    bool
		maxSize int
	}{
		{"tcp", false, ipfix.MaxMessageLen},
		{"tcp", true, 1400},
		{"udp", false, 1400},
	} {
		family := map[bool]string{false: "ipv4", true: "ipv6"}[tc.ipv6]
		t.Run(tc.proto+"/"+family, func(t *testing.T) {
			names := antreaNames(tc.ipv6)
			flows := sampleAntreaFlows(interopRecords, tc.ipv6)
			tmpl, data := sluiceMessages(t, flows, tc.ipv6, tc.maxSize)
			cp := startGoIPFIXCollector(t, tc.proto)
			conn, err := net.Dial(tc.proto, cp.GetAddress().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			go func() {
				for _, m := range append([][]byte{tmpl}, data...) {
					if _, err := conn.Write(m); err != nil {
						return
					}
				}
			}()
			var got [][]any
			templates := 0
			timeout := time.After(10 * time.Second)
			for len(got) < len(flows) {
				select {
				case msg := <-cp.GetMsgChan():
					if msg.GetObsDomainID() != interopDomain {
						t.Fatalf("observation domain %d", msg.GetObsDomainID())
					}
					set := msg.GetSet()
					if set.GetSetType() == entities.Template {
						templates++
						continue
					}
					for _, rec := range set.GetRecords() {
						for i, e := range rec.GetOrderedElementList() {
							if i < len(names) && e.GetName() != names[i] {
								t.Fatalf("record %d element %d is %s, want %s", len(got), i, e.GetName(), names[i])
							}
						}
						vals, err := goIPFIXValues(rec)
						if err != nil {
							t.Fatalf("record %d: %v", len(got), err)
						}
						got = append(got, vals)
					}
				case <-timeout:
					t.Fatalf("go-ipfix decoded %d of %d records", len(got), len(flows))
				}
			}
			if templates != 1 {
				t.Errorf("go-ipfix saw %d template sets, want 1", templates)
			}
			for i := range flows {
				for _, d := range diffValues(names, got[i], flows[i].values()) {
					t.Errorf("record %d: %s", i, d)
				}
			}
		})
	}
}
