package aggregator_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sluice/certs"
	"sluice/flow"
	"sluice/flow/flowpb"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/internal/testkit/stubcollector"
	"sluice/internal/testkit/testagg"
	"sluice/ipfix"
)

// jsonLines is a TCP collector of the JSON sink's lines.
type jsonLines struct {
	ln    net.Listener
	mu    sync.Mutex
	lines []map[string]any
}

func newJSONLines(t *testing.T) *jsonLines {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	j := &jsonLines{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				sc.Buffer(nil, 1<<20)
				for sc.Scan() {
					var v struct {
						IPFIX map[string]any `json:"ipfix"`
					}
					if json.Unmarshal(sc.Bytes(), &v) == nil {
						j.mu.Lock()
						j.lines = append(j.lines, v.IPFIX)
						j.mu.Unlock()
					}
				}
			}()
		}
	}()
	return j
}

func (j *jsonLines) byPort() map[float64]map[string]any {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := map[float64]map[string]any{}
	for _, v := range j.lines {
		if p, ok := v["sourceTransportPort"].(float64); ok {
			out[p] = v
		}
	}
	return out
}

// TestIPv4MappedEverySink: records whose IPv6 elements hold IPv4-mapped
// addresses leave every sink, in both modes, with their addresses: all
// IPv4 (mapped or not) as IPv4, the IPv4 template for IPFIX and JSON;
// IPv4 beside IPv6 in the mapped form, never as zeros.
func TestIPv4MappedEverySink(t *testing.T) {
	for _, mode := range []string{"Proxy", "Aggregate"} {
		for _, format := range []string{"IPFIX", "JSON"} {
			t.Run(mode+"/"+format, func(t *testing.T) { testIPv4Mapped(t, mode, format) })
		}
	}
}

