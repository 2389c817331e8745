package testkit

import (
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
)

// Port is a loopback TCP port held for one test: a socket bound to it that
// does not listen, so connections to it are refused, and no other socket
// (the code under test asking for "127.0.0.1:0", say) can take it meanwhile.
// Closing a listener to get a "down" address is not enough: the kernel hands
// the freed port to the next bind, and a sink pointed at a dead collector
// then talks to the process's own listener.
type Port struct {
	Addr string // host:port

	mu sync.Mutex
	fd int // -1 once Listen took the socket
}

// ReservePort binds a port on 127.0.0.1 and holds it until the test ends
// or Listen is called.
func ReservePort(tb testing.TB) *Port {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("reserve a port: %v", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		tb.Fatalf("reserve a port: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		tb.Fatalf("reserve a port: %v", err)
	}
	in, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		syscall.Close(fd)
		tb.Fatalf("reserve a port: socket name %T", sa)
	}
	p := &Port{Addr: fmt.Sprintf("127.0.0.1:%d", in.Port), fd: fd}
	tb.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.fd >= 0 {
			syscall.Close(p.fd)
			p.fd = -1
		}
	})
	return p
}

// RefusedAddr returns a loopback address that refuses every connection
// until the test ends.
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	return ReservePort(tb).Addr
}

// Listen starts listening on the held socket itself, so that the port goes
// from refusing to accepting without a moment in which another socket
// could take it. It can be called once.
func (p *Port) Listen() (net.Listener, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fd < 0 {
		return nil, fmt.Errorf("port %s: already listening or released", p.Addr)
	}
	if err := syscall.Listen(p.fd, syscall.SOMAXCONN); err != nil {
		return nil, fmt.Errorf("port %s: listen: %w", p.Addr, err)
	}
	f := os.NewFile(uintptr(p.fd), "reserved "+p.Addr)
	p.fd = -1
	defer f.Close() // FileListener holds its own copy of the descriptor
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("port %s: %w", p.Addr, err)
	}
	return ln, nil
}
