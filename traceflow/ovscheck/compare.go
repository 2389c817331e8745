package ovscheck

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"sluice/traceflow/datapath"
	"sluice/traceflow/ovs"
)

// Compare lists every way OVS's trace (got) differs from the model's run
// of the same packet (want): the tables visited, the ports it left
// through, the packet-ins, the drop and its table, and the packet's
// fields where it left or was copied to the agent (addresses and ports
// after NAT, MACs, TTL, tunnel destination, packet mark, connection mark).
func Compare(tables ovs.Tables, want *datapath.Result, got *Result) []string {
	var diffs []string
	add := func(format string, a ...any) { diffs = append(diffs, fmt.Sprintf(format, a...)) }
	var wantTables []int
	for _, s := range want.Trail {
		wantTables = append(wantTables, tables[s.Table])
	}
	if !reflect.DeepEqual(wantTables, got.Tables) {
		add("tables visited: OVS %v, model %v", got.Tables, wantTables)
	}
	var wantOut []uint32
	for _, o := range want.Outputs {
		wantOut = append(wantOut, o.Port)
	}
	if !reflect.DeepEqual(wantOut, got.Outputs) {
		add("output ports: OVS %v, model %v", got.Outputs, wantOut)
	}
	var wantPI []PacketIn
	for _, p := range want.PacketIns {
		wantPI = append(wantPI, PacketIn{Category: p.Category, Table: tables[p.Table]})
	}
	if !reflect.DeepEqual(wantPI, got.PacketIns) {
		add("packet-ins (category, table): OVS %v, model %v", got.PacketIns, wantPI)
	}
	wantDrop := -1
	if want.Dropped {
		wantDrop = tables[want.DropTable]
	}
	if want.Dropped != got.Dropped || wantDrop != got.DropTable {
		add("drop: OVS %v in table %d, model %v in table %d", got.Dropped, got.DropTable, want.Dropped, wantDrop)
	}
	var pkt *datapath.Packet
	var md *datapath.Metadata
	switch {
	case len(want.PacketIns) > 0:
		pkt, md = &want.PacketIns[len(want.PacketIns)-1].Packet, &want.PacketIns[len(want.PacketIns)-1].Meta
	case len(want.Outputs) > 0:
		pkt, md = &want.Outputs[len(want.Outputs)-1].Packet, &want.Outputs[len(want.Outputs)-1].Meta
	default:
		return diffs // dropped: the model keeps no final packet
	}
	for k, v := range expectedFields(pkt, md) {
		g := got.Final[k]
		switch {
		case g == "" && (k == "pkt_mark" || k == "ct_mark"):
			g = "0x0" // OVS leaves out zero marks
		case g == "0.0.0.0" && k == "tun_dst":
			g = ""
		}
		if !sameValue(g, v) {
			add("final %s: OVS %q, model %q", k, g, v)
		}
	}
	return diffs
}

// expectedFields prints the model's packet the way OVS's final flow does.
func expectedFields(p *datapath.Packet, md *datapath.Metadata) map[string]string {
	f := map[string]string{
		"dl_src": p.EthSrc.String(),
		"dl_dst": p.EthDst.String(),
		"nw_ttl": strconv.Itoa(int(p.TTL)),
	}
	if p.IsV6() {
		f["ipv6_src"], f["ipv6_dst"] = p.Src.String(), p.Dst.String()
	} else {
		f["nw_src"], f["nw_dst"] = p.Src.String(), p.Dst.String()
	}
	if p.Proto == datapath.ProtoTCP || p.Proto == datapath.ProtoUDP || p.Proto == datapath.ProtoSCTP {
		f["tp_src"], f["tp_dst"] = strconv.Itoa(int(p.SrcPort)), strconv.Itoa(int(p.DstPort))
	}
	f["tun_dst"] = ""
	if md.TunDst.Is6() {
		f["tun_ipv6_dst"] = md.TunDst.String()
	} else if md.TunDst.IsValid() {
		f["tun_dst"] = md.TunDst.String()
	}
	f["pkt_mark"] = fmt.Sprintf("0x%x", md.PktMark)
	f["ct_mark"] = fmt.Sprintf("0x%x", md.CtMark)
	return f
}

// sameValue compares a printed field, allowing OVS's shortest spellings.
func sameValue(got, want string) bool {
	if got == want {
		return true
	}
	g, err1 := strconv.ParseUint(strings.TrimPrefix(got, "0x"), 16, 64)
	w, err2 := strconv.ParseUint(strings.TrimPrefix(want, "0x"), 16, 64)
	return strings.HasPrefix(got, "0x") && strings.HasPrefix(want, "0x") && err1 == nil && err2 == nil && g == w
}
