// Package ovscheck runs the modelled pipeline in a real Open vSwitch: it
// starts a private ovsdb-server and ovs-vswitchd (userspace datapath, no
// kernel module), loads a Node's bridge from the script package ovs
// writes, traces packets with ofproto/trace and sends them with
// packet-out, and compares what OVS did with what the model did.
package ovscheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Server is a running Open vSwitch whose files all live in Dir.
type Server struct {
	Dir string
	env []string
	db  *exec.Cmd
	vs  *exec.Cmd
}

// Programs lists what Start needs on PATH.
var Programs = []string{"ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "ovs-appctl"}

// schemaPaths are where Debian (and a source install) put the schema.
var schemaPaths = []string{"/usr/share/openvswitch/vswitch.ovsschema", "/usr/local/share/openvswitch/vswitch.ovsschema"}

// Start runs ovsdb-server and ovs-vswitchd as children of this process,
// with a fresh database and run directory under a new temporary
// directory. Close stops them and removes the directory.
func Start(ctx context.Context) (_ *Server, err error) {
	// Unix socket paths are short: a temporary directory of our own, not
	// a test's (long) TempDir.
	dir, err := os.MkdirTemp("", "ovs")
	if err != nil {
		return nil, fmt.Errorf("ovscheck: %w", err)
	}
	s := &Server{Dir: dir}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.env = append(os.Environ(), "OVS_RUNDIR="+dir, "OVS_DBDIR="+dir, "OVS_LOGDIR="+dir, "OVS_SYSCONFDIR="+dir)
	var schema string
	for _, p := range schemaPaths {
		if _, err := os.Stat(p); err == nil {
			schema = p
			break
		}
	}
	if schema == "" {
		return nil, fmt.Errorf("ovscheck: no vswitch.ovsschema in %v", schemaPaths)
	}
	db := filepath.Join(dir, "conf.db")
	if _, err := s.Run(ctx, "", "ovsdb-tool", "create", db, schema); err != nil {
		return nil, err
	}
	sock := "unix:" + filepath.Join(dir, "db.sock")
	s.db = s.daemon("ovsdb-server", db, "--remote=p"+sock, "--pidfile", "--unixctl="+filepath.Join(dir, "ovsdb-server.ctl"),
		"--log-file="+filepath.Join(dir, "ovsdb-server.log"))
	if err := s.db.Start(); err != nil {
		return nil, fmt.Errorf("ovscheck: ovsdb-server: %w", err)
	}
	if err := s.until(ctx, "ovsdb-server to accept connections", "ovs-vsctl", "--no-wait", "init"); err != nil {
		return nil, err
	}
	if err := waitForNoUserspaceDatapath(ctx); err != nil {
		return nil, err
	}
	s.vs = s.daemon("ovs-vswitchd", sock, "--pidfile", "--unixctl="+s.ctl(), "--log-file="+filepath.Join(dir, "ovs-vswitchd.log"))
	if err := s.vs.Start(); err != nil {
		return nil, fmt.Errorf("ovscheck: ovs-vswitchd: %w", err)
	}
	if err := s.until(ctx, "ovs-vswitchd to answer", "ovs-appctl", "-t", s.ctl(), "version"); err != nil {
		return nil, err
	}
	return s, nil
}

// netdevTap is the host interface every userspace datapath creates under
// one fixed name, so two ovs-vswitchd with bridges of type netdev cannot
// share a host: Start waits for another one (another test, a developer's
// own) to finish.
const netdevTap = "/sys/class/net/ovs-netdev"

func waitForNoUserspaceDatapath(ctx context.Context) error {
	for {
		if _, err := os.Stat(netdevTap); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ovscheck: another Open vSwitch userspace datapath runs on this host (%s exists): %w", netdevTap, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Server) ctl() string { return filepath.Join(s.Dir, "ovs-vswitchd.ctl") }

func (s *Server) daemon(name string, args ...string) *exec.Cmd {
	c := exec.Command(name, args...)
	c.Env, c.Dir = s.env, s.Dir
	// Its own process group, so Close can end it and nothing it forks.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c
}

// until retries a command until it succeeds or ctx ends.
func (s *Server) until(ctx context.Context, what string, name string, args ...string) error {
	for {
		_, err := s.Run(ctx, "", name, args...)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ovscheck: waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Run runs an OVS tool against this server, with stdin, and returns its
// standard output.
func (s *Server) Run(ctx context.Context, stdin, name string, args ...string) (string, error) {
	c := exec.CommandContext(ctx, name, args...)
	c.Env, c.Dir = s.env, s.Dir
	c.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.String(), fmt.Errorf("ovscheck: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Appctl runs ovs-appctl against this server's ovs-vswitchd.
func (s *Server) Appctl(ctx context.Context, args ...string) (string, error) {
	return s.Run(ctx, "", "ovs-appctl", append([]string{"-t", s.ctl()}, args...)...)
}

// Close stops both daemons (asking first, then killing) and removes Dir.
func (s *Server) Close() error {
	var errs []error
	stop := func(c *exec.Cmd, exit ...string) {
		if c == nil || c.Process == nil {
			return
		}
		done := make(chan error, 1)
		go func() { done <- c.Wait() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// --cleanup makes ovs-vswitchd remove its datapath and ports.
		_, _ = s.Run(ctx, "", "ovs-appctl", exit...)
		select {
		case <-done:
		case <-ctx.Done():
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			if err := <-done; err != nil {
				errs = append(errs, fmt.Errorf("ovscheck: %s killed: %w", c.Path, err))
			}
		}
	}
	stop(s.vs, "-t", s.ctl(), "exit", "--cleanup")
	stop(s.db, "-t", filepath.Join(s.Dir, "ovsdb-server.ctl"), "exit")
	errs = append(errs, os.RemoveAll(s.Dir))
	return errors.Join(errs...)
}
