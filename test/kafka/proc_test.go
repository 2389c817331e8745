// Package kafka holds the process-level tests of Aggregate mode on Kafka:
// sluice processes (an ingest tier in Proxy mode with the kafka sink, an
// Aggregate tier reading with sluice.kafkaInput) around a kfake cluster of
// 3 brokers run as a process of its own (no Apache Kafka can run here).
package kafka

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/flow"
	"sluice/flow/ipfixmap"
	"sluice/internal/testkit"
	"sluice/ipfix"
)

var sluiceBin string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "sluice-kafka-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		sluiceBin = filepath.Join(dir, "sluice")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", sluiceBin, "sluice/cmd/sluice").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build sluice: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// proc is a sluice process.
type proc struct {
	name             string
	cmd              *exec.Cmd
	mu               sync.Mutex
	raw              strings.Builder
	done             chan struct{}
	ipfix, api, grpc string
	// last is the last JSON log line whose msg is lastMsg, once seen.
	lastMsg string
	last    map[string]any
}

// startAgg runs `sluice aggregator` with the configuration yaml and waits
// until it serves.
func startAgg(t testing.TB, name, yaml string) *proc {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return startProc(t, name, "aggregator running", "", "aggregator", "--config", path)
}

// startProc runs sluice with args (and --log-format json), waits for the
// log line ready, and keeps the last line whose msg is lastMsg.
func startProc(t testing.TB, name, ready, lastMsg string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{}), lastMsg: lastMsg}
	p.cmd = exec.Command(sluiceBin, append(args, "--log-format", "json")...)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = p.cmd.Stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readyc := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.raw.WriteString(line + "\n")
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil {
				switch m["msg"] {
				case ready:
					select {
					case readyc <- m:
					default:
					}
				case p.lastMsg:
					p.mu.Lock()
					p.last = m
					p.mu.Unlock()
				}
			}
		}
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s log:\n%s", p.name, p.raw.String())
			p.mu.Unlock()
		}
	})
	select {
	case m := <-readyc:
		p.ipfix, _ = m["ipfix"].(string)
		p.api, _ = m["api"].(string)
		p.grpc, _ = m["grpc"].(string)
	case <-p.done:
		t.Fatalf("%s exited before serving", name)
	case <-time.After(testkit.WaitTimeout):
		t.Fatalf("%s did not start", name)
	}
	return p
}

// kill ends the process at once (kill -9).
func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// stop ends the process gracefully (SIGTERM) and waits for it.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not stop", p.name)
	}
}

// metric reads one series from the process's /metrics; -1 when absent,
// 0 when the process is gone.
func (p *proc) metric(t testing.TB, series string) float64 {
	t.Helper()
	select {
	case <-p.done:
		return 0
	default:
	}
	resp, err := http.Get("http://" + p.api + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// connection is one inter-Node connection of the workload: the source
// Node's half and the destination Node's.
type connection struct {
	srcNode, dstNode int
	src, dst         flow.Flow
}

// workload makes n inter-Node connections between 4 Nodes, connection i
// numbered from first.
func workload(first, n int) []connection {
	base := time.Now().Add(-20 * time.Second).Truncate(time.Second)
	var out []connection
	for i := first; i < first+n; i++ {
		a, b := i%4, (i/4+i+1)%4
		if a == b {
			b = (a + 1) % 4
		}
		f := flow.Flow{
			StartTime: base, EndTime: base.Add(10 * time.Second),
			SourceIP:      netip.AddrFrom4([4]byte{10, 244, byte(a), byte(2 + i%200)}),
			DestinationIP: netip.AddrFrom4([4]byte{10, 244, byte(b), byte(2 + (i/200)%200)}),
			SourcePort:    uint16(20000 + i), DestinationPort: uint16(80 + i%3), Protocol: 6, FlowType: flow.FlowTypeInterNode,
			Stats: flow.Stats{OctetTotalCount: uint64(1000 + i), PacketTotalCount: 10, OctetDeltaCount: uint64(1000 + i), PacketDeltaCount: 10},
		}
		c := connection{srcNode: a, dstNode: b, src: f, dst: f}
		c.src.SourcePodNamespace, c.src.SourcePodName, c.src.SourceNodeName = "ns", fmt.Sprintf("client-%d", i), fmt.Sprintf("node-%d", a)
		c.dst.DestinationPodNamespace, c.dst.DestinationPodName, c.dst.DestinationNodeName = "ns", fmt.Sprintf("server-%d", i), fmt.Sprintf("node-%d", b)
		c.dst.Stats.OctetTotalCount -= 10 // the destination saw a little less
		out = append(out, c)
	}
	return out
}

// agents sends each Node's halves of conns over IPFIX/TCP to addr(node):
// the 4 agents of the workload.
func agents(t testing.TB, conns []connection, addr func(node int) string) {
	t.Helper()
	tb, err := ipfixmap.NewTable(ipfix.DefaultRegistry())
	if err != nil {
		t.Fatal(err)
	}
	names, _ := ipfixmap.AgentElements("v2.7", 4)
	els, _ := tb.Elements(names)
	tmpl, _ := ipfixmap.TemplateOf(256, els)
	for node := range 4 {
		var halves []*flow.Flow
		for i := range conns {
			if conns[i].srcNode == node {
				halves = append(halves, &conns[i].src)
			}
			if conns[i].dstNode == node {
				halves = append(halves, &conns[i].dst)
			}
		}
		conn, err := net.Dial("tcp", addr(node))
		if err != nil {
			t.Fatal(err)
		}
		enc, _ := ipfix.NewEncoder(ipfix.EncoderOptions{}, func(m []byte) error { _, err := conn.Write(m); return err })
		domain := uint32(node + 1)
		enc.AddTemplate(domain, tmpl)
		for _, f := range halves {
			if err := ipfixmap.WriteRecord(enc.Begin(domain, tmpl), els, f); err != nil {
				t.Fatal(err)
			}
		}
		if err := enc.Flush(); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
}
