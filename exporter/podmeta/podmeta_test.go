package podmeta

import (
	"net/netip"
	"testing"
	"time"

	"sluice/enrich"
	"sluice/exporter/record"
	"sluice/exporter/source"
	"sluice/flow"
)

func TestDescribeAndFill(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	store := enrich.NewStatic([]enrich.Pod{
		{Namespace: "web", Name: "client", NodeName: "node-1", IPs: []netip.Addr{netip.MustParseAddr("10.10.1.2")}, Created: created},
		{Namespace: "web", Name: "local-server", NodeName: "node-1", IPs: []netip.Addr{netip.MustParseAddr("10.10.1.3")}, Created: created},
		{Namespace: "db", Name: "remote", NodeName: "node-2", IPs: []netip.Addr{netip.MustParseAddr("10.10.2.2")}, Created: created},
	}, nil, nil)
	r, err := New(Options{Node: "node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	at := created.Add(time.Hour)
	conn := func(src, dst string) *source.Conn {
		return &source.Conn{OrigSrc: netip.MustParseAddrPort(src), ReplySrc: netip.MustParseAddrPort(dst)}
	}
	cases := []struct {
		name, src, dst string
		keep           bool
		ft             uint8
		srcPod, dstPod string
	}{
		{"intra-node", "10.10.1.2:1000", "10.10.1.3:80", true, flow.FlowTypeIntraNode, "client", "local-server"},
		{"inter-node, remote Pod known to the store", "10.10.1.2:1000", "10.10.2.2:80", true, flow.FlowTypeInterNode, "client", ""},
		{"inter-node, remote in the cluster CIDR", "10.10.1.2:1000", "10.20.3.4:80", true, flow.FlowTypeInterNode, "client", ""},
		{"inter-node seen by the destination", "10.10.2.2:1000", "10.10.1.3:80", true, flow.FlowTypeInterNode, "", "local-server"},
		{"to external", "10.10.1.2:1000", "8.8.8.8:53", true, flow.FlowTypeToExternal, "client", ""},
		{"from external", "203.0.113.9:1000", "10.10.1.3:80", true, flow.FlowTypeFromExternal, "", "local-server"},
		{"local CIDR but unknown Pod", "10.10.1.77:1000", "8.8.8.8:53", true, flow.FlowTypeToExternal, "", ""},
		{"not this Node's", "10.10.2.2:1000", "8.8.8.8:53", false, 0, "", ""},
	}
	for _, c := range cases {
		cn := conn(c.src, c.dst)
		if got := r.Keep(cn); got != c.keep {
			t.Errorf("%s: Keep = %v", c.name, got)
		}
		if !c.keep {
			continue
		}
		m := r.Describe(cn, at)
		var rec record.Record
		r.Fill(&rec, &m)
		var f flow.Flow
		rec.Flow(&f)
		if f.FlowType != c.ft || f.SourcePodName != c.srcPod || f.DestinationPodName != c.dstPod {
			t.Errorf("%s: flowType %d, pods %q → %q; want %d, %q → %q", c.name, f.FlowType, f.SourcePodName, f.DestinationPodName, c.ft, c.srcPod, c.dstPod)
		}
		if (f.SourcePodName != "") != (f.SourceNodeName == "node-1") || (f.DestinationPodName != "") != (f.DestinationNodeName == "node-1") {
			t.Errorf("%s: node names %q %q must be set exactly for local Pods", c.name, f.SourceNodeName, f.DestinationNodeName)
		}
	}
	if _, err := New(Options{Node: "n"}); err == nil {
		t.Error("no Pod CIDR accepted")
	}
}

func TestServiceFields(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.20")
	store := enrich.NewStatic(nil, nil, []enrich.Service{{Namespace: "shop", Name: "cart", ClusterIPs: []netip.Addr{vip},
		Ports: []enrich.ServicePort{{Name: "http", Protocol: 6, Port: 80}, {Name: "dns", Protocol: 17, Port: 53}}}})
	r, err := New(Options{Node: "node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")}, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name          string
		proto         uint8
		origDst, endp string
		want          string
	}{
		{"through the Service port", 6, "10.96.0.20:80", "10.10.2.7:8080", "shop/cart:http"},
		{"UDP port of the Service", 17, "10.96.0.20:53", "10.10.2.8:5353", "shop/cart:dns"},
		{"a port the Service lacks", 6, "10.96.0.20:81", "10.10.2.7:8080", ""},
		{"no DNAT", 6, "10.10.2.7:8080", "10.10.2.7:8080", ""},
		{"DNAT to an unknown address", 6, "10.96.9.9:80", "10.10.2.7:8080", ""},
	}
	for _, c := range cases {
		cn := &source.Conn{Proto: c.proto, OrigSrc: netip.MustParseAddrPort("10.10.1.2:40000"),
			OrigDst: netip.MustParseAddrPort(c.origDst), ReplySrc: netip.MustParseAddrPort(c.endp)}
		m := r.Describe(cn, time.Now())
		var rec record.Record
		r.Fill(&rec, &m)
		var f flow.Flow
		rec.Flow(&f)
		if f.DestinationServicePortName != c.want || f.Present.Has(flow.DestinationServicePortName) != (c.want != "") {
			t.Errorf("%s: port name %q, want %q", c.name, f.DestinationServicePortName, c.want)
			continue
		}
		od := netip.MustParseAddrPort(c.origDst)
		if c.want != "" && (f.DestinationClusterIP != od.Addr() || f.DestinationServiceIP != od.Addr() || f.DestinationServicePort != od.Port()) {
			t.Errorf("%s: Service IP/port %v %v %d", c.name, f.DestinationClusterIP, f.DestinationServiceIP, f.DestinationServicePort)
		}
		if c.want == "" && (f.DestinationClusterIP.IsValid() || f.DestinationServicePort != 0) {
			t.Errorf("%s: Service fields set without a Service port", c.name)
		}
	}
}

// TestSNATAndSharing checks the proxySnat fields (the reply goes to
// another address than the client's: SNAT on this hop) and that
// connections without SNAT and with the same values share one
// record.Meta while a SNAT'ed one has its own.
func TestSNATAndSharing(t *testing.T) {
	r, err := New(Options{Node: "node-1", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24")}})
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	c := source.Conn{ID: 3, Proto: source.ProtoTCP, OrigSrc: ap("10.0.1.2:40000"), OrigDst: ap("10.0.2.3:8080"),
		ReplySrc: ap("10.0.2.3:8080"), ReplyDst: ap("10.0.1.2:40000")}
	other := c
	other.OrigSrc, other.ReplyDst = ap("10.0.1.2:40001"), ap("10.0.1.2:40001")
	snat := c
	snat.OrigSrc, snat.ReplyDst = ap("10.0.1.5:41000"), ap("192.168.0.1:61000")
	var flows [3]flow.Flow
	var metas [3]*record.Meta
	for i, cn := range []*source.Conn{&c, &other, &snat} {
		m := r.Describe(cn, time.Now())
		var rec record.Record
		r.Fill(&rec, &m)
		rec.Flow(&flows[i])
		metas[i] = rec.Meta
	}
	if flows[0].Present.Has(flow.ProxySnatIP) || flows[0].Present.Has(flow.ProxySnatPort) {
		t.Errorf("no SNAT happened but proxySnat is set: %v", flows[0].ProxySnatIP)
	}
	if f := flows[2]; f.ProxySnatIP != netip.MustParseAddr("192.168.0.1") || f.ProxySnatPort != 61000 ||
		!f.Present.Has(flow.ProxySnatIP) || !f.Present.Has(flow.ProxySnatPort) {
		t.Errorf("SNAT record %v:%d", f.ProxySnatIP, f.ProxySnatPort)
	}
	if metas[0] == nil || metas[0] != metas[1] || metas[2] == metas[0] {
		t.Errorf("metadata %p %p %p: want the first two shared, the SNAT'ed one its own", metas[0], metas[1], metas[2])
	}
}

// TestUnnamedAndRename: a local end the store cannot name is marked
// (not the gateway, nor anything without a store); Rename names it once
// the store knows the Pod, keeping the Service and SNAT values, shared as
// Describe would share them.
func TestUnnamedAndRename(t *testing.T) {
	vip := netip.MustParseAddr("10.96.0.20")
	svc := []enrich.Service{{Namespace: "shop", Name: "cart", ClusterIPs: []netip.Addr{vip},
		Ports: []enrich.ServicePort{{Name: "http", Protocol: 6, Port: 80}}}}
	client := enrich.Pod{Namespace: "shop", Name: "client", NodeName: "node-1", IPs: []netip.Addr{netip.MustParseAddr("10.10.1.2")}}
	server := enrich.Pod{Namespace: "shop", Name: "server", NodeName: "node-1", IPs: []netip.Addr{netip.MustParseAddr("10.10.1.3")}}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")}
	before, err := New(Options{Node: "node-1", PodCIDRs: cidrs, Store: enrich.NewStatic(nil, nil, svc)})
	if err != nil {
		t.Fatal(err)
	}
	after, err := New(Options{Node: "node-1", PodCIDRs: cidrs, Store: enrich.NewStatic([]enrich.Pod{client, server}, nil, svc)})
	if err != nil {
		t.Fatal(err)
	}
	none, err := New(Options{Node: "node-1", PodCIDRs: cidrs})
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort
	through := source.Conn{Proto: 6, OrigSrc: ap("10.10.1.2:40000"), OrigDst: ap("10.96.0.20:80"), ReplySrc: ap("10.10.1.3:8080"),
		ReplyDst: ap("10.10.1.2:40000")}
	snat := through
	snat.ReplyDst = ap("10.10.1.1:61000")
	gateway := source.Conn{Proto: 6, OrigSrc: ap("10.10.1.1:40000"), OrigDst: ap("10.10.2.3:80"), ReplySrc: ap("10.10.2.3:80")}
	now := time.Now()

	for _, c := range []struct {
		name   string
		r      *Resolver
		cn     *source.Conn
		wanted uint8
	}{
		{"both ends unknown", before, &through, UnnamedSrc | UnnamedDst},
		{"both known", after, &through, 0},
		{"the gateway", before, &gateway, 0},
		{"no store", none, &through, 0},
	} {
		if m := c.r.Describe(c.cn, now); m.Unnamed != c.wanted {
			t.Errorf("%s: Unnamed %b, want %b", c.name, m.Unnamed, c.wanted)
		}
	}

	for _, cn := range []*source.Conn{&through, &snat} {
		m := before.Describe(cn, now)
		src, dst := cn.OrigSrc.Addr(), cn.ReplySrc.Addr()
		if rec, u := before.Rename(m.Rec, m.Unnamed, src, dst, now); rec != m.Rec || u != m.Unnamed {
			t.Fatalf("renamed by a store that does not know the Pods")
		}
		// Named by the Resolver whose store knows the Pods.
		rec, u := after.Rename(m.Rec, m.Unnamed, src, dst, now)
		if u != 0 || rec == m.Rec || rec.SrcPod == nil || rec.SrcPod.Name != "client" || rec.DstPod == nil || rec.DstPod.Name != "server" {
			t.Fatalf("renamed %+v, still unnamed %b", rec, u)
		}
		if m.Rec.SrcPod != nil || m.Rec.DstPod != nil {
			t.Errorf("the old Meta was changed")
		}
		if rec.ServicePortName != "shop/cart:http" || rec.ServiceIP != vip || rec.SnatIP != m.Rec.SnatIP || rec.SnatPort != m.Rec.SnatPort ||
			rec.Node != "node-1" {
			t.Errorf("Service or SNAT values lost: %+v, was %+v", rec, m.Rec)
		}
		// Shared with what after's Describe makes, unless SNAT'ed.
		fresh := after.Describe(cn, now)
		if shared := fresh.Rec == rec; shared != !rec.SnatIP.IsValid() {
			t.Errorf("SNAT %v: renamed Meta shared with Describe's: %v", rec.SnatIP, shared)
		}
	}
}