func testIPv4Mapped(t *testing.T, mode, format string) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "flows.log")
	var coll *stubcollector.Collector
	var jl *jsonLines
	var collAddr string
	if format == "IPFIX" {
		coll = stubcollector.New(t)
		collAddr = coll.Addr()
	} else {
		jl = newJSONLines(t)
		collAddr = jl.ln.Addr().String()
	}
	logger := "" // the flow log is Aggregate mode's
	if mode == "Aggregate" {
		logger = fmt.Sprintf("flowLogger: {enable: true, path: %q}", logPath)
	}
	a := testagg.Start(t, fmt.Sprintf(`
mode: %s
aggregatorTransportProtocol: tcp
activeFlowRecordTimeout: 1s
flowCollector: {enable: true, address: "%s:tcp", recordFormat: %s}
%s
flowStreamService: {enable: true}
sluice:
  ipfixAddress: "127.0.0.1:0"
  apiAddress: "127.0.0.1:0"
  flowStreamAddress: "127.0.0.1:0"
  tls: {certDir: %s}
`, mode, collAddr, format, logger, filepath.Join(dir, "certs")))
	bundle, err := certs.Ensure(filepath.Join(dir, "certs"), certs.Options{})
	if err != nil {
		t.Fatal(err)
	}

	// An Antrea IPv6 template; ipfixmap writes an IPv4 address in one of
	// its fields in the mapped form, which is what this test sends.
	tb, _ := ipfixmap.NewTable(ipfix.DefaultRegistry())
	names, _ := ipfixmap.AgentElements("v2.7", 6)
	els, _ := tb.Elements(names)
	tmpl, _ := ipfixmap.TemplateOf(256, els)
	conn, err := net.Dial("tcp", a.Addrs().IPFIX)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
	enc.AddTemplate(1, tmpl)
	ip := netip.MustParseAddr
	type sent struct {
		port     uint16
		src, dst netip.Addr
	}
	cases := []sent{
		{41001, ip("10.244.1.2"), ip("10.244.2.9")}, // both mapped on the wire
		{41002, ip("fd00::1"), ip("10.0.0.9")},      // IPv6 to mapped
	}
	for _, c := range cases {
		f := flow.Flow{
			StartTime: time.Now().Add(-10 * time.Second).Truncate(time.Second), EndTime: time.Now().Truncate(time.Second),
			SourceIP: c.src, DestinationIP: c.dst, SourcePort: c.port, DestinationPort: 443, Protocol: 6,
			FlowType: flow.FlowTypeIntraNode, DestinationClusterIP: ip("10.96.0.1"),
			Stats: flow.Stats{OctetTotalCount: 1000, PacketTotalCount: 10, OctetDeltaCount: 1000, PacketDeltaCount: 10},
		}
		if err := ipfixmap.WriteRecord(enc.Begin(1, tmpl), els, &f); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Flush(); err != nil {
		t.Fatal(err)
	}

	// The flow stream (gRPC): one version for both addresses.
	got := readStream(t, a.Addrs().FlowStream, bundle, &flowpb.GetFlowsRequest{}, 2)
	for _, g := range got {
		src, _ := netip.AddrFromSlice(g.GetIp().GetSource())
		dst, _ := netip.AddrFromSlice(g.GetIp().GetDestination())
		switch g.GetTransport().GetSourcePort() {
		case 41001:
			if src != ip("10.244.1.2") || dst != ip("10.244.2.9") || g.GetIp().GetVersion() != flowpb.IPVersion_IP_VERSION_4 {
				t.Errorf("flow stream: %v → %v version %v", src, dst, g.GetIp().GetVersion())
			}
		case 41002:
			if src != ip("fd00::1") || dst != ip("::ffff:10.0.0.9") || g.GetIp().GetVersion() != flowpb.IPVersion_IP_VERSION_6 {
				t.Errorf("flow stream: %v → %v version %v", src, dst, g.GetIp().GetVersion())
			}
		default:
			t.Errorf("flow stream: unexpected flow %v", g)
		}
	}

	// IPFIX or JSON out.
	if coll != nil {
		testkit.WaitFor(t, "2 records at the collector", func() bool { return coll.Len() >= 2 })
		for _, r := range coll.Records() {
			raw := r.ByName
			switch r.Flow.SourcePort {
			case 41001:
				if _, v6 := raw["sourceIPv6Address"]; v6 || string(raw["sourceIPv4Address"]) != string([]byte{10, 244, 1, 2}) ||
					string(raw["destinationIPv4Address"]) != string([]byte{10, 244, 2, 9}) ||
					string(raw["destinationClusterIPv4"]) != string([]byte{10, 96, 0, 1}) {
					t.Errorf("IPFIX: %x → %x (v6 %x), ClusterIP %x", raw["sourceIPv4Address"], raw["destinationIPv4Address"],
						raw["sourceIPv6Address"], raw["destinationClusterIPv4"])
				}
			case 41002:
				want := ip("::ffff:10.0.0.9").As16()
				wantC := ip("::ffff:10.96.0.1").As16()
				if string(raw["destinationIPv6Address"]) != string(want[:]) || string(raw["destinationClusterIPv6"]) != string(wantC[:]) {
					t.Errorf("IPFIX: destination %x, ClusterIP %x", raw["destinationIPv6Address"], raw["destinationClusterIPv6"])
				}
			}
		}
	} else {
		testkit.WaitFor(t, "2 JSON lines", func() bool { return len(jl.byPort()) >= 2 })
		m := jl.byPort()
		if v := m[41001]; v["sourceIPv4Address"] != "10.244.1.2" || v["destinationIPv4Address"] != "10.244.2.9" ||
			v["destinationClusterIPv4"] != "10.96.0.1" || v["sourceIPv6Address"] != nil {
			t.Errorf("JSON: %v", v)
		}
		if v := m[41002]; v["sourceIPv6Address"] != "fd00::1" || v["destinationIPv6Address"] != "::ffff:10.0.0.9" ||
			v["destinationClusterIPv6"] != "::ffff:10.96.0.1" {
			t.Errorf("JSON: %v", v)
		}
	}

	// The flow log: IPv4 as IPv4, whatever the wire said.
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	if mode != "Aggregate" {
		return
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	for _, want := range []string{"10.244.1.2,10.244.2.9,41001,443", "fd00::1,10.0.0.9,41002,443"} {
		if !strings.Contains(log, want) {
			t.Errorf("flow log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "::ffff:") || strings.Contains(log, "0.0.0.0") {
		t.Errorf("flow log has a mapped or zero address:\n%s", log)
	}
}
