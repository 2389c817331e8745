package interop_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"sluice/internal/testkit"
)

// requirePeersEnv makes a missing peer binary a failure instead of a skip.
const requirePeersEnv = "SLUICE_REQUIRE_PEERS"

// requirePeer returns the path of the peer program name. If it is not
// installed the test is skipped, or fails when SLUICE_REQUIRE_PEERS=1.
func requirePeer(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv(requirePeersEnv) == "1" {
		t.Fatalf("peer %s is required (%s=1) but not found: %v", name, requirePeersEnv, err)
	}
	t.Skipf("peer %s not installed (%v); set %s=1 to make this a failure", name, err, requirePeersEnv)
	return ""
}

// testContext returns a context that ends at the given timeout or shortly
// before the test binary's own deadline, whichever comes first.
func testContext(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	deadline := time.Now().Add(timeout)
	if tt, ok := t.(*testing.T); ok {
		if d, ok := tt.Deadline(); ok && d.Add(-time.Second).Before(deadline) {
			deadline = d.Add(-time.Second)
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// process is a peer running in the background.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *testkit.LogBuffer // stdout and stderr, interleaved
	done chan struct{}
	err  error // valid once done is closed
}

// startProcess starts a peer in the background. It is killed when ctx
// ends or the test finishes, whichever is first; its output is logged if
// the test fails.
func startProcess(t testing.TB, ctx context.Context, env []string, path string, args ...string) *process {
	t.Helper()
	p := &process{name: path, out: &testkit.LogBuffer{}, done: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, path, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.WaitDelay = 2 * time.Second
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	go func() {
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
			t.Logf("%s %s exited (%v); output:\n%s", path, strings.Join(args, " "), p.err, p.out.String())
		}
	})
	return p
}

// wait waits for the process to exit on its own.
func (p *process) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("%s did not exit: %w", p.name, ctx.Err())
	}
}

// exited reports whether the process has exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *process) stop(ctx context.Context) error {
	if p.exited() {
		return fmt.Errorf("%s exited early: %v", p.name, p.err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	return p.wait(ctx)
}

// run runs a peer to completion and returns its standard output; standard
// error is included in the error on failure.
func run(ctx context.Context, env []string, path string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 2 * time.Second
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\nstdout:\n%s\nstderr:\n%s",
			path, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// poll calls cond every 10 ms until it returns true or ctx ends.
func poll(ctx context.Context, what string, cond func() bool) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// freeUDPPort returns a UDP port on 127.0.0.1 that was free a moment ago,
// for a peer that must bind it itself.
func freeUDPPort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// udpSocketState finds the socket bound to 127.0.0.1:port in
// /proc/net/udp and returns its receive queue length. found is false if
// no such socket exists (yet).
func udpSocketState(port int) (rxQueue int, found bool, err error) {
	b, err := os.ReadFile("/proc/net/udp")
	if err != nil {
		return 0, false, err
	}
	local := fmt.Sprintf("0100007F:%04X", port)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != local {
			continue
		}
		// f[4] is tx_queue:rx_queue in hex.
		_, rx, ok := strings.Cut(f[4], ":")
		if !ok {
			return 0, false, errors.New("cannot parse /proc/net/udp queue column " + f[4])
		}
		var n int
		if _, err := fmt.Sscanf(rx, "%x", &n); err != nil {
			return 0, false, err
		}
		return n, true, nil
	}
	return 0, false, nil
}
