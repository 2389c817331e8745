package interop

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"sluice/ipfix"
)

// The floor of BenchmarkEncode: an encoder of exactly the IPv4 Antrea v2.7
// template and nothing else. It knows every field's length and type at
// compile time, so it checks nothing (no template, no types, no room) and
// appends straight to a slice. No encoder that takes a template at run
// time can do less work a record, so its time bounds the ratio to go-ipfix
// of any such encoder that writes from its own goroutine, over TCP in
// particular, where the kernel's share is the same for every encoder of
// the same octets.

// appendFloorRecord appends f as one data record of the IPv4 Antrea v2.7
// template.
func appendFloorRecord(p []byte, f *antreaFlow) []byte {
	be := binary.BigEndian
	p = be.AppendUint32(p, uint32(f.FlowStart.Unix()))
	p = be.AppendUint32(p, uint32(f.FlowEnd.Unix()))
	p = append(p, f.FlowEndReason)
	p = be.AppendUint16(p, f.SrcPort)
	p = be.AppendUint16(p, f.DstPort)
	p = append(p, f.Proto)
	p = be.AppendUint64(p, f.Packets)
	p = be.AppendUint64(p, f.Octets)
	p = be.AppendUint64(p, f.DeltaPackets)
	p = be.AppendUint64(p, f.DeltaOctets)
	p = appendFloorAddr(p, f.Src)
	p = appendFloorAddr(p, f.Dst)
	p = be.AppendUint64(p, f.RevPackets)
	p = be.AppendUint64(p, f.RevOctets)
	p = be.AppendUint64(p, f.RevDeltaPkts)
	p = be.AppendUint64(p, f.RevDeltaOct)
	p = ipfix.AppendVariable(p, f.SrcPod)
	p = ipfix.AppendVariable(p, f.SrcNamespace)
	p = ipfix.AppendVariable(p, f.SrcNode)
	p = ipfix.AppendVariable(p, f.DstPod)
	p = ipfix.AppendVariable(p, f.DstNamespace)
	p = ipfix.AppendVariable(p, f.DstNode)
	p = be.AppendUint16(p, f.DstSvcPort)
	p = ipfix.AppendVariable(p, f.DstSvcPortName)
	p = ipfix.AppendVariable(p, f.InPolicy)
	p = ipfix.AppendVariable(p, f.InPolicyNamespace)
	p = append(p, f.InPolicyType)
	p = ipfix.AppendVariable(p, f.InRule)
	p = append(p, f.InRuleAction)
	p = ipfix.AppendVariable(p, f.EgPolicy)
	p = ipfix.AppendVariable(p, f.EgPolicyNamespace)
	p = append(p, f.EgPolicyType)
	p = ipfix.AppendVariable(p, f.EgRule)
	p = append(p, f.EgRuleAction)
	p = ipfix.AppendVariable(p, f.TCPState)
	p = append(p, f.FlowType)
	p = ipfix.AppendVariable(p, f.EgressName)
	p = ipfix.AppendVariable(p, f.EgressIP)
	p = ipfix.AppendVariable(p, f.EgressNode)
	p = be.AppendUint16(p, f.ProxySnatPort)
	p = appendFloorAddr(p, f.ClusterIP)
	p = appendFloorAddr(p, f.ProxySnatIP)
	return appendFloorAddr(p, f.ServiceIP)
}

// appendFloorAddr appends an IPv4 address; the zero Addr is 0.0.0.0, as
// the encoder writes it.
func appendFloorAddr(p []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return append(p, 0, 0, 0, 0)
	}
	b := a.As4()
	return append(p, b[:]...)
}

// floorEncoder builds messages of at most max octets, one data set of
// template 256 each, from appendFloorRecord, and hands each to emit.
type floorEncoder struct {
	max     int
	buf     []byte // the open message, from its header; empty if none
	records uint32 // in the open message
	seq     uint32
	emit    func([]byte) error
}

