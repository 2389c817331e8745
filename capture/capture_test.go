package capture_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"sluice/capture"
	"sluice/ipfix"
	"sluice/ipfix/ipfixtest"
)

// antreaMessages encodes n Antrea-shaped records (template first) into
// messages of at most max octets.
func antreaMessages(t testing.TB, n, max int) [][]byte {
	t.Helper()
	tmpl, err := ipfixtest.Template(ipfix.DefaultRegistry(), 256, ipfixtest.AntreaV27IPv4())
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageSize: max}, func(m []byte) error {
		msgs = append(msgs, bytes.Clone(m))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AddTemplate(1, tmpl); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := ipfixtest.WriteAntreaV27(enc, 1, tmpl, ipfixtest.SampleFlow(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}
	return msgs
}

type frame struct {
	udp     bool
	seq     uint32
	syn     bool
	payload []byte
	dport   uint16
}

func frames(t testing.TB, fs []frame) [][]byte {
	var out [][]byte
	for _, f := range fs {
		eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, SrcIP: net.IP{10, 0, 0, 1}, DstIP: net.IP{10, 0, 0, 2}}
		dport := f.dport
		if dport == 0 {
			dport = 4739
		}
		var l4 gopacket.SerializableLayer
		if f.udp {
			ip.Protocol = layers.IPProtocolUDP
			u := &layers.UDP{SrcPort: 5000, DstPort: layers.UDPPort(dport)}
			u.SetNetworkLayerForChecksum(ip)
			l4 = u
		} else {
			ip.Protocol = layers.IPProtocolTCP
			tc := &layers.TCP{SrcPort: 5000, DstPort: layers.TCPPort(dport), Seq: f.seq, SYN: f.syn, ACK: !f.syn, Window: 1000}
			tc.SetNetworkLayerForChecksum(ip)
			l4 = tc
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, l4, gopacket.Payload(f.payload)); err != nil {
			t.Fatal(err)
		}
		out = append(out, bytes.Clone(buf.Bytes()))
	}
	return out
}

func pcapFile(t testing.TB, pkts [][]byte) []byte {
	var b bytes.Buffer
	w := pcapgo.NewWriter(&b)
	w.WriteFileHeader(65536, layers.LinkTypeEthernet)
	for i, p := range pkts {
		w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(int64(i), 0), CaptureLength: len(p), Length: len(p)}, p)
	}
	return b.Bytes()
}

func pcapngFile(t testing.TB, pkts [][]byte) []byte {
	var b bytes.Buffer
	w, err := pcapgo.NewNgWriter(&b, layers.LinkTypeEthernet)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pkts {
		if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(int64(i), 0), CaptureLength: len(p), Length: len(p)}, p); err != nil {
			t.Fatal(err)
		}
	}
	w.Flush()
	return b.Bytes()
}

// countRecords decodes every message per session and counts records.
func countRecords(t *testing.T, file []byte, port uint16) (int, []capture.Problem, error) {
	sessions := map[string]*ipfix.Decoder{}
	n := 0
	problems, err := capture.Read(bytes.NewReader(file), port, func(m capture.Message) error {
		d := sessions[m.Session]
		if d == nil {
			d = ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{}))
			sessions[m.Session] = d
		}
		if err := d.Reset(m.Data, time.Now()); err != nil {
			return err
		}
		for d.Next() {
			n++
		}
		return d.Err()
	})
	return n, problems, err
}

func TestUDPInPcapAndPcapng(t *testing.T) {
	msgs := antreaMessages(t, 40, 1400)
	var fs []frame
	for _, m := range msgs {
		fs = append(fs, frame{udp: true, payload: m})
	}
	fs = append(fs, frame{udp: true, payload: []byte("not ipfix"), dport: 53}) // other traffic is ignored
	pkts := frames(t, fs)
	for name, file := range map[string][]byte{"pcap": pcapFile(t, pkts), "pcapng": pcapngFile(t, pkts)} {
		n, problems, err := countRecords(t, file, 4739)
		if err != nil || len(problems) != 0 || n != 40 {
			t.Errorf("%s: %d records, %v, %v", name, n, problems, err)
		}
	}
}

