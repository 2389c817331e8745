package tracer

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"sluice/traceflow/datapath"

	"sluice/traceflow/corpus"
	"sluice/traceflow/crd"
	"sluice/traceflow/pipeline"
)

// TestFlexibleIPAMPorts: with enableBridgingMode an AntreaIPAM Pod's
// packet to another Node's PodCIDR leaves by the uplink (reported
// Delivered, nothing output, so the trace ends there), to a local Pod by
// that Pod's port, and elsewhere by the gateway; the same traces without
// the bridging mode take the gateway.
func TestFlexibleIPAMPorts(t *testing.T) {
	ctx := context.Background()
	model := func(bridging bool) *pipeline.Model {
		c := corpus.Case{Mode: string(pipeline.NoEncap), EnableBridgingMode: bridging, Overlays: []string{"flexible-ipam.yaml"}}
		m, err := c.Model(ctx, "../testdata")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	on, off := model(true), model(false)
	port := func(m *pipeline.Model, src, dst string) (uint32, crd.Action, int) {
		s, d, err := Endpoints(m.State, src, dst)
		if err != nil {
			t.Fatal(err)
		}
		tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d}}
		tf.Name = "t"
		tr, err := Run(ctx, m, tf, Options{Now: fixedNow})
		if err != nil {
			t.Fatal(err)
		}
		h := tr.Hops[0]
		if h.Result == nil || len(h.Result.PacketIns) == 0 {
			t.Fatalf("%s -> %s: no packet-in on %s", src, dst, h.Node)
		}
		obs := tr.Traceflow.Status.Results[0].Observations
		return h.Result.PacketIns[len(h.Result.PacketIns)-1].Meta.Regs[1], obs[len(obs)-1].Action, len(h.Result.Outputs)
	}
	front := on.Nodes["k8s-node-1"].PodPort["bridged/front"]
	for _, c := range []struct {
		m        *pipeline.Model
		src, dst string
		port     uint32
		action   crd.Action
		outputs  int
	}{
		{on, "bridged/front", "default/db", pipeline.UplinkPort, crd.ActionDelivered, 0},
		{on, "default/vlan-app", "default/db", pipeline.GatewayPort, crd.ActionForwarded, 1}, // VLAN 20: no uplink flow to PodCIDRs
		{on, "default/vlan-app", "bridged/front", front, crd.ActionDelivered, 0},
		{on, "bridged/front", "8.8.8.8", pipeline.GatewayPort, crd.ActionForwardedOutOfNetwork, 1},
		{off, "bridged/front", "default/db", pipeline.GatewayPort, crd.ActionForwarded, 1},
	} {
		p, a, n := port(c.m, c.src, c.dst)
		if p != c.port || a != c.action || n != c.outputs {
			t.Errorf("bridging %v, %s -> %s: port %d %s with %d outputs, want %d %s with %d", c.m.Config.BridgingMode, c.src, c.dst, p, a, n, c.port, c.action, c.outputs)
		}
	}
}

// TestFlexibleIPAMOwnNode: an untagged AntreaIPAM Pod's packet to its own
// Node's address is output to the host interface by a flow above the
// Traceflow flows, with no packet-in: the trace is refused as the
// reference's would time out. A VLAN Pod's, or one to another Node, is
// traced.
func TestFlexibleIPAMOwnNode(t *testing.T) {
	ctx := context.Background()
	m := bridgingModel(t)
	for _, r := range []struct {
		src, dst string
		refused  bool
	}{
		{"bridged/front", "192.168.77.101", true},
		{"default/vlan-app", "192.168.77.101", false},
		{"bridged/front", "192.168.77.102", false},
		{"default/client", "192.168.77.101", false},
	} {
		s, d, err := Endpoints(m.State, r.src, r.dst)
		if err != nil {
			t.Fatal(err)
		}
		tf := &crd.Traceflow{Spec: crd.TraceflowSpec{Source: s, Destination: d}}
		tf.Name = "t"
		_, err = Run(ctx, m, tf, Options{Now: fixedNow})
		var ue *UntraceableError
		if errors.As(err, &ue) != r.refused || (!r.refused && err != nil) {
			t.Errorf("%s -> %s: error %v, refused want %v", r.src, r.dst, err, r.refused)
		}
	}
	// The bridge itself: out of the host port, no packet-in.
	front := m.State.Pod("bridged", "front")
	nm := m.Nodes["k8s-node-1"]
	p := datapath.Packet{EthSrc: pipeline.PodMAC(front), EthDst: nm.GatewayMAC, Src: netip.MustParseAddr("192.168.77.201"),
		Dst: netip.MustParseAddr("192.168.77.101"), Proto: datapath.ProtoTCP, SrcPort: 1000, DstPort: 80, TCPFlags: 2,
		DSCP: m.Config.Tag, TTL: 64, Length: 40}
	frame, err := p.Serialize()
	if err != nil {
		t.Fatal(err)
	}
	res, err := nm.Bridge.Run(ctx, frame, datapath.Entry{InPort: nm.PodPort[front.Key()]}, datapath.NewConntrack())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.PacketIns) != 0 || len(res.Outputs) != 1 || res.Outputs[0].Port != pipeline.HostPort {
		t.Errorf("to its own Node: %d packet-ins, outputs %+v; want none and the host port", len(res.PacketIns), res.Outputs)
	}
}

