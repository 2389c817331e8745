// Package s3server runs a real S3-compatible server for tests: versitygw
// (built from its Go module by scripts/build-versitygw.sh) with its posix
// backend on a private directory, on a free loopback port, stopped when
// the test ends. Tests can stop and restart it to play an outage.
package s3server

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Version is the versitygw version the build script builds.
const Version = "v1.8.0"

// BinaryEnv names a versitygw binary to use instead of the cached build.
const BinaryEnv = "SLUICE_VERSITYGW"

// BinaryPath returns where scripts/build-versitygw.sh puts versitygw:
// $SLUICE_CACHE, else $XDG_CACHE_HOME/sluice, else ~/.cache/sluice, then
// versitygw-<version>/versitygw. $SLUICE_VERSITYGW wins.
func BinaryPath() string {
	if p := os.Getenv(BinaryEnv); p != "" {
		return p
	}
	return filepath.Join(cacheDir(), "versitygw-"+Version, "versitygw")
}

func cacheDir() string {
	if d := os.Getenv("SLUICE_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "sluice")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "sluice-cache")
	}
	return filepath.Join(home, ".cache", "sluice")
}

// Server is a running (or stopped) versitygw.
type Server struct {
	// Addr is host:port; URL is http://Addr.
	Addr, URL string
	// AccessKey and SecretKey are the root account's credentials.
	AccessKey, SecretKey string
	// Region is the region the server signs for.
	Region string

	bin, data, meta string
	tb              testing.TB

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	log  *lockedWriter
}

// Start builds nothing: it runs the cached binary, and fails the test
// (never skips it) when the binary is missing.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin := BinaryPath()
	if _, err := os.Stat(bin); err != nil {
		tb.Fatalf("versitygw: %v (run scripts/build-versitygw.sh, which `make deps` runs)", err)
	}
	dir := tb.TempDir()
	s := &Server{bin: bin, data: filepath.Join(dir, "data"), meta: filepath.Join(dir, "meta"), tb: tb,
		AccessKey: "sluice-test", SecretKey: rand.Text(), Region: "us-east-1"}
	for _, d := range []string{s.data, s.meta} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(s.Stop)
	var err error
	for try := 0; try < 5; try++ {
		var port int
		if port, err = freePort(); err != nil {
			continue
		}
		s.Addr = fmt.Sprintf("127.0.0.1:%d", port)
		s.URL = "http://" + s.Addr
		if err = s.start(); err == nil {
			return s
		}
	}
	tb.Fatalf("versitygw: %v", err)
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// start runs the server on s.Addr and waits until it answers HTTP.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(s.bin, "--port", s.Addr, "--region", s.Region, "--quiet",
		"posix", "--sidecar", s.meta, s.data)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	log := &lockedWriter{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(30 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-done:
			return fmt.Errorf("exited at start: %s", log.String())
		default:
		}
		resp, err := hc.Get(s.URL + "/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("not answering on %s after 30s: %v", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.cmd, s.done, s.log = cmd, done, log
	return nil
}

// Stop kills the server (a crash, as far as clients can tell) and waits
// for it to exit; the data stays for Restart.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Restart starts a stopped server again on the same address and data.
func (s *Server) Restart() {
	s.tb.Helper()
	if err := s.start(); err != nil {
		s.tb.Fatalf("versitygw restart: %v", err)
	}
}

// Client returns a client with the root credentials.
func (s *Server) Client() *minio.Client {
	s.tb.Helper()
	c, err := minio.New(s.Addr, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""),
		Region: s.Region})
	if err != nil {
		s.tb.Fatal(err)
	}
	return c
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(name string) {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client().MakeBucket(ctx, name, minio.MakeBucketOptions{}); err != nil {
		s.tb.Fatalf("make bucket %s: %v", name, err)
	}
}

// Object is a stored object.
type Object struct {
	Key  string
	Data []byte
}

// Objects lists the bucket's objects under prefix (recursively) and reads
// each, in key order.
func (s *Server) Objects(bucket, prefix string) []Object {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := s.Client()
	var out []Object
	for info := range c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if info.Err != nil {
			s.tb.Fatalf("list %s: %v", bucket, info.Err)
		}
		obj, err := c.GetObject(ctx, bucket, info.Key, minio.GetObjectOptions{})
		if err != nil {
			s.tb.Fatalf("get %s: %v", info.Key, err)
		}
		var b bytes.Buffer
		_, err = b.ReadFrom(obj)
		obj.Close()
		if err != nil {
			s.tb.Fatalf("read %s: %v", info.Key, err)
		}
		if int64(b.Len()) != info.Size {
			s.tb.Fatalf("%s: read %d octets, listed %d", info.Key, b.Len(), info.Size)
		}
		out = append(out, Object{Key: info.Key, Data: b.Bytes()})
	}
	return out
}

// Log is what the server printed since it last started.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return strings.TrimSpace(s.log.String())
}

// lockedWriter collects the output of both of the server's streams.
type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
