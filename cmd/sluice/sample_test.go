package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

var update = flag.Bool("update", false, "rewrite testdata/sample.pcap and its golden output")

const (
	samplePcap   = "../../testdata/sample.pcap"
	sampleGolden = "../../testdata/sample.jsonl"
)

// sampleMessages builds the IPFIX content of the sample capture: an Antrea
// v2.7-shaped exporter over UDP (template and data in one message, as
// softflowd does, then data alone), and an exporter over TCP whose template
// names an element no registry knows and whose messages straddle segments.
func sampleMessages(t *testing.T) (udp, tcp [][]byte) {
	reg := ipfix.DefaultRegistry()
	clock := func() time.Time { return time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC) }
	collect := func(dst *[][]byte) func([]byte) error {
		return func(m []byte) error { *dst = append(*dst, bytes.Clone(m)); return nil }
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: 1400, Now: clock}, collect(&udp))
	if err != nil {
		t.Fatal(err)
	}
	antrea, err := ipfixtest.Template(reg, 256, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(801257890, antrea); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := ipfixtest.WriteAntreaV27(enc, 801257890, antrea, ipfixtest.SampleFlow(i)); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			if err := enc.Flush(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}

	enc, err = ipfix.NewEncoder(ipfix.EncoderOptions{Now: clock}, collect(&tcp))
	if err != nil {
		t.Fatal(err)
	}
	future := &ipfix.InfoElement{Name: "futureElement", EnterpriseID: 99999, ID: 7, Type: ipfix.OctetArray, Length: 4}
	v6 := []ipfix.Field{
		{IE: reg.MustByName("sourceIPv6Address")}, {IE: reg.MustByName("destinationIPv6Address")},
		{IE: reg.MustByName("sourceTransportPort")}, {IE: reg.MustByName("destinationTransportPort")},
		{IE: reg.MustByName("protocolIdentifier")},
		{IE: reg.MustByName("octetDeltaCount"), Length: 4}, // reduced-size encoding
		{IE: reg.MustByName("flowStartMilliseconds")}, {IE: reg.MustByName("flowEndMilliseconds")},
		{IE: reg.MustByName("sourcePodName")}, {IE: future},
	}
	tmpl, err := ipfix.NewTemplate(300, v6)
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(1, tmpl); err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3 {
		err := enc.Begin(1, tmpl).
			Addr(netip.MustParseAddr("fd00:10:244:1::a")).Addr(netip.MustParseAddr("fd00:10:244:2::14")).
			Uint(uint64(40000 + i)).Uint(443).Uint(6).Uint(uint64(1500 * (i + 1))).
			Time(base.Add(time.Duration(i) * time.Second)).Time(base.Add(time.Duration(i)*time.Second + 250*time.Millisecond)).
			String("web-" + strings.Repeat("x", i)).Bytes([]byte{0xde, 0xad, 0xbe, byte(i)}).
			End()
		if err != nil {
			t.Fatal(err)
		}
		if err := enc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	return udp, tcp
}

func writeSamplePcap(t *testing.T, path string) {
	udp, tcp := sampleMessages(t)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	ts := time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)
	write := func(l4 gopacket.SerializableLayer, nl gopacket.NetworkLayer, payload []byte, v6 bool) {
		eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
		if v6 {
			eth.EthernetType = layers.EthernetTypeIPv6
		}
		buf := gopacket.NewSerializeBuffer()
		opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
		if err := gopacket.SerializeLayers(buf, opts, eth, nl.(gopacket.SerializableLayer), l4, gopacket.Payload(payload)); err != nil {
			t.Fatal(err)
		}
		ts = ts.Add(time.Millisecond)
		data := buf.Bytes()
		if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(data), Length: len(data)}, data); err != nil {
			t.Fatal(err)
		}
	}
	ip4 := func() *layers.IPv4 {
		return &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{10, 0, 0, 11}, DstIP: net.IP{10, 0, 0, 2}}
	}
	for _, m := range udp {
		ip := ip4()
		u := &layers.UDP{SrcPort: 40123, DstPort: 4739}
		_ = u.SetNetworkLayerForChecksum(ip)
		write(u, ip, m, false)
	}
	// The TCP stream, cut into segments that do not follow message
	// boundaries, with one segment retransmitted.
	stream := bytes.Join(tcp, nil)
	src, dst := net.ParseIP("fd00::21"), net.ParseIP("fd00::2")
	seq := uint32(1000)
	tcpSeg := func(seq uint32, flags string, payload []byte) {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP, SrcIP: src, DstIP: dst}
		tc := &layers.TCP{SrcPort: 51000, DstPort: 4739, Seq: seq, Window: 65535, SYN: flags == "S", ACK: flags != "S", PSH: len(payload) > 0}
		_ = tc.SetNetworkLayerForChecksum(ip)
		write(tc, ip, payload, true)
	}
	tcpSeg(seq, "S", nil)
	seq++
	for off := 0; off < len(stream); off += 50 {
		end := min(off+50, len(stream))
		tcpSeg(seq+uint32(off), "A", stream[off:end])
		if off == 100 {
			tcpSeg(seq+uint32(off), "A", stream[off:end])
		}
	}
}

// TestSampleCapture checks that the shipped sample decodes to its golden
// output, and that the sample is what this generator makes.
func TestSampleCapture(t *testing.T) {
	if *update {
		writeSamplePcap(t, samplePcap)
	}
	fresh := filepath.Join(t.TempDir(), "sample.pcap")
	writeSamplePcap(t, fresh)
	a, err := os.ReadFile(samplePcap)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(fresh)
	if !bytes.Equal(a, b) {
		t.Fatalf("%s differs from what the generator makes now; run go test ./cmd/sluice -run TestSampleCapture -update", samplePcap)
	}
	var out, errs bytes.Buffer
	if !decodeFiles(&out, &errs, []string{samplePcap}, 4739) {
		t.Fatalf("decode failed: %s", errs.String())
	}
	if errs.Len() != 0 {
		t.Fatalf("unexpected stderr: %s", errs.String())
	}
	if *update {
		if err := os.WriteFile(sampleGolden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile(sampleGolden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), golden) {
		t.Fatalf("output differs from %s:\n%s", sampleGolden, out.String())
	}
	// Independent of the golden file: 5 UDP and 3 TCP records, each line
	// valid JSON with the values the generator wrote.
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 8 {
		t.Fatalf("got %d records, want 8", len(lines))
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[7]), &rec); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"@template": 300.0, "@observationDomainId": 1.0, "sourceIPv6Address": "fd00:10:244:1::a",
		"octetDeltaCount": 4500.0, "sourcePodName": "web-xx", "99999:7": "deadbe02",
		"flowEndMilliseconds": "2026-01-01T00:00:02.25Z", "@exportTime": "2026-01-01T00:01:00Z",
	}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("%s = %v, want %v", k, rec[k], v)
		}
	}
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["sourcePodName"] != "client-0" || rec["sourceIPv4Address"] != "10.244.1.2" || rec["reverseOctetTotalCount"] != 90000.0 {
		t.Errorf("first record = %v", rec)
	}
}
