package fault

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sluice/internal/testkit"
)

// sluiceBin is the sluice binary built once for the package's tests.
var sluiceBin string

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "sluice-fault-")
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

// proc is a sluice process whose JSON log lines the test reads.
type proc struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	log  []map[string]any
	raw  strings.Builder
	done chan struct{}
	err  error
}

// start runs sluice with args (and --log-format json); the process is
// killed when the test ends if it still runs, and its log shown if the
// test failed.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(sluiceBin, append(args, "--log-format", "json")...)
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = p.cmd.Stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var m map[string]any
			_ = json.Unmarshal([]byte(line), &m)
			p.mu.Lock()
			p.raw.WriteString(line + "\n")
			if m != nil {
				p.log = append(p.log, m)
			}
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", p.name, p.logText())
		}
	})
	return p
}

func (p *proc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// line returns the last log line whose msg is msg (and whose fields
// include match), or nil.
func (p *proc) line(msg string, match map[string]any) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.log) - 1; i >= 0; i-- {
		l := p.log[i]
		if l["msg"] != msg {
			continue
		}
		ok := true
		for k, v := range match {
			if l[k] != v {
				ok = false
			}
		}
		if ok {
			return l
		}
	}
	return nil
}

// waitLine waits for a log line.
func (p *proc) waitLine(t *testing.T, msg string, match map[string]any) map[string]any {
	t.Helper()
	var l map[string]any
	testkit.WaitFor(t, fmt.Sprintf("%s to log %q", p.name, msg), func() bool {
		l = p.line(msg, match)
		return l != nil
	})
	return l
}

// signal sends sig and, for SIGTERM, waits for the process to end.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not end within 60 s of %v", p.name, sig)
	}
}

// num reads a numeric field of a JSON log line.
func num(t *testing.T, l map[string]any, key string) int {
	t.Helper()
	v, ok := l[key].(float64)
	if !ok {
		t.Fatalf("log line %v has no number %q", l, key)
	}
	return int(v)
}

// freeAddr returns a loopback address with a port free at the time of the
// call (for a process that must come back on the same address).
func freeAddr(t *testing.T, network string) string {
	t.Helper()
	if network == "udp" {
		// Outside the ephemeral range: an exporter re-dialling a dead
		// aggregator over UDP gets an ephemeral local port, which could
		// be this one once the aggregator is gone.
		for range 100 {
			addr := fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000))
			c, err := net.ListenPacket("udp", addr)
			if err != nil {
				continue
			}
			c.Close()
			return addr
		}
		t.Fatal("no free UDP port")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