// TestFlexibleIPAMVLANTag: what a VLAN Pod sends to the underlay (a MAC
// the bridge does not own: its pool's router) leaves by the uplink tagged
// with the pool's VLAN; an untagged pool's Pod's leaves untagged.
func TestFlexibleIPAMVLANTag(t *testing.T) {
	ctx := context.Background()
	m := bridgingModel(t)
	nm := m.Nodes["k8s-node-1"]
	router := datapath.MAC{0x02, 0xaa, 0, 0, 0, 1}
	for _, r := range []struct {
		pod  string
		ip   string
		vlan uint16
	}{{"default/vlan-app", "172.20.0.17", 20}, {"bridged/front", "192.168.77.201", 0}} {
		pod := m.State.PodByIP(netip.MustParseAddr(r.ip))
		p := datapath.Packet{EthSrc: pipeline.PodMAC(pod), EthDst: router, Src: netip.MustParseAddr(r.ip),
			Dst: netip.MustParseAddr("8.8.8.8"), Proto: datapath.ProtoUDP, SrcPort: 1000, DstPort: 53, TTL: 64}
		frame, err := p.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		res, err := nm.Bridge.Run(ctx, frame, datapath.Entry{InPort: nm.PodPort[pod.Key()]}, datapath.NewConntrack())
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Outputs) != 1 || res.Outputs[0].Port != pipeline.UplinkPort || res.Outputs[0].Packet.VLAN != r.vlan {
			t.Errorf("%s: outputs %+v, want the uplink with VLAN %d", r.pod, res.Outputs, r.vlan)
		}
	}
}

// TestFlexibleIPAMFromUplink: the underlay reaches an AntreaIPAM Pod
// through the uplink on its pool's VLAN, and the tag is gone when the
// Pod gets the packet; a frame on another VLAN is the host's.
func TestFlexibleIPAMFromUplink(t *testing.T) {
	ctx := context.Background()
	m := bridgingModel(t)
	nm := m.Nodes["k8s-node-1"]
	for _, r := range []struct {
		dst  string
		vlan uint16
		port uint32
	}{
		{"172.20.0.17", 20, nm.PodPort["default/vlan-app"]},
		{"192.168.77.201", 0, nm.PodPort["bridged/front"]},
		{"192.168.77.201", 20, pipeline.HostPort}, // not front's VLAN
	} {
		pod := m.State.PodByIP(netip.MustParseAddr(r.dst))
		p := datapath.Packet{EthSrc: datapath.MAC{0x02, 0xaa, 0, 0, 0, 1}, EthDst: pipeline.PodMAC(pod), Src: netip.MustParseAddr("203.0.113.9"),
			Dst: netip.MustParseAddr(r.dst), Proto: datapath.ProtoUDP, SrcPort: 53, DstPort: 1000, TTL: 64, VLAN: r.vlan}
		frame, err := p.Serialize()
		if err != nil {
			t.Fatal(err)
		}
		res, err := nm.Bridge.Run(ctx, frame, datapath.Entry{InPort: pipeline.UplinkPort}, datapath.NewConntrack())
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Outputs) != 1 || res.Outputs[0].Port != r.port || (r.port != pipeline.HostPort && res.Outputs[0].Packet.VLAN != 0) {
			t.Errorf("to %s on VLAN %d: outputs %+v, want port %d untagged", r.dst, r.vlan, res.Outputs, r.port)
		}
	}
}

// bridgingModel is the model of the fixture with its FlexibleIPAM overlay,
// in noEncap mode with the bridging mode on.
func bridgingModel(t *testing.T) *pipeline.Model {
	t.Helper()
	c := corpus.Case{Mode: string(pipeline.NoEncap), EnableBridgingMode: true, Overlays: []string{"flexible-ipam.yaml"}}
	m, err := c.Model(context.Background(), "../testdata")
	if err != nil {
		t.Fatal(err)
	}
	return m
}
