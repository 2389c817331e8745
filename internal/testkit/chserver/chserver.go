// Package chserver runs a real clickhouse-server (Debian's package) for a
// test: its own configuration, data directory and free loopback ports,
// killed and restarted at will, stopped when the test ends.
package chserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"sluice/certs"
)

// Binary is the server program.
const Binary = "clickhouse-server"

// startTimeout bounds a start, generous for a loaded machine.
const startTimeout = 90 * time.Second

// Options shape the server.
type Options struct {
	// Users are extra users, name to password; "default" has no password.
	Users map[string]string
	// TLS adds the secure native port with a certificate from a CA
	// generated in the test (CAFile).
	TLS bool
	// Host is the address the server listens on and accepts users from
	// (any client address when it is not loopback); 127.0.0.1 if empty.
	// The real-cluster tests use the Node's bridge address, which Pods
	// reach.
	Host string
}

// Server is a running clickhouse-server.
type Server struct {
	tb  testing.TB
	dir string
	// Addr is the native port's host:port; SecureAddr the secure native
	// port's, when Options.TLS.
	Addr, SecureAddr string
	// CAFile is the CA of the server's certificate, when Options.TLS.
	CAFile string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs a server; the test fails when the program is missing.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	bin, err := exec.LookPath(Binary)
	if err != nil {
		tb.Fatalf("%s not found (%v): the ClickHouse tests need Debian's clickhouse-server; "+
			"`apt-get install clickhouse-server clickhouse-client` (scripts/install-deps.sh, run by `make test`, does it)", Binary, err)
	}
	dir := tb.TempDir()
	host, nets := o.Host, "127.0.0.1"
	if host == "" {
		host = "127.0.0.1"
	} else if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		nets = "::/0"
	}
	s := &Server{tb: tb, dir: dir, Addr: freeAddr(tb, host)}
	var tlsConf string
	if o.TLS {
		s.SecureAddr = freeAddr(tb, host)
		cd := filepath.Join(dir, "certs")
		if _, err := certs.Ensure(cd, certs.Options{}); err != nil {
			tb.Fatal(err)
		}
		s.CAFile = filepath.Join(cd, certs.CACertFile)
		tlsConf = fmt.Sprintf(`
  <tcp_port_secure>%s</tcp_port_secure>
  <openSSL><server>
    <certificateFile>%s</certificateFile><privateKeyFile>%s</privateKeyFile>
    <verificationMode>none</verificationMode><loadDefaultCAFile>false</loadDefaultCAFile>
    <cacheSessions>true</cacheSessions><disableProtocols>sslv2,sslv3</disableProtocols>
    <preferServerCiphers>true</preferServerCiphers>
  </server></openSSL>`, port(s.SecureAddr), filepath.Join(cd, certs.ServerCertFile), filepath.Join(cd, certs.ServerKeyFile))
	}
	data := filepath.Join(dir, "data") + "/"
	conf := fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
  <logger><level>information</level><log>%[1]s/server.log</log><errorlog>%[1]s/server.err.log</errorlog><size>50M</size><count>1</count></logger>
  <listen_host>%[5]s</listen_host>
  <tcp_port>%[2]s</tcp_port>%[3]s
  <path>%[4]s</path>
  <tmp_path>%[4]stmp/</tmp_path>
  <user_files_path>%[4]suser_files/</user_files_path>
  <format_schema_path>%[4]sformat_schemas/</format_schema_path>
  <mark_cache_size>53687091</mark_cache_size>
  <users_config>%[1]s/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <timezone>UTC</timezone>
</yandex>
`, dir, port(s.Addr), tlsConf, data, host)
	var users strings.Builder
	users.WriteString(`<?xml version="1.0"?>
<yandex>
  <profiles><default></default></profiles>
  <quotas><default></default></quotas>
  <users>
    <default><password></password><networks><ip>` + nets + `</ip></networks><profile>default</profile><quota>default</quota></default>
`)
	for name, pw := range o.Users {
		fmt.Fprintf(&users, "    <%[1]s><password>%[2]s</password><networks><ip>%[3]s</ip></networks><profile>default</profile><quota>default</quota></%[1]s>\n", name, pw, nets)
	}
	users.WriteString("  </users>\n</yandex>\n")
	for name, text := range map[string]string{"config.xml": conf, "users.xml": users.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	s.start(bin)
	tb.Cleanup(func() {
		s.Kill()
		if tb.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "server.err.log"))
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			tb.Logf("clickhouse-server error log (end):\n%s", b)
		}
	})
	return s
}

func (s *Server) start(bin string) {
	s.tb.Helper()
	cmd := exec.Command(bin, "--config-file="+filepath.Join(s.dir, "config.xml"))
	cmd.Dir = s.dir
	out, err := os.Create(filepath.Join(s.dir, "stdout.log"))
	if err != nil {
		s.tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		s.tb.Fatalf("starting %s: %v", bin, err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		out.Close()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-done:
			b, _ := os.ReadFile(filepath.Join(s.dir, "server.err.log"))
			s.tb.Fatalf("clickhouse-server exited at start: %s", lastLines(string(b), 20))
		default:
		}
		if err := s.ping(); err == nil {
			return
		} else if time.Now().After(deadline) {
			s.tb.Fatalf("clickhouse-server not ready after %s: %v", startTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *Server) ping() error {
	c, err := ch.Open(&ch.Options{Addr: []string{s.Addr}, DialTimeout: time.Second})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx)
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// Restart starts the killed server again on the same ports and data.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Kill()
	bin, _ := exec.LookPath(Binary)
	s.start(bin)
}

// CPUTime is the server process's CPU time so far (user and system).
func (s *Server) CPUTime() time.Duration {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which ends with ")"): utime is the
	// 12th, stime the 13th, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	var u, st int64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &st)
	return time.Duration(u+st) * 10 * time.Millisecond
}

// Conn is a connection as the default user, closed when the test ends.
func (s *Server) Conn() driver.Conn {
	c, err := ch.Open(&ch.Options{Addr: []string{s.Addr}, DialTimeout: 5 * time.Second})
	if err != nil {
		s.tb.Fatal(err)
	}
	s.tb.Cleanup(func() { c.Close() })
	return c
}

// Count returns the number of rows of a table, or -1 when it cannot be
// read (the server away).
func (s *Server) Count(c driver.Conn, table string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n uint64
	if err := c.QueryRow(ctx, "SELECT count() FROM "+table).Scan(&n); err != nil {
		return -1
	}
	return int64(n)
}

func freeAddr(tb testing.TB, host string) string {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
