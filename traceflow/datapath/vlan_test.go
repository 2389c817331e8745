package datapath

import (
	"net/netip"
	"testing"
)

// TestVLANTag: a tagged packet serializes with an 802.1Q header and
// parses back with its VLAN ID and addresses; an untagged one has none.
func TestVLANTag(t *testing.T) {
	for _, vid := range []uint16{0, 20, 4094} {
		p := Packet{EthSrc: MAC{2, 0, 0, 0, 0, 1}, EthDst: MAC{2, 0, 0, 0, 0, 2}, Src: netip.MustParseAddr("172.20.0.17"),
			Dst: netip.MustParseAddr("10.10.2.7"), Proto: ProtoTCP, SrcPort: 1000, DstPort: 5432, TCPFlags: 2, TTL: 64, VLAN: vid}
		frame, err := p.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		tagged := frame[12] == 0x81 && frame[13] == 0x00
		if tagged != (vid != 0) {
			t.Errorf("VLAN %d: ethertype %x", vid, frame[12:14])
		}
		q, err := ParsePacket(frame)
		if err != nil {
			t.Fatal(err)
		}
		if q.VLAN != vid || q.Dst != p.Dst || q.DstPort != 5432 {
			t.Errorf("VLAN %d: parsed %+v", vid, q)
		}
	}
	if s := (PushVLAN{VID: 20}).String(); s != "push_vlan:0x8100,set_field:4116->vlan_vid" {
		t.Errorf("PushVLAN = %q", s)
	}
}