func TestTCPReassembly(t *testing.T) {
	stream := bytes.Join(antreaMessages(t, 30, 1400), nil)
	isn := uint32(0xfffffff0) // the sequence space wraps inside the stream
	fs := []frame{{syn: true, seq: isn}}
	var segs []frame
	for off := 0; off < len(stream); off += 700 {
		end := min(off+700, len(stream))
		segs = append(segs, frame{seq: isn + 1 + uint32(off), payload: stream[off:end]})
	}
	// Out of order, with a duplicate.
	segs[1], segs[2] = segs[2], segs[1]
	segs = append(segs, segs[3])
	fs = append(fs, segs...)
	n, problems, err := countRecords(t, pcapFile(t, frames(t, fs)), 4739)
	if err != nil || len(problems) != 0 || n != 30 {
		t.Fatalf("%d records, %v, %v", n, problems, err)
	}

	// A missing segment: what comes before it is decoded, the gap is
	// reported.
	gappy := append([]frame{{syn: true, seq: isn}}, segs[0], segs[2], segs[5])
	n, problems, err = countRecords(t, pcapFile(t, frames(t, gappy)), 4739)
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0].Msg, "missing 2100 octets") || n == 0 || n >= 30 {
		t.Fatalf("gap: %d records, %v, %v", n, problems, err)
	}
}

func TestRawStreamAndErrors(t *testing.T) {
	stream := bytes.Join(antreaMessages(t, 10, 1400), nil)
	n, _, err := countRecords(t, stream, 0)
	if err != nil || n != 10 {
		t.Fatalf("raw: %d %v", n, err)
	}
	if _, _, err := countRecords(t, stream[:len(stream)-3], 0); !errors.Is(err, errUnexpectedEOF()) {
		t.Errorf("truncated raw stream: %v", err)
	}
	if _, _, err := countRecords(t, []byte("GIF89a"), 0); err == nil || !strings.Contains(err.Error(), "neither pcap") {
		t.Errorf("unknown format: %v", err)
	}
	if _, _, err := countRecords(t, nil, 0); err == nil {
		t.Error("empty file accepted")
	}
	// A pcap record claiming 1 GiB is refused without allocating it.
	file := pcapFile(t, nil)
	file = append(file, make([]byte, 16)...)
	file[24+8], file[24+9], file[24+10], file[24+11] = 0, 0, 0, 0x40
	_, problems, err := countRecords(t, file, 4739)
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0].Msg, "claims") {
		t.Errorf("huge record: %v %v", problems, err)
	}
}

func errUnexpectedEOF() error { return io.ErrUnexpectedEOF }

// FuzzRead feeds arbitrary files through format detection, the pcap and
// pcapng readers, TCP reassembly and the IPFIX decoder.
func FuzzRead(f *testing.F) {
	msgs := antreaMessages(f, 3, 1400)
	udp := frames(f, []frame{{udp: true, payload: msgs[0]}})
	f.Add(pcapFile(f, udp))
	f.Add(pcapngFile(f, udp))
	f.Add(bytes.Join(msgs, nil))
	f.Add(pcapFile(f, frames(f, []frame{{syn: true, seq: 1}, {seq: 2, payload: msgs[0][:40]}, {seq: 42, payload: msgs[0][40:]}})))
	f.Fuzz(func(t *testing.T, data []byte) {
		sessions := map[string]*ipfix.Decoder{}
		capture.Read(bytes.NewReader(data), 4739, func(m capture.Message) error {
			d := sessions[m.Session]
			if d == nil {
				d = ipfix.NewDecoder(ipfix.NewSession(ipfix.SessionOptions{MaxTemplates: 16}))
				sessions[m.Session] = d
			}
			if d.Reset(m.Data, time.Now()) == nil {
				for d.Next() {
					_ = d.Record().Bytes(0)
				}
			}
			return nil
		})
	})
}

func TestFragmentsAreReportedAndSYNDataKept(t *testing.T) {
	msgs := antreaMessages(t, 3, 1400)
	pkts := frames(t, []frame{{udp: true, payload: msgs[0]}})
	// Mark the datagram as a first fragment.
	frag := bytes.Clone(pkts[0])
	frag[14+6] |= 0x20 // IPv4 flags: more fragments (checksum is not checked)
	_, problems, err := countRecords(t, pcapFile(t, [][]byte{frag}), 4739)
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0].Msg, "fragment") {
		t.Fatalf("fragment: %v %v", problems, err)
	}
	// Data in the SYN (TCP Fast Open) belongs at the stream's start.
	stream := bytes.Join(msgs, nil)
	n, problems, err := countRecords(t, pcapFile(t, frames(t, []frame{
		{syn: true, seq: 100, payload: stream[:50]}, {seq: 151, payload: stream[50:]},
	})), 4739)
	if err != nil || len(problems) != 0 || n != 3 {
		t.Fatalf("SYN data: %d records, %v, %v", n, problems, err)
	}
}