func newFloorEncoder(max int, emit func([]byte) error) *floorEncoder {
	return &floorEncoder{max: max, buf: make([]byte, 0, 2*max), emit: emit}
}

const floorHeaderLen = 16 + 4 // message header and set header

func (e *floorEncoder) add(f *antreaFlow) error {
	if len(e.buf) == 0 {
		e.buf = append(e.buf, make([]byte, floorHeaderLen)...)
	}
	k := len(e.buf)
	e.buf = appendFloorRecord(e.buf, f)
	if len(e.buf) > e.max && k > floorHeaderLen {
		// The record does not fit: send the message without it, and
		// start the next one with it.
		if err := e.send(k); err != nil {
			return err
		}
		n := copy(e.buf[floorHeaderLen:], e.buf[k:])
		e.buf = e.buf[:floorHeaderLen+n]
	}
	e.records++
	return nil
}

// send emits the first n octets of buf as a message of e.records records.
func (e *floorEncoder) send(n int) error {
	m := e.buf[:n]
	be := binary.BigEndian
	be.PutUint16(m[0:], ipfix.Version)
	be.PutUint16(m[2:], uint16(n))
	be.PutUint32(m[4:], uint32(time.Now().Unix()))
	be.PutUint32(m[8:], e.seq)
	be.PutUint32(m[12:], interopDomain)
	be.PutUint16(m[16:], 256)
	be.PutUint16(m[18:], uint16(n-16))
	if err := e.emit(m); err != nil {
		return err
	}
	e.seq += e.records
	e.records = 0
	return nil
}

func (e *floorEncoder) flush() error {
	if len(e.buf) <= floorHeaderLen {
		return nil
	}
	err := e.send(len(e.buf))
	e.buf = e.buf[:0]
	return err
}

func encodeFloor(e *floorEncoder, flows []antreaFlow) error {
	for i := range flows {
		if err := e.add(&flows[i]); err != nil {
			return err
		}
	}
	return e.flush()
}

// TestFloorEncoderMatchesSluice checks that the floor writes the very
// records Sluice's encoder writes for the same flows, so that it is an
// encoder of the same output and its time a fair floor.
func TestFloorEncoderMatchesSluice(t *testing.T) {
	flows := sampleAntreaFlows(1000, false)
	flows[3].ServiceIP = netip.Addr{} // unset: written as 0.0.0.0
	var got, want []byte
	enc, tmpl := sluiceEncoder(t, benchMsgSize, func(m []byte) error {
		want = appendDataSets(t, want, m)
		return nil
	})
	if err := encodeSluice(enc, tmpl, flows); err != nil {
		t.Fatal(err)
	}
	messages := 0
	fe := newFloorEncoder(benchMsgSize, func(m []byte) error {
		messages++
		if len(m) > benchMsgSize {
			t.Errorf("floor message of %d octets", len(m))
		}
		got = appendDataSets(t, got, m)
		return nil
	})
	if err := encodeFloor(fe, flows); err != nil {
		t.Fatal(err)
	}
	if messages < 2 {
		t.Fatalf("%d floor messages: the test must cross a message boundary", messages)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("floor records (%d octets) differ from the encoder's (%d octets)", len(got), len(want))
	}
}

// appendDataSets appends the contents of m's data sets of template 256.
func appendDataSets(t *testing.T, out, m []byte) []byte {
	t.Helper()
	if len(m) < 16 || int(binary.BigEndian.Uint16(m[2:])) != len(m) {
		t.Fatalf("malformed message of %d octets", len(m))
	}
	for p := m[16:]; len(p) > 0; {
		if len(p) < 4 {
			t.Fatalf("truncated set header")
		}
		id, n := binary.BigEndian.Uint16(p), int(binary.BigEndian.Uint16(p[2:]))
		if n < 4 || n > len(p) {
			t.Fatalf("set of %d octets in %d", n, len(p))
		}
		if id == 256 {
			out = append(out, p[4:n]...)
		}
		p = p[n:]
	}
	return out
}
