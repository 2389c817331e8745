// Package kafkatest runs a Kafka cluster for tests: franz-go's kfake (the
// real wire protocol, in memory or on disk) in a process of its own
// (command kfakebroker), so that a test can kill it and start it again.
// No Apache Kafka can run where the tests run; docs/scale.md says so.
package kafkatest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options of a cluster.
type Options struct {
	Brokers    int      // default 3
	Partitions int      // of each topic; default 12
	Topics     []string // default ["flows"]
	// Persist keeps the cluster's records across Restart (a data
	// directory); without it a restarted cluster is empty.
	Persist bool
	// SASL is "user:password" to require SASL (PLAIN and SCRAM).
	SASL string
	// TLSCert and TLSKey serve TLS; with ClientCA, client certificates
	// signed by it are required.
	TLSCert, TLSKey, ClientCA string
}

// Cluster is a running kfake process.
type Cluster struct {
	tb    testing.TB
	o     Options
	data  string
	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.WriteCloser // held: the broker exits when it closes
	addrs []string
	ports []string
}

// build compiles kfakebroker once per test binary.
var build = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kfakebroker")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kfakebroker")
	out, err := exec.Command("go", "build", "-o", bin, "sluice/internal/kafkatest/kfakebroker").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build kfakebroker: %v\n%s", err, out)
	}
	return bin, nil
})

// Start starts a cluster; it is stopped when the test ends.
func Start(tb testing.TB, o Options) *Cluster {
	tb.Helper()
	if o.Brokers == 0 {
		o.Brokers = 3
	}
	if o.Partitions == 0 {
		o.Partitions = 12
	}
	if len(o.Topics) == 0 {
		o.Topics = []string{"flows"}
	}
	c := &Cluster{tb: tb, o: o}
	if o.Persist {
		c.data = tb.TempDir()
	}
	if err := c.start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// Addrs are the brokers' addresses (the same after Restart).
func (c *Cluster) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.addrs...)
}

func (c *Cluster) start() error {
	bin, err := build()
	if err != nil {
		return err
	}
	args := []string{"-brokers", fmt.Sprint(c.o.Brokers), "-partitions", fmt.Sprint(c.o.Partitions),
		"-topics", strings.Join(c.o.Topics, ",")}
	if c.ports != nil {
		args = append(args, "-ports", strings.Join(c.ports, ","))
	}
	if c.data != "" {
		args = append(args, "-data", c.data)
	}
	if c.o.SASL != "" {
		args = append(args, "-sasl", c.o.SASL)
	}
	if c.o.TLSCert != "" {
		args = append(args, "-tls", c.o.TLSCert+","+c.o.TLSKey)
		if c.o.ClientCA != "" {
			args = append(args, "-client-ca", c.o.ClientCA)
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	// Its standard input closes when this process dies: the broker
	// follows it rather than outlive a killed test.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kfakebroker: %w", err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "ADDRS ") {
				lines <- strings.TrimPrefix(l, "ADDRS ")
			}
		}
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if !ok {
			_ = cmd.Wait()
			return fmt.Errorf("kfakebroker %v exited before listening", args)
		}
		c.mu.Lock()
		c.cmd = cmd
		c.stdin = stdin
		c.addrs = strings.Split(l, ",")
		c.ports = nil
		for _, a := range c.addrs {
			_, p, _ := net.SplitHostPort(a)
			c.ports = append(c.ports, p)
		}
		c.mu.Unlock()
		return nil
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("kfakebroker did not listen within 60s")
	}
}

// Pid is the broker process's id, 0 when stopped.
func (c *Cluster) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Kill stops the cluster at once (SIGKILL), as a crash would.
func (c *Cluster) Kill() {
	c.mu.Lock()
	cmd := c.cmd
	c.cmd = nil
	c.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
}

// Stop stops the cluster gracefully (it writes its data directory).
func (c *Cluster) Stop() {
	c.mu.Lock()
	cmd := c.cmd
	c.cmd = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart starts a stopped cluster again on the same ports (with its
// records when Options.Persist). A port taken meanwhile fails the test.
func (c *Cluster) Restart(ctx context.Context) {
	c.tb.Helper()
	var err error
	for ctx.Err() == nil {
		if err = c.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond) // the old listeners may linger a moment
	}
	c.tb.Fatalf("restart kfake: %v", err)
}
