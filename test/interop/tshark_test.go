package interop_test

import (
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// writeUDPPcap writes each payload as an Ethernet/IPv4/UDP frame from
// 10.0.0.1:40000 to 10.0.0.2:port, one millisecond apart.
func writeUDPPcap(t testing.TB, path string, port int, payloads [][]byte) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	for i, p := range payloads {
		ip := &layers.IPv4{
			Version: 4, IHL: 5, TTL: 64, Id: uint16(i + 1), Protocol: layers.IPProtocolUDP,
			SrcIP: []byte{10, 0, 0, 1}, DstIP: []byte{10, 0, 0, 2},
		}
		udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(port)}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		eth := &layers.Ethernet{SrcMAC: clientMAC, DstMAC: serverMAC, EthernetType: layers.EthernetTypeIPv4}
		buf := gopacket.NewSerializeBuffer()
		opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
		if err := gopacket.SerializeLayers(buf, opts, eth, ip, udp, gopacket.Payload(p)); err != nil {
			t.Fatal(err)
		}
		ci := gopacket.CaptureInfo{Timestamp: exportTime.Add(time.Duration(i) * time.Millisecond),
			CaptureLength: len(buf.Bytes()), Length: len(buf.Bytes())}
		if err := w.WritePacket(ci, buf.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// tsharkFields are the flow fields read from tshark, in this order.
var tsharkFields = []string{
	"cflow.srcaddr", "cflow.dstaddr", "cflow.srcport", "cflow.dstport", "cflow.protocol",
	"cflow.octets", "cflow.packets", "cflow.abstimestart", "cflow.abstimeend",
}

// tsharkTimeLayout is how tshark prints an absolute time with TZ=UTC.
const tsharkTimeLayout = "Jan _2, 2006 15:04:05.000000000 MST"

// parseTsharkFields reads "-T fields" output (frame number, then
// tsharkFields, each with every occurrence joined by ';') into one list
// of flow records per frame.
func parseTsharkFields(out string) (map[int][]flowRecord, error) {
	frames := map[int][]flowRecord{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		cols := strings.Split(line, "\t")
		if len(cols) != 1+len(tsharkFields) {
			return nil, fmt.Errorf("line %q: %d columns, want %d", line, len(cols), 1+len(tsharkFields))
		}
		frame, err := strconv.Atoi(cols[0])
		if err != nil {
			return nil, fmt.Errorf("line %q: %v", line, err)
		}
		if cols[1] == "" {
			frames[frame] = nil // no flow records (a template-only frame)
			continue
		}
		vals := make([][]string, len(tsharkFields))
		for i := range tsharkFields {
			vals[i] = strings.Split(cols[1+i], ";")
			if len(vals[i]) != len(vals[0]) {
				return nil, fmt.Errorf("frame %d: %d values of %s but %d of %s", frame, len(vals[i]), tsharkFields[i], len(vals[0]), tsharkFields[0])
			}
		}
		for j := range vals[0] {
			var r flowRecord
			var errs []error
			addr := func(s string) netip.Addr { a, err := netip.ParseAddr(s); errs = append(errs, err); return a }
			num := func(s string, bits int) uint64 {
				v, err := strconv.ParseUint(s, 10, bits)
				errs = append(errs, err)
				return v
			}
			tm := func(s string) time.Time {
				v, err := time.Parse(tsharkTimeLayout, s)
				errs = append(errs, err)
				return v
			}
			r.Key = flowKey{
				Src: addr(vals[0][j]), Dst: addr(vals[1][j]),
				SrcPort: uint16(num(vals[2][j], 16)), DstPort: uint16(num(vals[3][j], 16)), Proto: uint8(num(vals[4][j], 8)),
			}
			r.Octets, r.Packets = num(vals[5][j], 64), num(vals[6][j], 64)
			r.Start, r.End = tm(vals[7][j]), tm(vals[8][j])
			if err := errors.Join(errs...); err != nil {
				return nil, fmt.Errorf("frame %d record %d: %w", frame, j, err)
			}
			frames[frame] = append(frames[frame], r)
		}
	}
	return frames, nil
}

// pdmlField is a field of tshark's PDML output.
type pdmlField struct {
	Name     string      `xml:"name,attr"`
	Show     string      `xml:"show,attr"`
	ShowName string      `xml:"showname,attr"`
	Value    string      `xml:"value,attr"`
	Fields   []pdmlField `xml:"field"`
}

type pdmlPacket struct {
	Protos []pdmlField `xml:"proto"`
}

// walk calls fn on f and every field below it.
func (f *pdmlField) walk(fn func(*pdmlField)) {
	fn(f)
	for i := range f.Fields {
		f.Fields[i].walk(fn)
	}
}

// pdmlFlow is what tshark dissected of one flow record: its source
// address, its Antrea enterprise elements by element ID, and every named
// field below it (each occurrence's shown value, in order).
type pdmlFlow struct {
	src    string
	antrea map[int]string
	fields map[string][]string
}

var antreaEntry = regexp.MustCompile(`^Enterprise Private entry: \(Project Antrea\) Type (\d+):`)

// expertWarning is the lowest expert severity treated as a problem
// (PI_WARN in epan/proto.h); PI_CHAT and PI_NOTE are informational.
const expertWarning = 0x00600000

// parsePDML returns, per frame, the flow records tshark dissected, and an
// error for any malformed packet or expert warning.
func parsePDML(out string) ([][]pdmlFlow, error) {
	dec := xml.NewDecoder(strings.NewReader(out))
	var frames [][]pdmlFlow
	var problems []error
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Local != "packet" {
			continue
		}
		var p pdmlPacket
		if err := dec.DecodeElement(&p, &se); err != nil {
			return nil, err
		}
		frame := len(frames) + 1
		var flows []pdmlFlow
		for i := range p.Protos {
			p.Protos[i].walk(func(f *pdmlField) {
				switch {
				case strings.HasPrefix(f.Name, "_ws.malformed"):
					problems = append(problems, fmt.Errorf("frame %d: malformed: %s", frame, f.ShowName))
				case f.Name == "_ws.expert":
					var sev uint64
					var msg string
					for _, c := range f.Fields {
						switch c.Name {
						case "_ws.expert.severity":
							sev, _ = strconv.ParseUint(c.Show, 0, 32)
						case "_ws.expert.message":
							msg = c.Show
						}
					}
					if sev >= expertWarning {
						problems = append(problems, fmt.Errorf("frame %d: expert info (severity %#x): %s", frame, sev, msg))
					}
				case f.Name == "" && strings.HasPrefix(f.Show, "Flow "):
					fl := pdmlFlow{antrea: map[int]string{}, fields: map[string][]string{}}
					for i := range f.Fields {
						f.Fields[i].walk(func(x *pdmlField) {
							if x.Name != "" {
								fl.fields[x.Name] = append(fl.fields[x.Name], x.Show)
							}
						})
					}
					for _, c := range f.Fields {
						if c.Name == "cflow.srcaddr" {
							fl.src = c.Show
						}
						if m := antreaEntry.FindStringSubmatch(c.ShowName); m != nil && c.Name == "cflow.enterprise_private_entry" {
							id, _ := strconv.Atoi(m[1])
							v, err := hex.DecodeString(c.Value)
							if err != nil {
								problems = append(problems, fmt.Errorf("frame %d: value %q: %v", frame, c.Value, err))
							}
							fl.antrea[id] = string(v)
						}
					}
					flows = append(flows, fl)
				}
			})
		}
		frames = append(frames, flows)
	}
	return frames, errors.Join(problems...)
}

func TestEncoderToTshark(t *testing.T) {
	tshark := requirePeer(t, "tshark")
	ctx := testContext(t, 60*time.Second)
	flows := sampleFlows()
	msgs := encodeFlows(t, flows)
	// The template and the first half of the flows are in frame 1, the
	// rest in frame 2.
	wantFrames := map[int][]antreaFlow{1: flows[:len(flows)/2], 2: flows[len(flows)/2:]}

	const port = 4739
	pcap := filepath.Join(t.TempDir(), "ipfix.pcap")
	writeUDPPcap(t, pcap, port, msgs)
	env := []string{"TZ=UTC", "LC_ALL=C"}
	decodeAs := fmt.Sprintf("udp.port==%d,cflow", port)

	// The fields of the 5-tuple, counters and times.
	args := []string{"-r", pcap, "-d", decodeAs, "-T", "fields",
		"-E", "header=n", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=;", "-e", "frame.number"}
	for _, f := range tsharkFields {
		args = append(args, "-e", f)
	}
	out, err := run(ctx, env, tshark, args...)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseTsharkFields(out)
	if err != nil {
		t.Fatalf("%v\ntshark output:\n%s", err, out)
	}
	if len(got) != len(wantFrames) {
		t.Errorf("tshark read %d frames, want %d:\n%s", len(got), len(wantFrames), out)
	}
	for frame, want := range wantFrames {
		recs := got[frame]
		if len(recs) != len(want) {
			t.Errorf("frame %d: tshark dissected %d flow records, want %d:\n%s", frame, len(recs), len(want), out)
			continue
		}
		for i, r := range recs {
			if !r.equal(want[i].flowRecord) {
				t.Errorf("frame %d record %d: tshark read %v, want %v", frame, i, r, want[i].flowRecord)
			}
		}
	}

	// The whole dissection: Antrea strings by element ID, and no
	// malformed packet or expert warning anywhere.
	out, err = run(ctx, env, tshark, "-r", pcap, "-d", decodeAs, "-T", "pdml")
	if err != nil {
		t.Fatal(err)
	}
	pdml, err := parsePDML(out)
	if err != nil {
		t.Error(err)
	}
	if len(pdml) != len(wantFrames) {
		t.Fatalf("PDML has %d frames, want %d", len(pdml), len(wantFrames))
	}
	for i, fl := range pdml {
		want := wantFrames[i+1]
		if len(fl) != len(want) {
			t.Errorf("frame %d: PDML has %d flows, want %d", i+1, len(fl), len(want))
			continue
		}
		for j, f := range fl {
			w := want[j]
			if f.src != w.Key.Src.String() {
				t.Errorf("frame %d flow %d: source %s, want %s", i+1, j, f.src, w.Key.Src)
			}
			// tshark shows no entry at all for an empty string value, so
			// a missing entry reads as "".
			for id, v := range map[int]string{101: w.SrcPod, 100: w.SrcNamespace, 103: w.DstPod} {
				if f.antrea[id] != v {
					t.Errorf("frame %d flow %d: Antrea element %d is %q, want %q", i+1, j, id, f.antrea[id], v)
				}
			}
			if len(f.antrea) > 3 {
				t.Errorf("frame %d flow %d: unexpected Antrea elements %v", i+1, j, f.antrea)
			}
		}
	}
}
