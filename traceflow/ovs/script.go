// Package ovs turns one Node's modelled bridge into what a real Open
// vSwitch loads: flows and groups in ovs-ofctl syntax with numbered tables,
// and a shell script of ovs-vsctl and ovs-ofctl commands that builds the
// bridge, its ports (with the modelled OpenFlow port numbers), groups and
// flows.
package ovs

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sluice/traceflow/datapath"
	"sluice/traceflow/pipeline"
)

// Tables numbers a bridge's tables as the script does: their index in
// pipeline order.
type Tables map[string]int

// TablesOf returns the numbering of br's tables.
func TablesOf(br *datapath.Bridge) Tables {
	t := Tables{}
	for i, name := range br.Tables() {
		t[name] = i
	}
	return t
}

// Name returns the table with number id ("" if none).
func (t Tables) Name(id int) string {
	for n, i := range t {
		if i == id {
			return n
		}
	}
	return ""
}

// tableRef finds every place a table name appears in a printed flow or
// group: the flow's own table, goto_table, resubmit and ct(table=).
var tableRef = regexp.MustCompile(`(table=|goto_table:|resubmit\(,)([A-Za-z][A-Za-z0-9]*)`)

func (t Tables) number(s string) (string, error) {
	var bad string
	out := tableRef.ReplaceAllStringFunc(s, func(m string) string {
		sub := tableRef.FindStringSubmatch(m)
		id, ok := t[sub[2]]
		if !ok {
			bad = sub[2]
			return m
		}
		return sub[1] + strconv.Itoa(id)
	})
	if bad != "" {
		return "", fmt.Errorf("unknown table %q in %s", bad, s)
	}
	return out, nil
}

// ofSpelling rewrites the model's action spellings into the ones
// ovs-ofctl prints back under OpenFlow 1.5 (set_field for MAC and whole
// register writes, in_port for the hairpin output), so that a bridge
// loaded from the script dumps (and diff-flows compares) flow for flow.
var ofSpelling = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`mod_dl_src:([0-9a-f:]{17})`), "set_field:${1}->eth_src"},
	{regexp.MustCompile(`mod_dl_dst:([0-9a-f:]{17})`), "set_field:${1}->eth_dst"},
	{regexp.MustCompile(`load:(0x[0-9a-f]+)->NXM_NX_REG([0-9]+)\[\]`), "set_field:${1}->reg${2}"},
	{regexp.MustCompile(`\bIN_PORT\b`), "in_port"},
}

func respell(s string) string {
	for _, r := range ofSpelling {
		s = r.re.ReplaceAllString(s, r.with)
	}
	return s
}

// FlowText prints a flow for ovs-ofctl add-flows.
func (t Tables) FlowText(f *datapath.Flow) (string, error) {
	s, err := t.number(f.String())
	if err != nil {
		return "", err
	}
	return respell(s), nil
}

// GroupText prints a group for ovs-ofctl add-groups. The selection hashes
// the packet's 5-tuple in the OpenFlow layer (selection_method=hash):
// OVS's default for select groups hashes in the datapath (dp_hash), which
// ofproto/trace cannot follow into a bucket.
func (t Tables) GroupText(g *datapath.Group) (string, error) {
	s, err := t.number(g.String())
	if err != nil {
		return "", err
	}
	s = respell(s)
	return strings.Replace(s, ",type=select", ",type=select,selection_method=hash,fields(ip_src,ip_dst,ipv6_src,ipv6_dst,nw_proto,tcp_src,tcp_dst,udp_src,udp_dst)", 1), nil
}

// Port is one port of the script's bridge.
type Port struct {
	OFPort uint32
	Name   string // interface name, without the script's prefix
	Type   string // internal, geneve, vxlan
	About  string // what it is, for a comment
}

