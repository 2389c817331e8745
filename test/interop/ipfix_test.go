package interop_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"sluice/ipfix"
)

// IANA element IDs used to read flow records.
const (
	ieOctetDeltaCount          = 1
	iePacketDeltaCount         = 2
	ieProtocolIdentifier       = 4
	ieSourceTransportPort      = 7
	ieSourceIPv4Address        = 8
	ieDestinationTransportPort = 11
	ieDestinationIPv4Address   = 12
	ieMeteringProcessID        = 143
	ieFlowStartMilliseconds    = 152
	ieFlowEndMilliseconds      = 153
)

// flowRecord is the part of an IPv4 flow record the tests compare.
type flowRecord struct {
	Key             flowKey
	Packets, Octets uint64
	Start, End      time.Time
}

func (r flowRecord) String() string {
	return fmt.Sprintf("%s:%d->%s:%d/%d %d pkts %d B [%s, %s]", r.Key.Src, r.Key.SrcPort, r.Key.Dst, r.Key.DstPort,
		r.Key.Proto, r.Packets, r.Octets, r.Start.Format("15:04:05.000"), r.End.Format("15:04:05.000"))
}

func (r flowRecord) equal(o flowRecord) bool {
	return r.Key == o.Key && r.Packets == o.Packets && r.Octets == o.Octets && r.Start.Equal(o.Start) && r.End.Equal(o.End)
}

// readFlowRecord reads the 5-tuple, counters and times of a data record.
// ok is false for a record whose template has no sourceIPv4Address (such
// as an options record).
func readFlowRecord(r *ipfix.Record) (rec flowRecord, ok bool, err error) {
	t := r.Template
	if t.Index(0, ieSourceIPv4Address) < 0 {
		return rec, false, nil
	}
	idx := func(id uint16) int {
		i := t.Index(0, id)
		if i < 0 && err == nil {
			err = fmt.Errorf("template %d has no element %d", t.ID, id)
		}
		return i
	}
	addr := func(id uint16) netip.Addr {
		a, e := r.Addr(idx(id))
		if e != nil && err == nil {
			err = e
		}
		return a
	}
	num := func(id uint16) uint64 {
		v, e := r.Uint(idx(id))
		if e != nil && err == nil {
			err = e
		}
		return v
	}
	tm := func(id uint16) time.Time {
		v, e := r.Time(idx(id))
		if e != nil && err == nil {
			err = e
		}
		return v
	}
	rec = flowRecord{
		Key: flowKey{
			Src: addr(ieSourceIPv4Address), Dst: addr(ieDestinationIPv4Address),
			SrcPort: uint16(num(ieSourceTransportPort)), DstPort: uint16(num(ieDestinationTransportPort)),
			Proto: uint8(num(ieProtocolIdentifier)),
		},
		Packets: num(iePacketDeltaCount), Octets: num(ieOctetDeltaCount),
		Start: tm(ieFlowStartMilliseconds), End: tm(ieFlowEndMilliseconds),
	}
	return rec, true, err
}

// setSummary lists the set IDs of a message, read from the set headers
// independently of the decoder.
func setSummary(msg []byte) ([]uint16, error) {
	if len(msg) < ipfix.HeaderLen {
		return nil, fmt.Errorf("message of %d octets", len(msg))
	}
	if n := int(binary.BigEndian.Uint16(msg[2:])); n != len(msg) {
		return nil, fmt.Errorf("header length %d, message %d octets", n, len(msg))
	}
	var ids []uint16
	for off := ipfix.HeaderLen; off < len(msg); {
		if len(msg)-off < 4 {
			return nil, fmt.Errorf("%d stray octets at %d", len(msg)-off, off)
		}
		id, n := binary.BigEndian.Uint16(msg[off:]), int(binary.BigEndian.Uint16(msg[off+2:]))
		if n < 4 || off+n > len(msg) {
			return nil, fmt.Errorf("set %d at %d has length %d", id, off, n)
		}
		ids = append(ids, id)
		off += n
	}
	return ids, nil
}

// decodedMessage is what the decoder made of one message.
type decodedMessage struct {
	seq     uint32 // header sequence number
	sets    []uint16
	records []flowRecord
	// other counts data records that are not flow records; meteringPID
	// is the meteringProcessId of the last options record, if any.
	other       int
	meteringPID uint64
}

// decodeMessage decodes one message with d and reads its flow records.
func decodeMessage(d *ipfix.Decoder, msg []byte, now time.Time) (decodedMessage, error) {
	var m decodedMessage
	sets, err := setSummary(msg)
	if err != nil {
		return m, err
	}
	m.sets = sets
	if err := d.Reset(msg, now); err != nil {
		return m, err
	}
	m.seq = d.Header().SequenceNumber
	for d.Next() {
		r := d.Record()
		rec, ok, err := readFlowRecord(r)
		if err != nil {
			return m, err
		}
		if ok {
			m.records = append(m.records, rec)
			continue
		}
		m.other++
		if r.Template.IsOptions() {
			if i := r.Template.Index(0, ieMeteringProcessID); i >= 0 && i < int(r.Template.ScopeFieldCount) {
				if m.meteringPID, err = r.Uint(i); err != nil {
					return m, err
				}
			}
		}
	}
	return m, d.Err()
}

func hasSet(ids []uint16, pred func(uint16) bool) bool {
	for _, id := range ids {
		if pred(id) {
			return true
		}
	}
	return false
}

func isTemplateSet(id uint16) bool {
	return id == ipfix.TemplateSetID || id == ipfix.OptionsTemplateSetID
}

func isDataSet(id uint16) bool { return id >= ipfix.MinDataSetID }
