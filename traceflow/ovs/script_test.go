package ovs

import (
	"context"
	"strings"
	"testing"

	"sluice/traceflow/corpus"
	"sluice/traceflow/datapath"
	"sluice/traceflow/pipeline"
)

func TestFlowTextNumbersTablesAndRespells(t *testing.T) {
	br := datapath.NewBridge("n", []string{"First", "Second", "Third"})
	tables := TablesOf(br)
	mac := datapath.MAC{0x0a, 0x58, 1, 2, 3, 4}
	for _, c := range []struct {
		flow *datapath.Flow
		want string
	}{
		{&datapath.Flow{Table: "First", Priority: 200, Match: datapath.Match{InPort: 3},
			Actions: []datapath.Action{datapath.SetEthDst{MAC: mac}, datapath.LoadReg{Reg: 1, Hi: 31, Value: 3}, datapath.GotoTable{Table: "Third"}}},
			"table=0, priority=200,in_port=3 actions=set_field:0a:58:01:02:03:04->eth_dst,set_field:0x3->reg1,goto_table:2"},
		{&datapath.Flow{Table: "Second", Priority: 190, Match: datapath.Match{EthType: datapath.EthIPv4},
			Actions: []datapath.Action{datapath.Ct{Zone: 65520, Table: "Third", NAT: true}}},
			"table=1, priority=190,ip actions=ct(table=2,zone=65520,nat)"},
		{&datapath.Flow{Table: "Third", Priority: 210, Actions: []datapath.Action{datapath.OutputInPort{}}},
			"table=2, priority=210 actions=in_port"},
	} {
		got, err := tables.FlowText(c.flow)
		if err != nil || got != c.want {
			t.Errorf("got %q (%v), want %q", got, err, c.want)
		}
	}
	if _, err := tables.FlowText(&datapath.Flow{Table: "First", Actions: []datapath.Action{datapath.GotoTable{Table: "Nowhere"}}}); err == nil {
		t.Error("an unknown table was numbered")
	}
	g, err := tables.GroupText(&datapath.Group{ID: 4, Buckets: [][]datapath.Action{{datapath.Resubmit{Table: "Second"}}}})
	if err != nil || !strings.Contains(g, "group_id=4,type=select,selection_method=hash,") || !strings.HasSuffix(g, "actions=resubmit(,1)") {
		t.Errorf("group %q (%v)", g, err)
	}
}

// TestScript checks the script's ports and that it carries every flow
// and group of the model (package ovscheck runs it in real OVS).
func TestScript(t *testing.T) {
	ctx := context.Background()
	c := &corpus.Case{}
	m, err := c.Model(ctx, "../testdata")
	if err != nil {
		t.Fatal(err)
	}
	nm := m.Nodes["k8s-node-1"]
	var b strings.Builder
	if err := Script(&b, nm, m.Config); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	for _, want := range []string{
		`"${P}tun0" type=geneve options:remote_ip=flow options:key=flow ofport_request=1`,
		`"${P}gw0" type=internal ofport_request=2`,
		`"${P}p3" type=internal ofport_request=3`, // default/client
		`"${P}p4" type=internal ofport_request=4`, // default/web
		"(Pod default/client) did not get OpenFlow port 3",
		"datapath_type=\"$DATAPATH_TYPE\"",
		"fail_mode=secure",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q", want)
		}
	}
	flows := between(s, "<<'SLUICE_FLOWS'\n", "SLUICE_FLOWS\n")
	groups := between(s, "<<'SLUICE_GROUPS'\n", "SLUICE_GROUPS\n")
	if n := strings.Count(flows, "\n"); n != len(nm.Bridge.Flows()) {
		t.Errorf("%d flows in the script, %d in the model", n, len(nm.Bridge.Flows()))
	}
	if n := strings.Count(groups, "\n"); n != len(nm.Bridge.Groups()) {
		t.Errorf("%d groups in the script, %d in the model", n, len(nm.Bridge.Groups()))
	}
	if strings.Contains(flows, "table=Output") || strings.Contains(flows, "mod_dl_") {
		t.Error("flows keep the model's table names or spellings")
	}
	// noEncap has no tunnel port.
	cfg := m.Config
	cfg.TrafficMode = pipeline.NoEncap
	var nb strings.Builder
	if err := Script(&nb, nm, cfg); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nb.String(), "tun0") {
		t.Error("a tunnel port in noEncap mode")
	}
}

func between(s, from, to string) string {
	_, rest, ok := strings.Cut(s, from)
	if !ok {
		return ""
	}
	body, _, _ := strings.Cut(rest, to)
	return body
}