// Ports lists the bridge's ports: the tunnel (in modes that encapsulate),
// the gateway, the uplink and host interface (BridgingMode) and one per
// local Pod.
func Ports(nm *pipeline.NodeModel, cfg pipeline.Config) []Port {
	var out []Port
	if cfg.TrafficMode.Encapsulates() {
		out = append(out, Port{pipeline.TunnelPort, "tun0", string(cfg.TunnelType), "tunnel"})
	}
	out = append(out, Port{pipeline.GatewayPort, "gw0", "internal", "gateway"})
	if cfg.BridgingMode {
		// Internal ports stand in for the uplink NIC and the host
		// interface: OVS treats them alike for the flows.
		out = append(out, Port{pipeline.UplinkPort, "uplink", "internal", "uplink (enableBridgingMode)"},
			Port{pipeline.HostPort, "host0", "internal", "host interface (enableBridgingMode)"})
	}
	ports := make([]uint32, 0, len(nm.PortPod))
	for p := range nm.PortPod {
		ports = append(ports, p)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i] < ports[j] })
	for _, p := range ports {
		out = append(out, Port{p, fmt.Sprintf("p%d", p), "internal", "Pod " + nm.PortPod[p].Key()})
	}
	return out
}

// Script writes a POSIX shell script that builds nm's bridge on a running
// Open vSwitch. The environment can rename what it creates: BR (the
// bridge, default br-int), PORT_PREFIX (prepended to every interface name,
// default "antrea-"; keep names within 15 characters) and DATAPATH_TYPE
// (default netdev, the userspace datapath; "system" for the kernel one).
func Script(w io.Writer, nm *pipeline.NodeModel, cfg pipeline.Config) error {
	t := TablesOf(nm.Bridge)
	var groups, flows []string
	for _, g := range nm.Bridge.Groups() {
		s, err := t.GroupText(g)
		if err != nil {
			return err
		}
		groups = append(groups, s)
	}
	for _, f := range nm.Bridge.Flows() {
		s, err := t.FlowText(f)
		if err != nil {
			return err
		}
		flows = append(flows, s)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#!/bin/sh\n# Builds the modelled Antrea bridge of Node %s on a running Open vSwitch.\n", nm.Node.Name)
	b.WriteString("# Generated by `sluice traceflow pipeline --ovs-script`. Tables are numbered in\n# pipeline order:\n")
	for i, name := range nm.Bridge.Tables() {
		fmt.Fprintf(&b, "#   %2d %s\n", i, name)
	}
	b.WriteString(`set -eu
BR=${BR:-br-int}
P=${PORT_PREFIX-antrea-}
DATAPATH_TYPE=${DATAPATH_TYPE:-netdev}
# One transaction, so OVS reconfigures once. fail_mode=secure: no NORMAL
# flow of OVS's own, only the modelled ones.
ovs-vsctl --may-exist add-br "$BR" -- set bridge "$BR" datapath_type="$DATAPATH_TYPE" \
  fail_mode=secure protocols=OpenFlow10,OpenFlow13,OpenFlow15`)
	ports := Ports(nm, cfg)
	for _, p := range ports {
		opts := ""
		if p.Type == "geneve" || p.Type == "vxlan" {
			opts = " options:remote_ip=flow options:key=flow"
		}
		fmt.Fprintf(&b, " \\\n  -- --may-exist add-port \"$BR\" \"${P}%s\" -- set interface \"${P}%s\" type=%s%s ofport_request=%d",
			p.Name, p.Name, p.Type, opts, p.OFPort)
	}
	b.WriteString("\n# ovs-vsctl exits 0 when OVS cannot open a port (a second flow-based\n# tunnel on one UDP port, say): check every port's number.\n")
	for _, p := range ports {
		fmt.Fprintf(&b, "[ \"$(ovs-vsctl get interface \"${P}%s\" ofport)\" = %d ] || { echo \"${P}%s (%s) did not get OpenFlow port %d\" >&2; exit 1; }\n",
			p.Name, p.OFPort, p.Name, p.About, p.OFPort)
	}
	b.WriteString(`ovs-ofctl -O OpenFlow15 del-flows "$BR"
ovs-ofctl -O OpenFlow15 del-groups "$BR"
# The model installs no meters.
`)
	fmt.Fprintf(&b, "# %d groups\novs-ofctl -O OpenFlow15 add-groups \"$BR\" - <<'SLUICE_GROUPS'\n", len(groups))
	for _, g := range groups {
		b.WriteString(g + "\n")
	}
	fmt.Fprintf(&b, "SLUICE_GROUPS\n# %d flows\novs-ofctl -O OpenFlow15 add-flows \"$BR\" - <<'SLUICE_FLOWS'\n", len(flows))
	for _, f := range flows {
		b.WriteString(f + "\n")
	}
	b.WriteString("SLUICE_FLOWS\n")
	_, err := io.WriteString(w, b.String())
	return err
}
